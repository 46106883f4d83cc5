import Foundation

// A system's row: the workers' reports summed, the latencies merged, the Redis counters of the window,
// and the fault windows' tallies.

extension FleetScenario {
    func aggregate(
        _ system: String, outputs: [[String: JSONValue]], table: FleetShared, faults: FaultTimeline, tasks: Int,
        mix: FleetMix = .standard, redis: FleetRedisStats?
    ) -> BenchResult {
        var sums: [String: Int] = [:]
        var doubles: [String: Double] = [:]
        var histograms: [String: LogHistogram] = [:]
        for output in outputs {
            for (key, value) in output {
                switch value {
                case .int(let v): sums[key, default: 0] += v
                case .double(let v): doubles[key] = max(doubles[key] ?? v, v)
                case .array(let counts)
                where key.hasSuffix("_latency") || key.hasSuffix("_running") || key.hasSuffix("_paused"):
                    histograms[key, default: LogHistogram()].merge(
                        counts.map { if case .int(let c) = $0 { c } else { 0 } })
                default: break
                }
            }
        }
        let reads = histograms["read_latency"] ?? LogHistogram()
        let all = histograms["all_latency"] ?? LogHistogram()
        let operations = all.total
        let readCount = max(1, sums["reads", default: 0])
        let seconds = Double(options.seconds)
        var extra: [String: JSONValue] = [:]
        let roundTrips = FleetRoundTrips.Cause.allCases.flatMap { cause in
            ["redis_operations_\(cause)", "redis_round_trips_\(cause)", "redis_commands_\(cause)", "redis_staged_\(cause)"]
                + FleetRoundTrips.Stage.allCases.map { "redis_stage_\($0)_ns_\(cause)" }
        }
        for key in [
            "reads", "writes", "removes", "origin_calls", "caller_errors", "wrong_values", "remote_errors",
            "invalidations",
            "epoch_bumps", "owed_removals", "replayed_removals", "stale_from_remote", "store_hits", "unkept",
            "withheld", "fenced",
            "remote_reads", "remote_read_hits", "remote_read_misses", "unserved_copies", "leases", "lease_waits",
            "shared_loads", "copies_dropped", "pushes_applied", "own_messages", "stale_messages", "sequence_gaps",
            "partition_losses", "short_partitions", "sequence_restarts",
            "own_write_probes", "own_write_probes_not_local", "own_write_probes_in_faults", "messages_received",
            "own_messages_skipped", "messages_dropped", "subscription_losses", "local_entries", "probe_writes",
            "key_lock_waits", "cpu_ns",
        ] + roundTrips {
            if let v = sums[key] { extra[key] = .int(v) }
        }
        extra["drop_messages_applied"] = .double(doubles["drop_messages_applied"] ?? 0)
        // Reads that went to Redis, of all reads (Magpie: `readHits + readMisses` of its statistics over
        // the window; the others count their GETs).
        extra["remote_share"] = .double(Double(sums["remote_reads", default: 0]) / Double(readCount))
        faultTallies(sums, faults: faults, into: &extra)
        if let hits = sums["remote_read_hits"] {
            // Magpie's loader API does not say which tier answered: its statistics do.
            extra["hit_ratio_remote"] = .double(Double(hits) / Double(readCount))
            extra["hit_ratio_memory"] = .double(
                Double(readCount - sums["remote_reads", default: 0]) / Double(readCount))
            extra["hit_ratio_disk"] = .double(0)
        } else if system == "local-uncoherent" {
            extra["hit_ratio_memory"] = .double(1 - Double(sums["origin_calls", default: 0]) / Double(readCount))
            extra["hit_ratio_disk"] = .double(0)
            extra["hit_ratio_remote"] = .double(0)
        } else {
            extra["hit_ratio_memory"] = .double(Double(sums["memory_hits", default: 0]) / Double(readCount))
            extra["hit_ratio_disk"] = .double(Double(sums["disk_hits", default: 0]) / Double(readCount))
            extra["hit_ratio_remote"] = .double(Double(sums["remote_hits", default: 0]) / Double(readCount))
        }
        extra["operation_latency_ns"] = all.percentiles.json
        extra["tasks"] = .int(tasks)
        let shares = options.shares(of: mix)
        extra["mix"] = .string(mix.rawValue)
        extra["set_share"] = .double(shares.set)
        extra["remove_share"] = .double(shares.remove)
        // Stores (sets) and removals: their rate and latency from the callers.
        let stores = histograms["store_latency"] ?? LogHistogram()
        let removals = histograms["remove_latency"] ?? LogHistogram()
        extra["store_latency_ns"] = stores.percentiles.json
        extra["remove_latency_ns"] = removals.percentiles.json
        extra["store_latency_mean_ns"] = .double(stores.mean)
        extra["remove_latency_mean_ns"] = .double(removals.mean)
        extra["stores_per_sec"] = .double(Double(sums["writes", default: 0]) / seconds)
        extra["removes_per_sec"] = .double(Double(sums["removes", default: 0]) / seconds)
        // The pause rows: callers' reads, memory hits and stores that overlapped the SIGSTOP, beside those
        // while Redis ran (neither paused nor killed); also flat (`pause_read_p99_ns`, `running_store_p50_ns`, …).
        for (key, histogram) in histograms
        where (key.hasSuffix("_running") || key.hasSuffix("_paused")) && histogram.total > 0 {
            let percentiles = histogram.percentiles
            extra[key + "_ns"] = percentiles.json
            extra[key + "_count"] = .int(histogram.total)
            let kind = key.hasPrefix("hit") ? "hit" : key.hasPrefix("read") ? "read" : "store"
            let phase = key.hasSuffix("_paused") ? "pause" : "running"
            for (name, value) in [("p50", percentiles.p50), ("p99", percentiles.p99), ("max", percentiles.max)] {
                extra["\(phase)_\(kind)_\(name)_ns"] = .int(Int(value))
            }
        }
        // Recovery: the time until every worker's feed is healthy again (the systems that have one).
        let feeds = system == "magpie-fleet" || system == "local-pubsub"
        if feeds {
            extra["recovery_seconds"] = .double(faults.recoveries.max() ?? 0)
            if !faults.recoveries.isEmpty {
                extra["recoveries_seconds"] = .array(faults.recoveries.map { .double($0) })
            }
            let (lag, lost, early) = invalidationLag(table)
            extra["invalidation_lag_ns"] = lag.percentiles.json
            extra["lag_probes"] = .int(lag.total)
            extra["lag_probes_never_dropped"] = .int(lost)
            extra["lag_probes_dropped_before_return"] = .int(early)
        }
        if let redis {
            // Writes that reached Redis: sets, removals, the loads' fills, and the probes' sets.
            let written =
                sums["writes", default: 0] + sums["removes", default: 0] + sums["origin_calls", default: 0]
                + sums["probe_writes", default: 0]
            extra.merge(redis.extra(system: system, stores: written, operations: operations)) { $1 }
            // Another server's CPU is its other clients' too: only a private one's is the system's.
            if options.url != nil { extra["redis_cpu_us_per_op"] = nil }
        }
        costs(sums, operations: operations, seconds: seconds, into: &extra)
        return BenchResult(
            scenario: scenario, system: system, threads: options.workers * (tasks > 0 ? tasks : options.threads),
            operations: operations,
            seconds: seconds, ops_per_sec: Double(operations) / seconds, latency_ns: reads.percentiles,
            hit_ratio: 1 - Double(sums["origin_calls", default: 0]) / Double(readCount), extra: extra)
    }

