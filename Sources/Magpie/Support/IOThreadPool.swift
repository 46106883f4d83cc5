import Foundation

/// A small pool of dedicated threads for disk I/O, so that async callers never block a thread of
/// Swift's cooperative pool on `pread`, `pwrite` or `fsync`.
///
/// Jobs run in submission order on `threadCount` threads. A job whose caller's task is cancelled
/// before a thread picks it up is dropped and its caller resumes with `CancellationError`; a job
/// already running finishes (a system call cannot be interrupted halfway) and its result is delivered.
final class IOThreadPool: Sendable {
    private struct State {
        var jobs: [@Sendable () -> Void] = []
        var head = 0
        var stopping = false
        var started = false
    }

    private let condition = NSCondition()
    private let state: Locked<State>
    let threadCount: Int

    private let name: String

    /// A pool of `threadCount` threads named `<name>-<number>`, started on the first submission (a cache
    /// used only synchronously never starts them).
    init(threadCount: Int, name: String) {
        self.threadCount = max(1, threadCount)
        self.name = name
        state = Locked(State())
    }

    private func startThreads() {
        for number in 0..<threadCount {
            let threadName = "\(name)-\(number)"
            let thread = Thread { [self] in
                Thread.current.threadDictionary[Self.nameKey] = threadName
                self.work()
            }
            thread.start()
        }
    }

    private static let nameKey = "magpie.io-thread"

    /// Names the current thread as one of the cache's own I/O threads (the disk tier's loader thread).
    static func nameCurrentThread(_ name: String) {
        Thread.current.threadDictionary[nameKey] = name
    }

    /// The name of the pool thread this code runs on (`<name>-<number>`), nil on any other thread.
    static var currentThreadName: String? {
        Thread.current.threadDictionary[nameKey] as? String
    }

    /// Queues `job`; false once the pool is shutting down.
    func submit(_ job: @escaping @Sendable () -> Void) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        let (accepted, start) = state.withLock { state -> (Bool, Bool) in
            guard !state.stopping else { return (false, false) }
            state.jobs.append(job)
            defer { state.started = true }
            return (true, !state.started)
        }
        if start { startThreads() }
        if accepted { condition.signal() }
        return accepted
    }

    /// Lets the queued jobs finish, then stops the threads. Later submissions are refused.
    func shutdown() {
        condition.lock()
        state.withLock { $0.stopping = true }
        condition.broadcast()
        condition.unlock()
    }

    private func work() {
        while true {
            condition.lock()
            var job: (@Sendable () -> Void)? = nil
            var stop = false
            while job == nil && !stop {
                (job, stop) = state.withLock { state -> ((@Sendable () -> Void)?, Bool) in
                    if state.head < state.jobs.count {
                        let job = state.jobs[state.head]
                        state.head += 1
                        if state.head == state.jobs.count {
                            state.jobs.removeAll(keepingCapacity: true)
                            state.head = 0
                        } else if state.head >= 1024 && state.head * 2 >= state.jobs.count {
                            state.jobs.removeFirst(state.head)
                            state.head = 0
                        }
                        return (job, false)
                    }
                    return (nil, state.stopping)
                }
                if job == nil && !stop { condition.wait() }
            }
            condition.unlock()
            guard let job else { return }
            job()
        }
    }

    /// Runs `work` on a pool thread and returns its result.
    /// - Throws: `CancellationError` if the task is cancelled before a thread starts the work;
    ///   ``MagpieError/Code/closed`` if the pool is shut down; else what `work` throws.
    func run<R: Sendable>(_ work: @escaping @Sendable () throws(MagpieError) -> R) async throws -> R {
        try Task.checkCancellation()
        let job = PendingJob<R>()
        defer { ThreadSanitizerHandOff.received() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<R, any Error>) in
                guard job.attach(continuation) else { return }
                let accepted = submit {
                    guard let continuation = job.start() else { return }
                    let result = Result { () throws(MagpieError) -> R in try work() }.mapError { $0 as any Error }
                    ThreadSanitizerHandOff.published()
                    continuation.resume(with: result)
                }
                if !accepted, let continuation = job.start() {
                    continuation.resume(throwing: MagpieError(.closed, "the cache is closed"))
                }
            }
        } onCancel: {
            job.cancel()
        }
    }
}

/// The hand-over between an async caller, its cancellation handler and the pool thread: whoever moves
/// the job out of `waiting` first resumes the continuation, exactly once.
private final class PendingJob<R: Sendable>: Sendable {
    private enum Phase {
        case new
        case waiting(CheckedContinuation<R, any Error>)
        case cancelled
        case started
    }

    private let phase = Locked(Phase.new)

    /// Stores the continuation; false (and it is resumed with `CancellationError`) if already cancelled.
    func attach(_ continuation: CheckedContinuation<R, any Error>) -> Bool {
        let attached = phase.withLock { phase -> Bool in
            guard case .new = phase else { return false }
            phase = .waiting(continuation)
            return true
        }
        if !attached { continuation.resume(throwing: CancellationError()) }
        return attached
    }

    /// Takes the continuation to run the job; nil if the caller was cancelled first.
    func start() -> CheckedContinuation<R, any Error>? {
        phase.withLock { phase in
            guard case .waiting(let continuation) = phase else { return nil }
            phase = .started
            return continuation
        }
    }

    func cancel() {
        let continuation = phase.withLock { phase -> CheckedContinuation<R, any Error>? in
            switch phase {
            case .new:
                phase = .cancelled
                return nil
            case .waiting(let continuation):
                phase = .cancelled
                return continuation
            case .cancelled, .started:
                return nil
            }
        }
        continuation?.resume(throwing: CancellationError())
    }
}
