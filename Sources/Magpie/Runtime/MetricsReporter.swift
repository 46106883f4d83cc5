import CoreMetrics

/// Pushes ``CacheStatistics`` to swift-metrics: counter deltas since the last report, and gauges.
/// Nothing on the cache's hot path touches a metric; see ``Cache/MetricsOptions``.
final class MetricsReporter: Sendable {
    private struct Instruments: Sendable {
        var counters: [String: Counter] = [:]
        var gauges: [String: Gauge] = [:]
    }

    private let options: Cache.MetricsOptions
    private let instruments: Locked<(Instruments, CacheStatistics?)>

    init(_ options: Cache.MetricsOptions) {
        self.options = options
        instruments = Locked((Instruments(), nil))
    }

    func report(_ now: CacheStatistics) {
        instruments.withLock { state in
            let previous = state.1 ?? CacheStatistics()
            var counts: [(String, String?, UInt64, UInt64)] = CacheCounter.table.map { ($0.metric, nil, now[keyPath: $0.field], previous[keyPath: $0.field]) }
            let before = Dictionary(uniqueKeysWithValues: previous.tierMetrics.map { ($0.tier, $0.counters) })
            for tier in now.tierMetrics {
                let old = before[tier.tier] ?? []
                for (index, (name, value)) in tier.counters.enumerated() {
                    counts.append((name, tier.tier, value, index < old.count ? old[index].1 : 0))
                }
                for (name, value) in tier.gauges { gauge(name, tier: tier.tier, in: &state.0).record(value) }
            }
            for (name, tier, value, old) in counts where value > old {
                counter(name, tier: tier, in: &state.0).increment(by: Int64(clamping: value - old))
            }
            state.1 = now
        }
    }

    /// The instrument `name` of `tier` (none: the cache's own), made on first use.
    private func instrument<I>(_ name: String, _ tier: String?, _ table: inout [String: I], _ make: (String, [(String, String)]) -> I) -> I {
        let key = name + "/" + (tier ?? "")
        if let found = table[key] { return found }
        let made = make(options.prefix + "_" + name, tier.map { options.dimensions + [("tier", $0)] } ?? options.dimensions)
        table[key] = made
        return made
    }

    private func counter(_ name: String, tier: String?, in instruments: inout Instruments) -> Counter {
        instrument(name, tier, &instruments.counters) { label, dimensions in
            options.factory.map { Counter(label: label, dimensions: dimensions, factory: $0) } ?? Counter(label: label, dimensions: dimensions)
        }
    }

    private func gauge(_ name: String, tier: String, in instruments: inout Instruments) -> Gauge {
        instrument(name, tier, &instruments.gauges) { label, dimensions in
            options.factory.map { Gauge(label: label, dimensions: dimensions, factory: $0) } ?? Gauge(label: label, dimensions: dimensions)
        }
    }
}

/// One tier's figures as metrics, under its `tier` dimension: counters (reported as deltas) and gauges, in
/// a fixed order.
protocol TierMetrics {
    var tier: String { get }
    var counters: [(String, UInt64)] { get }
    var gauges: [(String, Int64)] { get }
}

extension MemoryTierStatistics: TierMetrics {
    var tier: String { "memory" }
    var counters: [(String, UInt64)] { [("hits", hits), ("misses", misses), ("evictions", evictions), ("writes", inserts + updates)] }
    var gauges: [(String, Int64)] { [("entries", Int64(entries)), ("bytes", Int64(chargedBytes))] }
}

extension DiskTierStatistics: TierMetrics {
    var tier: String { "disk" }
    var counters: [(String, UInt64)] {
        [("hits", hits), ("misses", misses), ("evictions", evictions), ("writes", writes), ("corrupt_records", corruptRecords)]
    }
    var gauges: [(String, Int64)] { [("entries", Int64(entries)), ("bytes", Int64(bytesOnDisk))] }
}

extension RemoteTierStatistics: TierMetrics {
    var tier: String { "remote" }
    var counters: [(String, UInt64)] {
        [
            ("hits", hits), ("misses", misses), ("outdated", outdated), ("corrupt_records", corrupt), ("errors", errors),
            ("oom_refusals", oomRefusals),
            ("writes", stores), ("removals", removals), ("invalidations", invalidations), ("epoch_bumps", epochBumps),
            ("queued_removals", queuedRemovals), ("replayed_removals", replayedRemovals), ("leases", leasesAcquired),
            ("shared_loads", sharedLoads),
        ]
    }
    var gauges: [(String, Int64)] {
        [
            ("owed_removals", Int64(owedRemovals)), ("invalidation_lag_ms", lastLagMilliseconds),
            ("unconfirmed_ms", unconfirmedMilliseconds), ("undelivered_ms", undeliveredMilliseconds), ("breaker_open", failsFast ? 1 : 0),
        ]
    }
}

extension CacheStatistics {
    /// The tiers this cache has, each as its metrics.
    var tierMetrics: [any TierMetrics] { [memory] + [disk as (any TierMetrics)?, remote].compactMap { $0 } }
}

extension Cache {
    /// Reports the change in ``statistics`` since the last report to swift-metrics now (the periodic
    /// reporter of ``MetricsOptions/interval`` calls this too). Does nothing without ``Configuration/metrics``.
    public func reportMetrics() {
        guard let metrics else { return }
        metrics.report(statistics)
    }
}