    /// What the window's operations cost: the worker processes' CPU time per operation (and with the
    /// private server's, the total), and Redis round trips (and commands) per set, removal and read (each
    /// measured call, failed ones included) as the workers' clients counted them by cause
    /// (FleetRoundTrips.swift), with the background's per second.
    private func costs(_ sums: [String: Int], operations: Int, seconds: Double, into extra: inout [String: JSONValue]) {
        if operations > 0, let cpu = sums["cpu_ns"] {
            let workers = Double(cpu) / 1e3 / Double(operations)
            extra["worker_cpu_us_per_op"] = .double(workers)
            if let redis = extra["redis_cpu_us_per_op"]?.numberValue { extra["cpu_us_per_op"] = .double(workers + redis) }
        }
        for cause in ["set", "removal", "read"] {
            guard let operations = sums["redis_operations_\(cause)"], operations > 0 else { continue }
            if let trips = sums["redis_round_trips_\(cause)"] {
                extra["redis_round_trips_per_\(cause)"] = .double(Double(trips) / Double(operations))
            }
            if let commands = sums["redis_commands_\(cause)"] {
                extra["redis_commands_per_\(cause)"] = .double(Double(commands) / Double(operations))
            }
            // Where the round trips' time went: µs per round trip, by stage.
            if let staged = sums["redis_staged_\(cause)"], staged > 0 {
                var stages: [String: JSONValue] = [:]
                for stage in FleetRoundTrips.Stage.allCases {
                    stages["\(stage)"] = .double(Double(sums["redis_stage_\(stage)_ns_\(cause)", default: 0]) / 1e3 / Double(staged))
                }
                extra["redis_stage_us_per_round_trip_\(cause)"] = .object(stages)
            }
        }
        if let background = sums["redis_round_trips_background"] {
            extra["redis_background_round_trips_per_sec"] = .double(Double(background) / seconds)
        }
    }

