import Foundation

// The printed tables of `magpie-bench fleet` (and of the default suite's fleet rows).

func fleetTables(_ results: [BenchResult]) -> [Table] {
    let rows = results.filter {
        ($0.scenario == "fleet" || $0.scenario == "fleet-fault") && $0.extra["single_flight"] == nil
    }
    guard !rows.isEmpty else { return [] }
    // With faults, a system whose calls fail fast while Redis is down counts those failures as operations:
    // its ops/s is no throughput, and no ratio is shown.
    let faulted = rows[0].scenario == "fleet-fault"
    /// Magpie's row's ops/s over `baseline`'s at the same tasks value and mix; "-" for the other rows.
    func ratio(_ row: BenchResult, to baseline: String) -> String {
        guard !faulted, row.system == "magpie-fleet",
            let base = rows.first(where: {
                $0.system == baseline && $0.extra["tasks"] == row.extra["tasks"] && FleetMix(of: $0) == FleetMix(of: row)
            }), base.ops_per_sec > 0
        else { return "-" }
        return String(format: "%.2f", row.ops_per_sec / base.ops_per_sec)
    }
    var reads = Table(
        "Fleet (\(rows[0].scenario)): ops/s summed over the workers; reads timed from the caller; remote share: reads that went to Redis",
        [
            "system", "tasks", "mix", "ops/s", "× aside", "× pubsub", "read p50 µs", "p99 µs", "p99.9 µs", "remote share",
            "hit ratio", "origin calls", "stale > bound", "resurrected", "caller errors",
        ])
    for row in rows {
        let x = FleetRowView(row)
        reads.append([
            row.system, x.tasksText, x.mix, String(format: "%.0f", row.ops_per_sec), ratio(row, to: "redis-cache-aside"),
            ratio(row, to: "local-pubsub"), micros(row.latency_ns.p50), micros(row.latency_ns.p99), micros(row.latency_ns.p999),
            x.double("remote_share", "%.3f"), String(format: "%.3f", row.hit_ratio), x.int("origin_calls"),
            x.int("stale_reads_beyond_bound"), x.int("resurrected_removals"), x.int("caller_errors"),
        ])
    }
    var stores = Table(
        "Stores (sets) from the caller; Redis: its commandstats and CPU over the measured window (a store: a set, removal, fill or probe write)",
        [
            "system", "tasks", "mix", "stores/s", "store p50/p99/p99.9 µs", "Redis µs/store", "summed", "Redis CPU µs/op",
            "own writes read remotely", "lag p50/p99/p999 ms", "recovery s",
        ])
    for row in rows {
        let x = FleetRowView(row)
        var commands = "-"
        if case .array(let names)? = row.extra["redis_store_commands"] {
            commands = names.compactMap(\.stringValue).joined(separator: "+")
        }
        var own = "-"
        if let probes = row.extra["own_write_probes"]?.intValue, probes > 0, let remote = row.extra["own_write_probes_not_local"]?.intValue {
            own = "\(remote) of \(probes)"
        }
        stores.append([
            row.system, x.tasksText, x.mix, x.double("stores_per_sec", "%.0f"),
            x.percentiles("store_latency_ns", [\.p50, \.p99, \.p999]),
            x.double("redis_store_usec_per_store", "%.1f"), commands.isEmpty ? "-" : commands,
            x.double("redis_cpu_us_per_op", "%.2f"),
            own, x.millis("invalidation_lag_ns"), x.double("recovery_seconds", "%.2f"),
        ])
    }
    var stages = Table(
        """
        Where a change's time goes from the caller (means, µs): its latency; per round trip the time queued (until the \
        connection's event loop handed it to the socket), at the server (until the loop decoded the reply: network, \
        Redis's queue and execution) and resuming (until the awaiting task ran again); and the rest, outside the round \
        trips (the system's own work and hops)
        """,
        ["system", "tasks", "mix", "change", "mean", "round trips", "queued", "server", "resumed", "outside"])
    for row in rows {
        let x = FleetRowView(row)
        for (change, cause, latency) in [("set", "set", "store_latency_mean_ns"), ("removal", "removal", "remove_latency_mean_ns")] {
            guard let mean = row.extra[latency]?.numberValue, mean > 0,
                let trips = row.extra["redis_round_trips_per_\(cause)"]?.numberValue,
                let per = row.extra["redis_stage_us_per_round_trip_\(cause)"]?.objectValue
            else { continue }
            let (queued, server, resumed) = (per["queued"]?.numberValue ?? 0, per["server"]?.numberValue ?? 0, per["resumed"]?.numberValue ?? 0)
            let outside = mean / 1e3 - trips * (queued + server + resumed)
            stages.append([
                row.system, x.tasksText, x.mix, change, String(format: "%.0f", mean / 1e3), String(format: "%.2f", trips),
                String(format: "%.0f", queued), String(format: "%.0f", server), String(format: "%.0f", resumed),
                String(format: "%.0f", outside),
            ])
        }
    }
    let shown = FleetRedisStats.shownCommands
    var commands = Table(
        "Redis per command over the window: µs per call (calls/s); a script's inner commands are also counted under their own names",
        ["system", "tasks", "mix"] + shown)
    for row in rows {
        guard let table = row.extra["redis_commands"]?.objectValue else { continue }
        commands.append(
            [row.system, FleetRowView(row).tasksText, FleetRowView(row).mix]
                + shown.map { name in
                    let command = table[name]?.objectValue
                    guard let calls = command?["calls"]?.intValue, let per = command?["usec_per_call"]?.numberValue else { return "-" }
                    return String(format: "%.1f (%.0f/s)", per, Double(calls) / max(row.seconds, 1e-9))
                })
    }
    var costs = Table(
        """
        What an operation costs: CPU µs per operation of the worker processes (getrusage over the window: the system's \
        threads and the driver's) and of the private Redis; Redis round trips per set, removal and read as the workers' \
        clients counted them (commands where a round trip carried more), and the systems' own background round trips
        """,
        [
            "system", "tasks", "mix", "workers CPU µs/op", "Redis CPU µs/op", "round trips/set", "round trips/removal",
            "round trips/read", "background round trips/s", "key lock waits",
        ])
    for row in rows {
        let x = FleetRowView(row)
        costs.append([
            row.system, x.tasksText, x.mix, x.double("worker_cpu_us_per_op", "%.2f"), x.double("redis_cpu_us_per_op", "%.2f"),
            x.roundTrips("set"), x.roundTrips("removal"), x.roundTrips("read"),
            x.double("redis_background_round_trips_per_sec", "%.0f"), x.int("key_lock_waits"),
        ])
    }
    var tables = [reads, stores, costs]
    if !stages.isEmpty { tables.append(stages) }
    if !commands.isEmpty { tables.append(commands) }

    let paused = rows.filter { $0.extra["pause_seconds"] != nil }
    if !paused.isEmpty {
        let seconds = paused[0].extra["pause_seconds"]?.numberValue.map { String(format: " %.1f s", $0) } ?? ""
        var pauses = Table(
            """
            Redis paused (SIGSTOP\(seconds)) and running: callers' reads, memory hits (systems that tell them) and stores that
            overlapped the pause, beside those while Redis ran (killed excluded), p50/p99/max µs
            """,
            [
                "system", "tasks", "mix", "reads running", "reads paused", "hits running", "hits paused", "stores running",
                "stores paused",
            ])
        for row in paused {
            let x = FleetRowView(row)
            pauses.append([
                row.system, x.tasksText, x.mix, x.percentiles("read_latency_running_ns"),
                x.percentiles("read_latency_paused_ns"),
                x.percentiles("hit_latency_running_ns"), x.percentiles("hit_latency_paused_ns"),
                x.percentiles("store_latency_running_ns"), x.percentiles("store_latency_paused_ns"),
            ])
        }
        tables.append(pauses)
    }

    let windowed = rows.filter { $0.extra["fault_windows"] != nil }
    if !windowed.isEmpty {
        let kinds = FaultTimeline.Kind.allCases.map(\.rawValue) + ["outside"]
        var table = Table(
            "Faults: stale reads past the bound / resurrected / caller errors, per window (a fault's start to 2 s after its end)",
            ["system", "tasks", "mix", "drops applied", "subscribers killed", "keys evicted"] + kinds)
        for row in windowed {
            let x = FleetRowView(row)
            guard let windows = row.extra["fault_windows"]?.objectValue else { continue }
            table.append(
                [
                    row.system, x.tasksText, x.mix, x.double("drop_messages_applied", "%.3f"), x.int("pubsub_clients_killed"),
                    x.int("keys_evicted"),
                ]
                    + kinds.map { kind in
                        guard let window = windows[kind]?.objectValue else { return "-" }
                        return ["stale_beyond_bound", "resurrected", "caller_errors"].map { window[$0]?.intValue.map(String.init) ?? "-" }
                            .joined(separator: " / ")
                    })
        }
        tables.append(table)
    }
    if let single = results.first(where: { $0.extra["single_flight"] != nil }),
        let perLease = single.extra["loader_runs_per_lease"]?.numberValue
    {
        tables[tables.count - 1].notes.append(String(format: "single flight: %@ callers, loader runs per lease %.2f", "\(single.operations)", perLease))
    }
    return tables
}

