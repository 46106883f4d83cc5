import Dispatch
import Synchronization

/// The one place where the cache's *synchronous* API waits for the remote tier (whose store is async
/// only): the operation runs as a task on a thread of the bridge's own, while the calling thread blocks
/// on a semaphore until it ends.
///
/// What it costs: the caller's thread is blocked for the round trip. Called from a thread of Swift's
/// cooperative pool (a synchronous cache call inside async code), that is one of the pool's few threads
/// (as many as cores) held for the round trip: use ``Cache/async`` there. The operation itself never
/// needs the cooperative pool (it runs on the bridge's thread and the store's event loops), so a
/// pool blocked by such callers slows them, but cannot deadlock them.
final class RemoteBridge: TaskExecutor, Sendable {
    private let thread: IOThreadPool

    init() {
        thread = IOThreadPool(threadCount: 1, name: "magpie-remote")
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        if !thread.submit({ job.runSynchronously(on: executor) }) {
            // Shut down (the cache is being deinitialised): run it where it was enqueued instead.
            job.runSynchronously(on: executor)
        }
    }

    /// Runs `operation` on the bridge's thread and blocks until it ends. Throws
    /// ``MagpieError/Code/remoteUnavailable`` at once where the store forbids waiting (on its own event
    /// loop: a wait there would deadlock).
    func wait<R: Sendable>(_ store: any RemoteStore, _ operation: @escaping @Sendable () async throws(MagpieError) -> R)
        throws(MagpieError) -> R
    {
        guard store.callerMayWait else {
            throw MagpieError(.remoteUnavailable, "a synchronous cache call on the remote store's own thread cannot wait for it")
        }
        let outcome = Locked<Result<R, MagpieError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task(executorPreference: self) {
            let result: Result<R, MagpieError>
            do throws(MagpieError) { result = .success(try await operation()) } catch { result = .failure(error) }
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        // Set before the signal the wait saw.
        guard let result = outcome.withLock({ $0 }) else {
            throw MagpieError(.remoteUnavailable, "the remote call ended without a result")
        }
        return try result.get()
    }

    func shutdown() { thread.shutdown() }
}
