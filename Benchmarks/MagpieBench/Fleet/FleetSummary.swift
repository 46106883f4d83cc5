import Foundation

// The printed tables of `magpie-bench fleet` (and of the default suite's fleet rows).

func printFleetSummary(_ results: [BenchResult]) {
    let rows = results.filter {
        ($0.scenario == "fleet" || $0.scenario == "fleet-fault") && $0.extra["single_flight"] == nil
    }
    guard !rows.isEmpty else { return }
    let view = FleetRows(rows)
    // With faults, a system whose calls fail fast while Redis is down counts those failures as operations:
    // its ops/s is no throughput, and no ratio is shown.
    let faulted = rows[0].scenario == "fleet-fault"
    print(
        "\nFleet (\(rows[0].scenario)): ops/s summed over the workers; reads timed from the caller; remote share: reads that went to Redis"
    )
    var reads = [
        [
            "system", "tasks", "ops/s", "× aside", "× pubsub", "read p50 µs", "p99 µs", "p99.9 µs", "remote share",
            "hit ratio",
            "origin calls", "stale > bound", "resurrected", "caller errors",
        ]
    ]
    for row in rows {
        let x = FleetRowView(row)
        reads.append([
            row.system, x.tasksText, String(format: "%.0f", row.ops_per_sec),
            faulted ? "-" : view.ratio(row, to: "redis-cache-aside"),
            faulted ? "-" : view.ratio(row, to: "local-pubsub"), micros(row.latency_ns.p50), micros(row.latency_ns.p99),
            micros(row.latency_ns.p999),
            x.double("remote_share", "%.3f"), String(format: "%.3f", row.hit_ratio), x.int("origin_calls"),
            x.int("stale_reads_beyond_bound"), x.int("resurrected_removals"), x.int("caller_errors"),
        ])
    }
    printAligned(reads)

    print(
        "\nStores (sets) from the caller; Redis: its commandstats and CPU over the measured window (a store: a set, removal, fill or probe write)"
    )
    var stores = [
        [
            "system", "tasks", "stores/s", "store p50/p99/p99.9 µs", "Redis µs/store", "summed", "Redis CPU µs/op",
            "own writes read remotely", "lag p50/p99/p999 ms", "recovery s",
        ]
    ]
    for row in rows {
        let x = FleetRowView(row)
        var commands = "-"
        if case .array(let names)? = row.extra["redis_store_commands"] {
            commands = names.compactMap { if case .string(let s) = $0 { s } else { nil } }.joined(separator: "+")
        }
        var own = "-"
        if case .int(let probes)? = row.extra["own_write_probes"], probes > 0,
            case .int(let remote)? = row.extra["own_write_probes_not_local"]
        {
            own = "\(remote) of \(probes)"
        }
        stores.append([
            row.system, x.tasksText, x.double("stores_per_sec", "%.0f"),
            x.percentiles("store_latency_ns", [\.p50, \.p99, \.p999]),
            x.double("redis_store_usec_per_store", "%.1f"), commands.isEmpty ? "-" : commands,
            x.double("redis_cpu_us_per_op", "%.2f"),
            own, x.millis("invalidation_lag_ns"), x.double("recovery_seconds", "%.2f"),
        ])
    }
    printAligned(stores)

    print(
        "\nRedis per command over the window: µs per call (calls/s); a script's inner commands are also counted under their own names"
    )
    let shown = FleetRedisStats.shownCommands
    var commands = [["system", "tasks"] + shown]
    for row in rows {
        let x = FleetRowView(row)
        guard case .object(let table)? = row.extra["redis_commands"] else { continue }
        commands.append(
            [row.system, x.tasksText]
                + shown.map { name in
                    guard case .object(let c)? = table[name], case .int(let calls)? = c["calls"],
                        case .double(let per)? = c["usec_per_call"]
                    else { return "-" }
                    return String(format: "%.1f (%.0f/s)", per, Double(calls) / max(row.seconds, 1e-9))
                })
    }
    if commands.count > 1 { printAligned(commands) }

    let paused = rows.filter { $0.extra["pause_seconds"] != nil }
    if !paused.isEmpty {
        var seconds = ""
        if case .double(let s)? = paused[0].extra["pause_seconds"] { seconds = String(format: " %.1f s", s) }
        print(
            "\nRedis paused (SIGSTOP\(seconds)) and running: callers' reads, memory hits (systems that tell them) and stores that"
        )
        print("overlapped the pause, beside those while Redis ran (killed excluded), p50/p99/max µs")
        var pauses = [
            [
                "system", "tasks", "reads running", "reads paused", "hits running", "hits paused", "stores running",
                "stores paused",
            ]
        ]
        for row in paused {
            let x = FleetRowView(row)
            pauses.append([
                row.system, x.tasksText, x.percentiles("read_latency_running_ns"),
                x.percentiles("read_latency_paused_ns"),
                x.percentiles("hit_latency_running_ns"), x.percentiles("hit_latency_paused_ns"),
                x.percentiles("store_latency_running_ns"), x.percentiles("store_latency_paused_ns"),
            ])
        }
        printAligned(pauses)
    }

    let windowed = rows.filter { $0.extra["fault_windows"] != nil }
    if !windowed.isEmpty {
        print(
            "\nFaults: stale reads past the bound / resurrected / caller errors, per window (a fault's start to 2 s after its end)"
        )
        let kinds = FaultTimeline.Kind.allCases.map(\.rawValue) + ["outside"]
        var table = [["system", "tasks", "drops applied", "subscribers killed"] + kinds]
        for row in windowed {
            let x = FleetRowView(row)
            guard case .object(let windows)? = row.extra["fault_windows"] else { continue }
            table.append(
                [row.system, x.tasksText, x.double("drop_messages_applied", "%.3f"), x.int("pubsub_clients_killed")]
                    + kinds.map { kind in
                        guard case .object(let w)? = windows[kind] else { return "-" }
                        func n(_ key: String) -> String { if case .int(let v)? = w[key] { "\(v)" } else { "-" } }
                        return "\(n("stale_beyond_bound")) / \(n("resurrected")) / \(n("caller_errors"))"
                    })
        }
        printAligned(table)
    }
    if let single = results.first(where: { $0.extra["single_flight"] != nil }),
        case .double(let perLease)? = single.extra["loader_runs_per_lease"]
    {
        print(String(format: "single flight: %@ callers, loader runs per lease %.2f", "\(single.operations)", perLease))
    }
}

