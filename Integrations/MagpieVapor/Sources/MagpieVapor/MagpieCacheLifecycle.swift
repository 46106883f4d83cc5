import Magpie
import Vapor

/// Shuts a Magpie cache down with the application: `app.lifecycle.use(MagpieCacheLifecycle(cache))`.
///
/// On the application's shutdown it flushes the cache (every store and removal durable), closes it, and,
/// with a remote tier, waits briefly for the removals owed to the store (``Magpie/Cache/shutdown(replayingFor:)``).
/// A failure is logged on the application's logger: a shutdown goes on.
public struct MagpieCacheLifecycle: LifecycleHandler {
    /// The cache shut down with the application.
    public let cache: Magpie.Cache

    /// A handler that shuts `cache` down with the application.
    public init(_ cache: Magpie.Cache) {
        self.cache = cache
    }

    public func shutdown(_ application: Application) {
        do {
            try cache.flush()
        } catch {
            application.logger.error("flushing a Magpie cache at shutdown failed: \(error)")
        }
        do {
            try cache.close()
        } catch {
            application.logger.error("closing a Magpie cache at shutdown failed: \(error)")
        }
    }

    public func shutdownAsync(_ application: Application) async {
        do {
            try await cache.shutdown()
        } catch {
            application.logger.error("shutting a Magpie cache down failed: \(error)")
        }
    }
}
