import Foundation

// BENCHMARKS.md's sections on Redis, the fleet and the example service, and the tuning curves.
extension BenchmarksPage {
    static func redis(_ report: Report) -> String {
        guard let tables = redisTables(rows(report)) else { return "" }
        var parts: [String] = []
        if let rows = tables.rows { parts.append(rows.markdown) }
        parts.append(
            "The bars: magpie-redis over redis-benchmark per round, and the verdict on the median over the rounds:\n\n"
                + tables.bars.markdown)
        return section(
            "The Redis client", report, command: command(report, "redis"),
            """
            `MagpieRedis`'s client and `redis-benchmark` against one private redis-server, the same keys and 100-byte \
            values: single GETs and SETs (one caller, one command at a time) and pipelined batches, with callers on \
            Swift's global executor ("task") and on the connection's event loop; then calls failed fast by an open \
            circuit breaker.
            """, parts)
    }

    static func fleet(_ report: Report) -> String {
        let fleet = rows(report).filter {
            ($0.scenario == "fleet" || $0.scenario == "fleet-fault") && $0.extra["single_flight"] == nil
        }
        guard !fleet.isEmpty else { return "" }
        func int(_ r: BenchResult, _ key: String) -> String { r.extra[key]?.intValue.map(String.init) ?? "-" }
        struct Run: Hashable {
            var tasks: Int
            var mix: FleetMix
        }
        func run(_ r: BenchResult) -> Run { Run(tasks: r.extra["tasks"]?.intValue ?? 0, mix: FleetMix(of: r)) }
        var aside: [Run: Double] = [:]
        for r in fleet where r.system == "redis-cache-aside" { aside[run(r)] = r.ops_per_sec }
        var table = Table(nil, [
            "system", "tasks", "mix", "ops/s", "× cache-aside", "read p50 / p99 µs", "hit ratio", "lag p50 / p99 / p99.9 ms",
            "CPU µs/op (workers + Redis)", "round trips per set / removal", "stale past the bound", "caller errors",
        ])
        for r in fleet {
            let tasks = run(r).tasks
            let lag = Percentiles(r.extra["invalidation_lag_ns"]).map {
                String(format: "%.2f / %.2f / %.2f", Double($0.p50) / 1e6, Double($0.p99) / 1e6, Double($0.p999) / 1e6)
            } ?? "-"
            let ratio =
                r.system == "magpie-fleet"
                ? aside[run(r)].map { String(format: "%.2f", r.ops_per_sec / $0) } ?? "-" : "-"
            func number(_ key: String) -> String { r.extra[key]?.numberValue.map { String(format: "%.2f", $0) } ?? "-" }
            table.append([
                r.system, tasks > 0 ? String(tasks) : "threads", FleetMix.label(of: r), formatRate(r.ops_per_sec), ratio,
                String(format: "%.1f / %.1f", Double(r.latency_ns.p50) / 1000, Double(r.latency_ns.p99) / 1000),
                String(format: "%.3f", r.hit_ratio), lag, "\(number("worker_cpu_us_per_op")) + \(number("redis_cpu_us_per_op"))",
                "\(number("redis_round_trips_per_set")) / \(number("redis_round_trips_per_removal"))",
                int(r, "stale_reads_beyond_bound"), int(r, "caller_errors"),
            ])
        }
        var notes = ""
        if let single = rows(report).first(where: { $0.extra["single_flight"] != nil }),
            let perLease = single.extra["loader_runs_per_lease"]?.numberValue
        {
            notes = String(
                format: "Single flight across the fleet: %d callers, %.2f loader runs per lease.\n", single.operations,
                perLease)
        }
        var workload = "Worker processes, each a `Cache`, share one private redis-server"
        if case .object(let config) = report.config["fleet"] {
            let changes =
                (config["set_share"]?.numberValue ?? 0) + (config["remove_share"]?.numberValue ?? 0)
            workload = String(
                format:
                    "%@ worker processes, each a `Cache`, share one private redis-server: Zipf %@ reads of %@ keys, %.0f %% of operations change a key",
                config["workers"]?.intValue.map(String.init) ?? "Several",
                config["zipf"]?.numberValue.map { String(format: "%g", $0) } ?? "-",
                config["keys"]?.intValue.map(String.init) ?? "-", 100 * changes)
            if fleet.contains(where: { FleetMix(of: $0) != .standard }) {
                workload += " in the default mix (the mix column: no changes, or as many changes, all removals)"
            }
        }
        return section(
            "A fleet on the remote tier", report, command: command(report, "fleet"),
            workload + """
                . `magpie-fleet` is Magpie's remote tier through `cache.async`; `redis-cache-aside` reads Redis first and \
                the origin on a miss, from the same tasks; `local-uncoherent` keeps local copies no one invalidates. Lag: \
                from a store returning to every other instance dropping its copy; a stale read is judged against a \
                shared record of every write.
                """, [table.markdown, notes])
    }

