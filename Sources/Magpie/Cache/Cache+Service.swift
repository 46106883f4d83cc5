import ServiceLifecycle

// `Cache` as a swift-service-lifecycle `Service`: add it to a `ServiceGroup` and the group's graceful
// shutdown flushes and closes it.

extension Cache: Service {
    /// Runs until the service group shuts down gracefully (or the task is cancelled), then shuts the
    /// cache down: ``shutdown(replayingFor:)``.
    public func run() async throws {
        // Returns on graceful shutdown; throws on cancellation, which shuts down the same way.
        try? await gracefulShutdown()
        try await shutdown()
    }

    /// Shuts the cache down in order: waits up to `replayTime` for the removals owed to the remote tier
    /// to reach it (see ``RemoteTierOptions/maxPendingRemovals``), makes every store and removal durable
    /// (``flush()``), closes the cache (``close()``), and closes the remote store's connections. What is
    /// still owed after `replayTime` is logged with its count: with a disk tier it stays in the directory's
    /// journal and is replayed when the directory is opened again; without one it is lost.
    /// - Throws: the disk tier's flush and close errors (the cache is closed either way).
    public func shutdown(replayingFor replayTime: Duration = .seconds(2)) async throws {
        await composition.policy.replayBeforeShutdown(upTo: replayTime)
        // The flush's fsyncs and the close (which waits for the disk tier's loader thread) block: with a
        // disk tier they run on an I/O thread, not on one of Swift's. In a task of its own, so that the
        // cancellation this is often called under does not keep the cache from closing; right here if
        // the I/O pool refuses (already shut down).
        let finish: @Sendable () throws(MagpieError) -> MagpieError? = { [self] () throws(MagpieError) -> MagpieError? in
            var failure: MagpieError? = nil
            if !runtime.closed.load(ordering: .relaxed) {
                do throws(MagpieError) { try flush() } catch { failure = error }
            }
            do throws(MagpieError) { try close(waitingForRemote: false) } catch { failure = failure ?? error }
            return failure
        }
        let local = composition.local
        let failure: MagpieError?
        do {
            failure = try await Task { try await local.offload(finish) }.value
        } catch {
            failure = try finish()
        }
        await composition.policy.closeStore()
        if let failure { throw failure }
    }
}
