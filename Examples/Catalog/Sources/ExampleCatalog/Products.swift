import Magpie
import Synchronization

/// A key-value cache used the way its users use one: get; on a miss, call the origin, then set with an
/// expiry (Hummingbird's `PersistDriver`, Vapor's `Cache`). Concurrent misses of one key each call the
/// origin, and an expired key waits for it.
public protocol ProductStore: Sendable {
    func product(forKey key: String) async throws -> Product?
    func set(_ product: Product, forKey key: String, expiry: Duration) async throws
}

/// The products a service serves, by one of the strategies the examples compare; the framework-free part
/// of a product route (the framework renders the product and maps ``Unavailable`` to a status).
public final class Products: Sendable {
    public enum Source: Sendable {
        /// The origin on every call. Also the handler behind an HTTP response cache, which stores the
        /// rendered response and runs the handler only to fill or refresh it.
        case origin
        /// A key-value cache, get then set.
        case store(any ProductStore, expiry: Duration)
        /// Magpie's loader: one load per key at a time, stale values served while they refresh, the last
        /// good value while the origin fails (the cache's default entry and loader options).
        case loader(TypedCache<Product>)
    }

    /// No product to serve: the origin failed or timed out, and nothing was cached.
    public struct Unavailable: Error, CustomStringConvertible {
        /// The origin did not answer within the loader's hard timeout (504), rather than failed (503).
        public let timedOut: Bool
        public let description: String
    }

    /// The mode's name, reported by ``stats()``.
    public let mode: String
    public let origin: Origin
    public let source: Source
    /// The Magpie cache behind the mode, if any (for its statistics and its lifecycle).
    public let cache: Cache?
    /// Requests answered with an error because the origin failed (or timed out) and nothing was cached.
    public let unavailable = Atomic<Int>(0)

    public init(mode: String, origin: Origin, source: Source, cache: Cache? = nil) {
        self.mode = mode
        self.origin = origin
        self.source = source
        self.cache = cache
    }

    /// The product `id` by the mode's strategy.
    /// - Throws: ``Unavailable`` (counted, not logged per request: the cache's own log summarises repeated
    ///   load failures), or the cache's own errors.
    public func product(_ id: Int) async throws -> Product {
        do {
            switch source {
            case .origin:
                return try await origin.product(id)
            case .store(let store, let expiry):
                let key = "product:\(id)"
                if let cached = try await store.product(forKey: key) { return cached }
                let loaded = try await origin.product(id)
                try await store.set(loaded, forKey: key, expiry: expiry)
                return loaded
            case .loader(let products):
                return try await products.value(forKey: "product:\(id)") { [origin] in try await origin.product(id) }
            }
        } catch let error as Origin.Unavailable {
            unavailable.add(1, ordering: .relaxed)
            throw Unavailable(timedOut: false, description: error.description)
        } catch let error as MagpieError where error.code == .loadTimedOut {
            unavailable.add(1, ordering: .relaxed)
            throw Unavailable(timedOut: true, description: "the origin did not answer in time")
        }
    }

    /// The origin's counters and the cache's, for `GET /admin/stats`. `through_loader`: every origin call
    /// is one of the cache's loader runs (the loader and the response cache), so the two can be checked
    /// against each other.
    public func stats() -> [String: Any] {
        var stats: [String: Any] = [
            "mode": mode,
            "origin": [
                "calls": origin.calls.load(ordering: .relaxed),
                "failures": origin.failures.load(ordering: .relaxed),
                "failing": origin.isFailing ? 1 : 0,
            ],
            "unavailable": unavailable.load(ordering: .relaxed),
        ]
        guard let cache else { return stats }
        if case .store = source { stats["through_loader"] = false } else { stats["through_loader"] = true }
        let statistics = cache.statistics
        var counters: [String: Any] = [
            "memory_hits": statistics.memory.hits,
            "memory_entries": statistics.memory.entries,
            "hits": statistics.hits,
            "misses": statistics.misses,
            "loader_runs": statistics.loaderRuns,
            "loader_coalesced": statistics.loaderCoalesced,
            "loader_failures": statistics.loaderFailures,
            "fresh_hits": statistics.freshHits,
            "stale_hits": statistics.staleHits,
            "background_refreshes": statistics.backgroundRefreshes,
            "fail_safe_activations": statistics.failSafeActivations,
            "soft_timeouts": statistics.softTimeouts,
            "hard_timeouts": statistics.hardTimeouts,
        ]
        if let disk = statistics.disk {
            counters["disk_hits"] = disk.hits
            counters["disk_entries"] = disk.entries
        }
        if let remote = statistics.remote {
            counters["remote_hits"] = remote.hits
            counters["remote_misses"] = remote.misses
            counters["remote_errors"] = remote.errors
            counters["leases_acquired"] = remote.leasesAcquired
            counters["shared_loads"] = remote.sharedLoads
        }
        stats["cache"] = counters
        return stats
    }
}

extension Products {
    /// The cache configuration every Magpie mode of the examples uses: a product is fresh for `fresh`; after
    /// that it is served stale while one background load refreshes it, and, while the origin fails, for up
    /// to an hour (fail-safe). The logger is the service's to set.
    public static func configuration(directory: String?, fresh: Duration, logInterval: Duration) -> Cache.Configuration {
        var configuration = Cache.Configuration(directory: directory, memoryBudget: 256 << 20, diskBudget: 1 << 30)
        configuration.logInterval = logInterval
        configuration.defaultOptions = .fresh(for: fresh, staleUntil: .after(.seconds(3600)))
        configuration.defaultLoaderOptions = LoaderOptions(
            staleWhileRevalidate: true, eagerRefresh: 0.8, failSafeMaxAge: .seconds(3600),
            failSafeThrottle: .seconds(5), softTimeout: .milliseconds(200), hardTimeout: .seconds(2))
        return configuration
    }

    /// The `Cache-Control` of a product response in the response-cache modes: fresh for `fresh`, then
    /// served stale while one background run refreshes it, and while the origin fails, for an hour.
    public static func cacheControl(fresh: Duration) -> String {
        "max-age=\(fresh.components.seconds), stale-while-revalidate=3600, stale-if-error=3600"
    }
}
