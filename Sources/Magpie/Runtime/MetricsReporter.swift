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

    /// The counters reported beside the cache's own (``CacheCounter/table``): metric name, `tier`
    /// dimension, and the statistics field (nil where the tier is absent).
    private static let tierCounters: [(String, String, @Sendable (CacheStatistics) -> UInt64?)] = [
        ("hits", "memory", { $0.memory.hits }), ("misses", "memory", { $0.memory.misses }),
        ("evictions", "memory", { $0.memory.evictions }), ("writes", "memory", { $0.memory.inserts + $0.memory.updates }),
        ("hits", "disk", { $0.disk?.hits }), ("misses", "disk", { $0.disk?.misses }), ("evictions", "disk", { $0.disk?.evictions }),
        ("writes", "disk", { $0.disk?.writes }), ("corrupt_records", "disk", { $0.disk?.corruptRecords }),
        ("hits", "remote", { $0.remote?.hits }), ("misses", "remote", { $0.remote?.misses }),
        ("outdated", "remote", { $0.remote?.outdated }), ("corrupt_records", "remote", { $0.remote?.corrupt }),
        ("errors", "remote", { $0.remote?.errors }), ("writes", "remote", { $0.remote?.stores }),
        ("removals", "remote", { $0.remote?.removals }), ("invalidations", "remote", { $0.remote?.invalidations }),
        ("epoch_bumps", "remote", { $0.remote?.epochBumps }), ("queued_removals", "remote", { $0.remote?.queuedRemovals }),
        ("replayed_removals", "remote", { $0.remote?.replayedRemovals }), ("leases", "remote", { $0.remote?.leasesAcquired }),
        ("shared_loads", "remote", { $0.remote?.sharedLoads }),
    ]

    /// The gauges: metric name, `tier` dimension, and the reading (nil where the tier is absent).
    private static let gauges: [(String, String, @Sendable (CacheStatistics) -> Int64?)] = [
        ("entries", "memory", { Int64($0.memory.entries) }), ("bytes", "memory", { Int64($0.memory.chargedBytes) }),
        ("entries", "disk", { $0.disk.map { Int64($0.entries) } }), ("bytes", "disk", { $0.disk.map { Int64($0.bytesOnDisk) } }),
        ("owed_removals", "remote", { $0.remote.map { Int64($0.owedRemovals) } }),
        ("invalidation_lag_ms", "remote", { $0.remote?.lastLagMilliseconds }),
        ("unconfirmed_ms", "remote", { $0.remote?.unconfirmedMilliseconds }),
        ("undelivered_ms", "remote", { $0.remote?.undeliveredMilliseconds }),
        ("breaker_open", "remote", { $0.remote.map { $0.failsFast ? 1 : 0 } }),
    ]

    func report(_ now: CacheStatistics) {
        instruments.withLock { state in
            let previous = state.1 ?? CacheStatistics()
            var counts: [(String, String?, UInt64, UInt64)] = CacheCounter.table.map { ($0.metric, nil, now[keyPath: $0.field], previous[keyPath: $0.field]) }
            for (name, tier, read) in Self.tierCounters {
                if let value = read(now) { counts.append((name, tier, value, read(previous) ?? 0)) }
            }
            for (name, tier, value, old) in counts where value > old {
                counter(name, tier: tier, in: &state.0).increment(by: Int64(clamping: value - old))
            }
            for (name, tier, read) in Self.gauges {
                if let value = read(now) { gauge(name, tier: tier, in: &state.0).record(value) }
            }
            state.1 = now
        }
    }

    private func dimensions(_ tier: String?) -> [(String, String)] {
        tier.map { options.dimensions + [("tier", $0)] } ?? options.dimensions
    }

    private func counter(_ name: String, tier: String?, in instruments: inout Instruments) -> Counter {
        let key = name + "/" + (tier ?? "")
        if let counter = instruments.counters[key] { return counter }
        let label = options.prefix + "_" + name
        let counter =
            options.factory.map { Counter(label: label, dimensions: dimensions(tier), factory: $0) }
            ?? Counter(label: label, dimensions: dimensions(tier))
        instruments.counters[key] = counter
        return counter
    }

    private func gauge(_ name: String, tier: String, in instruments: inout Instruments) -> Gauge {
        let key = name + "/" + tier
        if let gauge = instruments.gauges[key] { return gauge }
        let label = options.prefix + "_" + name
        let gauge =
            options.factory.map { Gauge(label: label, dimensions: dimensions(tier), factory: $0) }
            ?? Gauge(label: label, dimensions: dimensions(tier))
        instruments.gauges[key] = gauge
        return gauge
    }
}

extension Cache {
    /// Reports the change in ``statistics`` since the last report to swift-metrics now (the periodic
    /// reporter of ``MetricsOptions/interval`` calls this too). Does nothing without ``Configuration/metrics``.
    public func reportMetrics() {
        guard let metrics else { return }
        metrics.report(statistics)
    }
}
