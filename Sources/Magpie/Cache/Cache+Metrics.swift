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
    private let task = Locked<Task<Void, Never>?>(nil)

    init(_ options: Cache.MetricsOptions) {
        self.options = options
        instruments = Locked((Instruments(), nil))
    }

    func attach(_ task: Task<Void, Never>) {
        self.task.withLock { $0 = task }
    }

    func stop() {
        task.withLock { task in
            task?.cancel()
            task = nil
        }
    }

    func report(_ now: CacheStatistics) {
        instruments.withLock { state in
            let previous = state.1 ?? CacheStatistics()
            var counts: [(String, String?, UInt64, UInt64)] = [
                ("hits", "memory", now.memory.hits, previous.memory.hits),
                ("misses", "memory", now.memory.misses, previous.memory.misses),
                ("evictions", "memory", now.memory.evictions, previous.memory.evictions),
                ("writes", "memory", now.memory.inserts + now.memory.updates, previous.memory.inserts + previous.memory.updates),
                ("promotions", nil, now.promotions, previous.promotions),
                ("loader_runs", nil, now.loaderRuns, previous.loaderRuns),
                ("loader_coalesced", nil, now.loaderCoalesced, previous.loaderCoalesced),
                ("loader_failures", nil, now.loaderFailures, previous.loaderFailures),
                ("loader_fresh_hits", nil, now.freshHits, previous.freshHits),
                ("loader_stale_hits", nil, now.staleHits, previous.staleHits),
                ("loader_negative_hits", nil, now.negativeHits, previous.negativeHits),
                ("loader_background_refreshes", nil, now.backgroundRefreshes, previous.backgroundRefreshes),
                ("loader_fail_safe_activations", nil, now.failSafeActivations, previous.failSafeActivations),
                ("loader_soft_timeouts", nil, now.softTimeouts, previous.softTimeouts),
                ("loader_hard_timeouts", nil, now.hardTimeouts, previous.hardTimeouts),
                ("loader_superseded", nil, now.loadsSuperseded, previous.loadsSuperseded),
                ("disk_errors", nil, now.diskErrors, previous.diskErrors),
                ("subscript_failures", nil, now.subscriptFailures, previous.subscriptFailures),
                ("inline_disk_reads", nil, now.inlineDiskReads, previous.inlineDiskReads),
                ("inline_disk_stores", nil, now.inlineDiskStores, previous.inlineDiskStores),
            ]
            if let disk = now.disk {
                let before = previous.disk ?? DiskTierStatistics()
                counts += [
                    ("hits", "disk", disk.hits, before.hits), ("misses", "disk", disk.misses, before.misses),
                    ("evictions", "disk", disk.evictions, before.evictions), ("writes", "disk", disk.writes, before.writes),
                    ("corrupt_records", "disk", disk.corruptRecords, before.corruptRecords),
                ]
            }
            if let remote = now.remote {
                let before = previous.remote ?? RemoteTierStatistics()
                counts += [
                    ("hits", "remote", remote.hits, before.hits), ("misses", "remote", remote.misses, before.misses),
                    ("outdated", "remote", remote.outdated, before.outdated),
                    ("corrupt_records", "remote", remote.corrupt, before.corrupt),
                    ("errors", "remote", remote.errors, before.errors), ("writes", "remote", remote.stores, before.stores),
                    ("removals", "remote", remote.removals, before.removals),
                    ("invalidations", "remote", remote.invalidations, before.invalidations),
                    ("epoch_bumps", "remote", remote.epochBumps, before.epochBumps),
                    ("queued_removals", "remote", remote.queuedRemovals, before.queuedRemovals),
                    ("replayed_removals", "remote", remote.replayedRemovals, before.replayedRemovals),
                    ("leases", "remote", remote.leasesAcquired, before.leasesAcquired),
                    ("shared_loads", "remote", remote.sharedLoads, before.sharedLoads),
                ]
            }
            for (name, tier, value, old) in counts where value > old {
                counter(name, tier: tier, in: &state.0).increment(by: Int64(clamping: value - old))
            }
            gauge("entries", tier: "memory", in: &state.0).record(now.memory.entries)
            gauge("bytes", tier: "memory", in: &state.0).record(now.memory.chargedBytes)
            if let disk = now.disk {
                gauge("entries", tier: "disk", in: &state.0).record(disk.entries)
                gauge("bytes", tier: "disk", in: &state.0).record(disk.bytesOnDisk)
            }
            if let remote = now.remote {
                gauge("owed_removals", tier: "remote", in: &state.0).record(remote.owedRemovals)
                gauge("invalidation_lag_ms", tier: "remote", in: &state.0).record(remote.lastLagMilliseconds)
                gauge("unconfirmed_ms", tier: "remote", in: &state.0).record(remote.unconfirmedMilliseconds)
                gauge("undelivered_ms", tier: "remote", in: &state.0).record(remote.undeliveredMilliseconds)
                gauge("breaker_open", tier: "remote", in: &state.0).record(remote.failsFast ? 1 : 0)
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

    func startReporting(every interval: Duration) {
        guard let metrics else { return }
        let task = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard let self, !Task.isCancelled else { return }
                // Not while the disk buckets' indexes still load after the open: `statistics` would
                // wait for them on a thread of Swift's pool. The next tick reports (counters are totals).
                if let disk = self.disk, !disk.loader.isFinished { continue }
                self.reportMetrics()
            }
        }
        metrics.attach(task)
    }
}
