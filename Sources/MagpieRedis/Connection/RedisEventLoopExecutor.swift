import NIOCore

/// A task executor that runs a task's jobs on a NIO event loop: the lowest-latency way to call a
/// connection that lives on that loop.
///
/// A caller on Swift's global executor pays two thread hops per round trip: its command is handed to the
/// connection's event loop, and the reply's continuation is handed back to a pool thread. A task that
/// prefers the connection's event loop (`withTaskExecutorPreference`, or a task group's
/// `addTask(executorPreference:)`) writes its command directly and is resumed on the thread that read the
/// reply: no hop at all.
///
/// ```swift
/// let connection = try await redis.connection()
/// let executor = RedisEventLoopExecutor(connection.eventLoop)
/// await withTaskExecutorPreference(executor) {
///     let value = try await redis.get("user:42")
/// }
/// ```
///
/// The price: everything the task does between calls runs on the I/O thread and delays every other
/// connection on that loop. Use it for callers that do little besides talking to Redis.
public final class RedisEventLoopExecutor: TaskExecutor, Sendable {
    /// The loop the jobs run on.
    public let eventLoop: any EventLoop

    /// An executor running jobs on `eventLoop`.
    public init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
