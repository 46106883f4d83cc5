import ArgumentParser
import Foundation
import MagpieRedis
import MagpieTestSupport

/// Options of `magpie-bench fleet`.
struct FleetOptions: ParsableArguments {
    @Option(help: "Worker processes (cache instances).") var workers = 4
    @Option(help: "Caller threads per worker (with --tasks 0).") var threads = 2
    @Option(parsing: .upToNextOption, help: "Async caller tasks per worker, a row per value and system (0: the --threads caller threads).")
    var tasks = [1, 16, 256]
    @Option(help: "Seconds per system, measured.") var seconds = 10
    @Option(help: "Seconds of the same workload before the measurement (not counted): caches fill.") var warmupSeconds = 3.0
    @Option(help: "Distinct keys (Zipf ranks).") var keys = 20_000
    @Option(help: "Zipf exponent of the reads.") var zipf = 0.99
    @Option(help: "Value size in bytes.") var valueSize = 256
    @Option(help: "Share of operations that are sets (a new version, written through).") var setShare = 0.02
    @Option(help: "Share of operations that are removals (a new version in the origin, the cached value removed).")
    var removeShare = 0.01
    @Option(help: "Simulated origin work per miss, µs.") var originUs = 100
    @Option(help: "Magpie's maxDisconnectedStaleness, ms: the documented bound stale reads are judged against.")
    var boundMs = 1000
    @Option(help: "One invalidation-lag probe (a set) every this many µs, across the fleet.") var probeIntervalUs = 2000
    @Option(help: "Concurrent callers per worker in the single-flight phase (0: skip it).") var singleFlightCallers = 100
    @Option(help: "A Redis URL to use instead of a private redis-server (not with --fault).") var url: String?
    @Flag(help: "Kill Redis (2 s down, then restarted) and later pause it (1.5 s, SIGSTOP) during each run; the pause rows.")
    var fault = false
    @Option(parsing: .upToNextOption, help: "Systems to run.") var systems = ["magpie-fleet", "redis-cache-aside", "local-uncoherent"]

    func validate() throws {
        guard workers >= 2, threads >= 1, seconds >= 2, keys >= 1, valueSize >= 32 else {
            throw ValidationError("need --workers ≥ 2, --threads ≥ 1, --seconds ≥ 2, --keys ≥ 1, --value-size ≥ 32")
        }
        guard !tasks.isEmpty, tasks.allSatisfy({ $0 >= 0 && $0 <= 4096 }) else { throw ValidationError("--tasks: 0…4096 each") }
        guard setShare >= 0, removeShare >= 0, setShare + removeShare <= 1 else { throw ValidationError("bad shares") }
        if fault && url != nil { throw ValidationError("--fault needs the private redis-server (it kills and pauses it)") }
        // The fault timeline: killed at 30 % of the run for 2 s, paused at 65 % for 1.5 s; from 10 s on,
        // the run has the 2 s the recovery bar allows after the pause (the workers report their feeds only
        // until its end: a shorter run reports a slower recovery as none).
        if fault && seconds < 10 {
            throw ValidationError(
                "--fault needs --seconds ≥ 10 (Redis killed at 30 % for 2 s, paused at 65 % for 1.5 s, then 2 s)")
        }
        let known = Set(["magpie-fleet", "redis-cache-aside", "local-uncoherent"])
        for s in systems where !known.contains(s) { throw ValidationError("unknown system \(s); known: \(known.sorted())") }
    }

    var probes: Int { max(1, seconds * 1_000_000 / max(1, probeIntervalUs)) }

    var config: [String: JSONValue] {
        [
            "scenario": .string(fault ? "fleet-fault" : "fleet"), "workers": .int(workers), "threads": .int(threads), "tasks": .array(tasks.map { .int($0) }),
            "seconds": .int(seconds), "warmup_seconds": .double(warmupSeconds), "keys": .int(keys), "zipf": .double(zipf), "value_size": .int(valueSize),
            "set_share": .double(setShare), "remove_share": .double(removeShare), "origin_us": .int(originUs),
            "bound_ms": .int(boundMs), "probe_interval_us": .int(probeIntervalUs),
            "single_flight_callers": .int(singleFlightCallers), "fault": .bool(fault),
            "server": .string(url.map(RedisBenchOptions.redacted) ?? (fault ? "private redis-server (appendonly yes, appendfsync always)" : "private redis-server (no persistence)")),
            "systems": .array(systems.map { .string($0) }),
        ]
    }
}