private func micros(_ ns: UInt64) -> String { String(format: "%.1f", Double(ns) / 1000) }

/// The rows' ratios: a row's ops/s over another system's at the same tasks.
private struct FleetRows {
    let rows: [BenchResult]

    init(_ rows: [BenchResult]) { self.rows = rows }

    /// Magpie's row over `baseline`'s at the same tasks value; "-" for the other rows.
    func ratio(_ row: BenchResult, to baseline: String) -> String {
        guard row.system == "magpie-fleet" else { return "-" }
        let tasks = FleetRowView(row).tasks
        guard let base = rows.first(where: { $0.system == baseline && FleetRowView($0).tasks == tasks }),
            base.ops_per_sec > 0
        else {
            return "-"
        }
        return String(format: "%.2f", row.ops_per_sec / base.ops_per_sec)
    }
}

/// A row's `extra`, formatted.
private struct FleetRowView {
    let row: BenchResult

    init(_ row: BenchResult) { self.row = row }

    var tasks: Int { if case .int(let t)? = row.extra["tasks"] { t } else { 0 } }
    var tasksText: String { tasks > 0 ? "\(tasks)" : "threads" }

    func int(_ key: String) -> String {
        if case .int(let v)? = row.extra[key] { return "\(v)" }
        return "-"
    }

    func double(_ key: String, _ format: String) -> String {
        switch row.extra[key] {
        case .double(let v)?: return String(format: format, v)
        case .int(let v)?: return String(format: format, Double(v))
        default: return "-"
        }
    }

    /// Percentiles (ns) as µs: p50/p99/max unless `fields` says otherwise.
    func percentiles(_ key: String, _ fields: [KeyPath<Percentiles, UInt64>] = [\.p50, \.p99, \.max]) -> String {
        guard case .object(let p)? = row.extra[key] else { return "-" }
        func value(_ name: String) -> UInt64? { if case .int(let v)? = p[name] { UInt64(v) } else { nil } }
        guard let p50 = value("p50"), let p90 = value("p90"), let p99 = value("p99"), let p999 = value("p999"),
            let top = value("max")
        else { return "-" }
        let percentiles = Percentiles(p50: p50, p90: p90, p99: p99, p999: p999, max: top)
        return fields.map { micros(percentiles[keyPath: $0]) }.joined(separator: "/")
    }

    /// Percentiles (ns) as ms: p50/p99/p999.
    func millis(_ key: String) -> String {
        guard case .object(let p)? = row.extra[key], case .int(let p50)? = p["p50"], case .int(let p99)? = p["p99"],
            case .int(let p999)? = p["p999"]
        else { return "n/a" }
        return String(format: "%.2f/%.2f/%.2f", Double(p50) / 1e6, Double(p99) / 1e6, Double(p999) / 1e6)
    }
}