    static func remoteAsync(_ report: Report) -> String {
        let rows = rows(report).filter { $0.scenario == "fleet-async" }
        guard !rows.isEmpty else { return "" }
        var table = Table(nil, ["workload", "tasks", "system", "ops/s", "p50 µs", "p99 µs", "found", "Magpie / plain"])
        var baseline: [String: Double] = [:]
        for r in rows {
            let workload = r.extra["workload"]?.stringValue ?? "-"
            let key = "\(workload)/\(r.threads)"
            var ratio = "-"
            if r.system == "magpie-fleet", let base = baseline[key], base > 0 {
                ratio = String(format: "%.2f ×", r.ops_per_sec / base)
            }
            if r.system != "magpie-fleet" { baseline[key] = r.ops_per_sec }
            table.append([
                workload, String(r.threads), r.system, String(format: "%.0f", r.ops_per_sec),
                micros(r.latency_ns.p50), micros(r.latency_ns.p99), String(format: "%.3f", r.hit_ratio), ratio,
            ])
        }
        return section(
            "The remote tier from async tasks", report, command: command(report, "fleet-async"),
            """
            One instance with a remote tier on a private redis-server, called from 16 and 256 tasks: `cache.async` \
            stores, remote reads and memory hits, each beside the plain alternative from the same tasks (`RedisClient`'s \
            SET and GET, a cache without a remote tier).
            """, [table.markdown])
    }