/// A row's `extra`, formatted.
private struct FleetRowView {
    let row: BenchResult

    init(_ row: BenchResult) { self.row = row }

    var tasks: Int { row.extra["tasks"]?.intValue ?? 0 }
    var tasksText: String { tasks > 0 ? "\(tasks)" : "threads" }
    var mix: String { FleetMix.label(of: row) }

    /// Round trips per operation of a kind (`set`, `removal`, `read`), with the commands when more.
    func roundTrips(_ kind: String) -> String {
        guard let trips = row.extra["redis_round_trips_per_\(kind)"]?.numberValue else { return "-" }
        let text = String(format: "%.2f", trips)
        guard let commands = row.extra["redis_commands_per_\(kind)"]?.numberValue, commands > trips + 0.005 else { return text }
        return text + String(format: " (%.2f commands)", commands)
    }

    func int(_ key: String) -> String { row.extra[key]?.intValue.map(String.init) ?? "-" }

    func double(_ key: String, _ format: String) -> String { row.extra[key]?.numberValue.map { String(format: format, $0) } ?? "-" }

    /// Percentiles (ns) as µs: p50/p99/max unless `fields` says otherwise.
    func percentiles(_ key: String, _ fields: [KeyPath<Percentiles, UInt64>] = [\.p50, \.p99, \.max]) -> String {
        guard let percentiles = Percentiles(row.extra[key]) else { return "-" }
        return fields.map { micros(percentiles[keyPath: $0]) }.joined(separator: "/")
    }

    /// Percentiles (ns) as ms: p50/p99/p999.
    func millis(_ key: String) -> String {
        guard let p = Percentiles(row.extra[key]) else { return "n/a" }
        return String(format: "%.2f/%.2f/%.2f", Double(p.p50) / 1e6, Double(p.p99) / 1e6, Double(p.p999) / 1e6)
    }
}