    /// Stale and resurrected reads and caller errors, per fault window (each from the fault's start to
    /// `FaultTimeline.grace` after its end, the fault bar) and outside them all, as the workers counted
    /// them (`FleetWindowTally`).
    ///
    /// `stale_reads_beyond_bound` and `resurrected_removals` leave out only the reads that started while
    /// Redis was killed or paused or within the grace after (`…_during_outage`): not those after the
    /// subscriber connections were killed, nor those the dropped messages cause, which the staleness
    /// bound covers.
    private func faultTallies(_ sums: [String: Int], faults: FaultTimeline, into extra: inout [String: JSONValue]) {
        func count(_ kind: FleetWindowTally.Kind, _ slot: String) -> Int { sums["window_\(kind)_\(slot)", default: 0] }
        extra["stale_reads_beyond_bound"] = .int(sums["stale_reads_beyond_bound", default: 0] - count(.stale, "outage"))
        extra["resurrected_removals"] = .int(sums["resurrected_removals", default: 0] - count(.resurrected, "outage"))
        guard options.fault else { return }
        extra["stale_reads_during_outage"] = .int(count(.stale, "outage"))
        extra["resurrected_removals_during_outage"] = .int(count(.resurrected, "outage"))
        var windows: [String: JSONValue] = [:]
        func tallies(_ slot: String) -> [String: JSONValue] {
            [
                "stale_beyond_bound": .int(count(.stale, slot)), "resurrected": .int(count(.resurrected, slot)),
                "caller_errors": .int(count(.errors, slot)),
            ]
        }
        let first = faults.windows.first?.began ?? 0
        for window in faults.windows {
            var object = tallies(window.kind.rawValue)
            object["began_s"] = .double(Double(window.began - first) / 1e9)
            object["seconds"] = .double(Double(window.ended - window.began) / 1e9)
            object["recovery_seconds"] = .double(window.recovery.healthy)
            object["recovery_confirmed_seconds"] = .double(window.recovery.confirmed)
            object["recovery_delivered_seconds"] = .double(window.recovery.delivered)
            if let loading = window.loading { object["loading_seconds"] = .double(loading) }
            if window.kind == .redisEvicting {
                if let evicted = faults.keysEvicted { object["keys_evicted"] = .int(evicted) }
                if let limit = faults.evictingLimit { object["maxmemory_bytes"] = .int(limit) }
            }
            windows[window.kind.rawValue] = .object(object)
        }
        windows["outside"] = .object(tallies("outside"))
        extra["fault_windows"] = .object(windows)
        extra["fault_grace_seconds"] = .double(Double(FaultTimeline.grace) / 1e9)
        if let clients = faults.pubsubClientsKilled { extra["pubsub_clients_killed"] = .int(clients) }
        if let evicted = faults.keysEvicted { extra["keys_evicted"] = .int(evicted) }
        // The pause window's and the subscriber kill's tallies, also flat.
        if let pause = faults.windows.first(where: { $0.kind == .redisPaused }) {
            extra["pause_seconds"] = .double(Double(pause.ended - pause.began) / 1e9)
            extra["pause_grace_seconds"] = .double(Double(FaultTimeline.grace) / 1e9)
            extra["pause_caller_errors"] = .int(count(.errors, "redis_paused"))
            extra["pause_stale_beyond_bound"] = .int(count(.stale, "redis_paused"))
            extra["pause_resurrected"] = .int(count(.resurrected, "redis_paused"))
        }
        if faults.windows.contains(where: { $0.kind == .pubsubKilled }) {
            extra["pubsub_kill_caller_errors"] = .int(count(.errors, "pubsub_killed"))
            extra["pubsub_kill_stale_beyond_bound"] = .int(count(.stale, "pubsub_killed"))
            extra["pubsub_kill_resurrected"] = .int(count(.resurrected, "pubsub_killed"))
        }
    }

    /// Per probe: from its write returning to the last other worker dropping it (0 when they all
    /// dropped it before the writer saw its reply). Probes some worker never dropped are counted apart.
    func invalidationLag(_ table: FleetShared) -> (LogHistogram, Int, Int) {
        var lag = LogHistogram()
        var lost = 0
        var early = 0
        for probe in 0..<table.probes {
            let written = table.load(table.probeWord(probe, 0))
            guard written > 0 else { continue }
            let writer = probe % options.workers
            var last: Int64 = 0
            var missing = false
            for worker in 0..<options.workers where worker != writer {
                let dropped = table.load(table.probeWord(probe, 1 + worker))
                if dropped == 0 { missing = true } else { last = max(last, dropped) }
            }
            if missing {
                lost += 1
                continue
            }
            if last < written { early += 1 }
            lag.record(max(0, last - written))
        }
        return (lag, lost, early)
    }
}