    /// The example service under wrk, from the report `scripts/bench-service.sh` writes.
    static func serviceSection(_ service: Report) -> String {
        let healthy = service.results.filter { $0.scenario == "service-healthy" }
        guard !healthy.isEmpty else { return "" }
        func ms(_ ns: UInt64) -> String { String(format: "%.2f", Double(ns) / 1e6) }
        var table = Table(nil, [
            "mode", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "errors", "origin calls/s", "origin failing: req/s", "p99 ms",
            "errors", "log lines",
        ])
        for r in healthy {
            let failing = service.results.first { $0.scenario == "service-failing" && $0.system == r.system }
            func int(_ row: BenchResult?, _ key: String) -> String {
                row.flatMap { $0.extra[key]?.intValue }.map(String.init) ?? "-"
            }
            table.append([
                r.system, String(format: "%.0f", r.ops_per_sec), ms(r.latency_ns.p50), ms(r.latency_ns.p99),
                ms(r.latency_ns.p999),
                int(r, "errors"), int(r, "origin_calls_per_second"),
                failing.map { String(format: "%.0f", $0.ops_per_sec) } ?? "-",
                failing.map { ms($0.latency_ns.p99) } ?? "-", int(failing, "errors"), int(failing, "log_lines"),
            ])
        }
        var what = "The example services under wrk, origin healthy, then failing"
        if case .object(let config) = service.config["service"] {
            let n = { (key: String) in config[key]?.intValue.map(String.init) ?? "-" }
            what =
                "The example services under wrk: \(n("connections")) connections, \(n("keys")) keys read uniformly, an origin of "
                + "\(n("origin_ms")) ms a call and products fresh for \(n("fresh_seconds")) s; \(n("duration_seconds")) s healthy, "
                + "then \(n("fail_seconds")) s with the origin failing"
        }
        // The response cache beside the loader on the same endpoint, per framework.
        var ratios: [String] = []
        for (framework, prefix) in [("Hummingbird", ""), ("Vapor", "vapor-")] {
            guard let responses = healthy.first(where: { $0.system == prefix + "magpie-responses" }),
                let loader = healthy.first(where: { $0.system == prefix + "magpie-memory" }), loader.ops_per_sec > 0
            else { continue }
            ratios.append(
                String(
                    format: "- %@: the response cache %.2f × the loader's requests/s, p99 %@ against %@ ms", framework,
                    responses.ops_per_sec / loader.ops_per_sec, ms(responses.latency_ns.p99), ms(loader.latency_ns.p99)))
        }
        return section(
            "A service under load", service, command: command(service, "service") ?? "make bench-service",
            what + """
                . One product endpoint (`Examples/Catalog`) on Hummingbird (`Examples/HummingbirdService`) and on Vapor \
                (`Examples/VaporService`, the `vapor-` rows); each handler renders the product as JSON. Modes: no cache; the \
                framework's own memory cache used get-then-set (Hummingbird's `MemoryPersistDriver`, Vapor's `app.cache`); \
                Magpie behind that same interface (`magpie-persist`, `vapor-magpie-cache`); Magpie's loader with memory only, \
                memory and disk, and the remote tier (two processes, one Redis); and Magpie's HTTP response cache in front of \
                the uncached handler (`magpie-responses`: the rendered response kept whole). Errors are non-2xx responses \
                and socket errors; log lines are what the service logged while its origin failed.
                """, [table.markdown] + (ratios.isEmpty ? [] : [ratios.joined(separator: "\n") + "\n"]))
    }

    static func curves(_ report: Report) -> String {
        func points(_ parameter: String) -> [BenchResult] {
            report.results.filter { $0.extra["sweep_parameter"]?.stringValue == parameter }
        }
        var parts: [String] = []
        let budget = points("budget_percent")
        if !budget.isEmpty {
            var table = Table(nil, ["budget %", "hit ratio", "ops/s", "p50 ns", "p99 ns"])
            for r in budget {
                table.append([
                    r.extra["sweep_value"]?.numberValue.map { String(format: "%g", $0) } ?? "-",
                    String(format: "%.4f", r.hit_ratio),
                    formatRate(r.ops_per_sec), String(r.latency_ns.p50), String(r.latency_ns.p99),
                ])
            }
            parts.append(
                "Hit ratio vs memory budget (the memory tier, 1 thread, Zipf 0.99, 200,000 keys):\n\n" + table.markdown)
        }
        let policy = points("trace_budget_percent")
        if !policy.isEmpty {
            let table = missRatioTable(policy) { r in
                r.extra["sweep_value"]?.numberValue.map { String(format: "%g %%", $0) } ?? "-"
            }
            parts.append(
                "Miss ratio vs budget on a `trace-gen` trace (400,000 requests, drifting popularity and scans):\n\n"
                    + table.markdown)
        }
        let shards = points("shards")
        if !shards.isEmpty {
            var table = Table(nil, ["shards", "threads", "ops/s", "p99 ns", "hit ratio"])
            for r in shards {
                table.append([
                    r.extra["sweep_value"]?.intValue.map(String.init) ?? "-", String(r.threads),
                    formatRate(r.ops_per_sec),
                    String(r.latency_ns.p99), String(format: "%.4f", r.hit_ratio),
                ])
            }
            parts.append("Throughput vs shard count (the memory tier, budget 10 %):\n\n" + table.markdown)
        }
        guard !parts.isEmpty else { return "" }
        return section(
            "Tuning curves", report, command: command(report, "sweep"),
            "Short runs (300,000 operations per point, one pass): the shape of each curve, not its absolute rates.",
            parts)
    }
}
