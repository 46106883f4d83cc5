import Hummingbird
import Magpie
import MagpieHTTPCache
import Synchronization

/// Serves products from the origin through one of the caching strategies the example compares.
final class Catalog: Sendable {
    enum Source: Sendable {
        /// The origin on every request.
        case origin
        /// A Hummingbird persist driver used as a user would: get; on a miss, the origin, then set with
        /// an expiry. Concurrent misses of one key each call the origin, and an expired key waits for it.
        case persist(any PersistDriver, expiry: Duration)
        /// Magpie's loader: one load per key at a time, stale values served while they refresh, the last
        /// good value while the origin fails (the cache's default entry and loader options).
        case loader(Cache)
        /// The origin on every request that reaches the handler, its response stored whole by Magpie's
        /// HTTP response cache (the route's middleware) with this `Cache-Control`.
        case responses(HTTPResponseCache, cacheControl: String)
    }

    let mode: CacheMode
    let origin: Origin
    let source: Source
    /// The Magpie cache behind the source, if any (for its statistics and its lifecycle).
    let cache: Cache?
    /// Requests answered with an error because the origin failed (or timed out) and nothing was cached.
    let unavailable = Atomic<Int>(0)

    init(mode: CacheMode, origin: Origin, source: Source, cache: Cache? = nil) {
        self.mode = mode
        self.origin = origin
        self.source = source
        self.cache = cache
    }

    func product(_ id: Int) async throws -> Response {
        let body: ByteBuffer
        do {
            switch source {
            case .origin:
                body = ByteBuffer(bytes: try await origin.product(id))
            case .responses(_, let cacheControl):
                let bytes = try await origin.product(id)
                return Response(
                    status: .ok, headers: [.contentType: "application/json", .cacheControl: cacheControl],
                    body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
            case .persist(let driver, let expiry):
                let key = "product:\(id)"
                if let cached = try await driver.get(key: key, as: String.self) {
                    body = ByteBuffer(string: cached)
                } else {
                    let loaded = String(decoding: try await origin.product(id), as: UTF8.self)
                    try await driver.set(key: key, value: loaded, expires: expiry)
                    body = ByteBuffer(string: loaded)
                }
            case .loader(let cache):
                body = ByteBuffer(bytes: try await cache.value(forKey: "product:\(id)") { [origin] in
                    try await origin.product(id)
                })
            }
        } catch let error as Origin.Unavailable {
            // Counted, not logged per request: the cache's own log summarises repeated load failures.
            unavailable.add(1, ordering: .relaxed)
            throw HTTPError(.serviceUnavailable, message: error.description)
        } catch let error as MagpieError where error.code == .loadTimedOut {
            unavailable.add(1, ordering: .relaxed)
            throw HTTPError(.gatewayTimeout, message: "the origin did not answer in time")
        }
        return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: body))
    }

    /// The origin's counters and the cache's, for `GET /admin/stats`.
    func stats() -> [String: Any] {
        var stats: [String: Any] = [
            "mode": mode.rawValue,
            "origin": [
                "calls": origin.calls.load(ordering: .relaxed),
                "failures": origin.failures.load(ordering: .relaxed),
                "failing": origin.isFailing ? 1 : 0,
            ],
            "unavailable": unavailable.load(ordering: .relaxed),
        ]
        if let cache {
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
        }
        return stats
    }
}