/// `magpie-bench fleet`: N cache instances in N processes sharing one Redis.
struct FleetBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet",
        abstract:
            "Worker processes sharing a Redis: Magpie's fleet tier against plain cache-aside on Redis and uncoherent local caches, in one run (invalidation lag, stale reads, outage behaviour with --fault).")

    @OptionGroup var options: FleetOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() async throws {
        let results = try await FleetScenario(options: options).run(progress: progressLine)
        printFleetSummary(results)
        if let json = outputOptions.json {
            let report = Report(date: timestamp(), machine: .current(), config: ["fleet": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}

func printFleetSummary(_ results: [BenchResult]) {
    let rows = results.filter { $0.scenario == "fleet" || $0.scenario == "fleet-fault" }
    guard !rows.isEmpty else { return }
    print("\nFleet (\(rows[0].scenario)): ops/s summed over the workers; lag from a set returning to every other instance dropping the key")
    var table = [["system", "tasks", "ops/s", "× aside", "read p50 µs", "read p99 µs", "hit ratio", "origin calls", "lag p50/p99/p999 ms",
                  "stale > bound", "caller errors", "resurrected", "recovery s"]]
    var aside: [Int: Double] = [:]
    var pauses: [[String]] = [["system", "tasks", "hit p50/p99/max µs running", "hit p50/p99/max µs paused",
                               "store p50/p99/max µs running", "store p50/p99/max µs paused", "caller errors", "stale > bound",
                               "resurrected"]]
    for row in rows where row.system == "redis-cache-aside" {
        if case .int(let tasks)? = row.extra["tasks"] { aside[tasks] = row.ops_per_sec }
    }
    for row in rows where row.extra["single_flight"] == nil {
        func int(_ key: String) -> String {
            if case .int(let v)? = row.extra[key] { return "\(v)" }
            return "-"
        }
        var lag = "n/a"
        if case .object(let l)? = row.extra["invalidation_lag_ns"], case .int(let p50)? = l["p50"], case .int(let p99)? = l["p99"],
            case .int(let p999)? = l["p999"]
        {
            lag = String(format: "%.2f/%.2f/%.2f", Double(p50) / 1e6, Double(p99) / 1e6, Double(p999) / 1e6)
        }
        var recovery = "-"
        if case .double(let r)? = row.extra["recovery_seconds"] { recovery = String(format: "%.2f", r) }
        var tasks = 0
        if case .int(let t)? = row.extra["tasks"] { tasks = t }
        var ratio = "-"
        if row.system == "magpie-fleet", let base = aside[tasks], base > 0 { ratio = String(format: "%.2f", row.ops_per_sec / base) }
        func micros(_ key: String, max withMax: Bool = false) -> String {
            guard case .object(let p)? = row.extra[key], case .int(let p50)? = p["p50"], case .int(let p99)? = p["p99"] else { return "-" }
            var text = String(format: "%.1f/%.1f", Double(p50) / 1000, Double(p99) / 1000)
            if withMax, case .int(let top)? = p["max"] { text += String(format: "/%.1f", Double(top) / 1000) }
            return text
        }
        if row.extra["pause_seconds"] != nil {
            pauses.append([
                row.system, tasks > 0 ? "\(tasks)" : "threads",
                micros("hit_latency_running_ns", max: true), micros("hit_latency_paused_ns", max: true),
                micros("store_latency_running_ns", max: true), micros("store_latency_paused_ns", max: true),
                int("pause_caller_errors"), int("pause_stale_beyond_bound"), int("pause_resurrected"),
            ])
        }
        table.append([
            row.system, tasks > 0 ? "\(tasks)" : "threads", String(format: "%.0f", row.ops_per_sec), ratio,
            String(format: "%.1f", Double(row.latency_ns.p50) / 1000),
            String(format: "%.1f", Double(row.latency_ns.p99) / 1000), String(format: "%.3f", row.hit_ratio), int("origin_calls"),
            lag, int("stale_reads_beyond_bound"), int("caller_errors"), int("resurrected_removals"), recovery,
        ])
    }
    printAligned(table)
    if pauses.count > 1 {
        var seconds = ""
        if let row = rows.first(where: { $0.extra["pause_seconds"] != nil }), case .double(let s)? = row.extra["pause_seconds"] {
            seconds = String(format: " %.1f s", s)
        }
        print("\nRedis paused (SIGSTOP\(seconds)) and running: callers' memory hits and stores (sets) that overlapped")
        print("the pause, beside those while Redis ran (killed excluded); caller errors, stale and resurrected reads")
        print("from the SIGSTOP to 2 s after it")
        printAligned(pauses)
    }
    if let single = rows.first(where: { $0.extra["single_flight"] != nil }), case .double(let perLease)? = single.extra["loader_runs_per_lease"] {
        print(String(format: "single flight: %@ callers, loader runs per lease %.2f", "\(single.operations)", perLease))
    }
}
