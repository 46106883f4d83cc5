import ArgumentParser
import Foundation
import Magpie

/// `magpie-bench sweep`: tuning curves from the scenarios, one parameter varied at a time — memory hit
/// ratio vs budget, memory throughput vs shard count, disk compression ratio and speed vs zstd level.
struct Sweep: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Tuning curves: hit ratio vs memory budget, miss ratio vs budget on a trace (Magpie and reference policies), throughput vs shards, compression and speed vs zstd level.",
        discussion: """
            Each point is one run of the memory or disk scenario (same workload and seeds as `magpie-bench \
            memory` and `disk`, shorter by default) with one parameter changed. The policy curve replays a trace \
            (--trace, or a `trace-gen` trace of --trace-requests requests made for the run) through Magpie's \
            tiers and the reference policies at each budget, as `magpie-bench replay` does; `magpie-bench report \
            --baseline` draws another build's curves beside them. `--json` writes every row, tagged with the \
            curve and the point, and the options that reproduce it.
            """)

    enum Curve: String, ExpressibleByArgument, CaseIterable { case budget, policy, shards, level }

    @Option(parsing: .upToNextOption, help: "Curves to draw.") var curves: [Curve] = Curve.allCases
    @Option(parsing: .upToNextOption, help: "Memory budgets, in % of the working set (budget curve).")
    var budgetPercents: [Double] = [1, 2, 5, 10, 20, 40]
    @Option(parsing: .upToNextOption, help: "Shard counts, powers of two (shards curve).") var shardCounts = [1, 2, 4, 8, 16, 64]
    @Option(parsing: .upToNextOption, help: "Thread counts for the shards curve.") var threads = [1, 2]
    @Option(parsing: .upToNextOption, help: "zstd levels; 0 stores raw (level curve).") var levels = [0, 1, 3, 6, 9]
    @Option(help: "Distinct keys of the memory scenario.") var keys = 200_000
    @Option(help: "Timed operations per thread of each memory point (and as many warm-up operations).")
    var ops = 500_000
    @Option(help: "Keys written per disk point (4 KiB values, half JSON-like).") var diskKeys = 20_000
    @Option(help: "Trace for the policy curve (any format `replay` reads); default: a trace-gen trace made for the run.")
    var trace: String?
    @Option(help: "Requests of the trace made for the policy curve when --trace is not given.") var traceRequests = 400_000
    @Option(parsing: .upToNextOption, help: "Budgets of the policy curve, in % of the trace's working set.")
    var traceBudgets: [Double] = [1, 2, 5, 10, 20, 40]
    @Option(parsing: .upToNextOption, help: "Magpie tiers the policy curve replays: memory, disk, both.")
    var tiers: [Replay.TierChoice] = [.memory]
    @OptionGroup var outputOptions: OutputOptions

    func validate() throws {
        guard budgetPercents.allSatisfy({ $0 > 0 }), traceBudgets.allSatisfy({ $0 > 0 }), keys > 0, ops > 0, diskKeys > 0,
            traceRequests > 0
        else {
            throw ValidationError("budgets, --keys, --ops, --disk-keys and --trace-requests must be positive")
        }
        for s in shardCounts where s < 1 || s > MemoryTier.maximumShardCount || s & (s - 1) != 0 {
            throw ValidationError("shard count \(s) must be a power of two from 1 to \(MemoryTier.maximumShardCount)")
        }
        for level in levels where level < 0 || level > 22 { throw ValidationError("zstd level \(level) must be 0...22") }
    }

    func run() throws {
        let (results, tables) = try measure()
        for table in tables { table.print() }
        if let json = outputOptions.json {
            try Report(date: timestamp(), machine: .current(), config: ["sweep": .object(config)], results: results)
                .write(to: json)
        }
    }

    var config: [String: JSONValue] {
        [
            "curves": .array(curves.map { .string($0.rawValue) }),
            "budget_percents": .array(budgetPercents.map { .double($0) }),
            "shard_counts": .array(shardCounts.map { .int($0) }), "threads": .array(threads.map { .int($0) }),
            "levels": .array(levels.map { .int($0) }), "keys": .int(keys), "ops": .int(ops), "disk_keys": .int(diskKeys),
            "trace": trace.map { .string($0) } ?? .string("trace-gen --requests \(traceRequests) --objects \(traceRequests / 10)"),
            "trace_budgets": .array(traceBudgets.map { .double($0) }), "tiers": .array(tiers.map { .string($0.rawValue) }),
        ]
    }

    /// Runs every point of the chosen curves: the rows (tagged) and a table per curve.
    func measure() throws -> ([BenchResult], [Table]) {
        var results: [BenchResult] = []
        var tables: [Table] = []
        let memoryBase = [
            "--keys", "\(keys)", "--ops", "\(ops)", "--warmup", "\(ops)", "--systems", "magpie", "--workloads", "zipf", "--repetitions", "1",
        ]
        if curves.contains(.budget) {
            var rows = Table(
                "Hit ratio vs memory budget (magpie, 1 thread, Zipf 0.99, \(keys) keys)",
                ["budget %", "budget B", "hit ratio", "ops/s", "p50 ns", "p99 ns"])
            for percent in budgetPercents {
                let options = try MemoryOptions.parse(memoryBase + ["--budget-percent", "\(percent)", "--threads", "1"])
                progressLine("sweep budget: \(percent) %")
                for var r in try MemoryScenario(options: options).run(progress: { _ in }) {
                    rows.append([
                        String(format: "%g", percent), String(options.effectiveBudget), String(format: "%.4f", r.hit_ratio),
                        formatRate(r.ops_per_sec), String(r.latency_ns.p50), String(r.latency_ns.p99),
                    ])
                    tag(&r, "budget_percent", .double(percent))
                    results.append(r)
                }
            }
            tables.append(rows)
        }
        if curves.contains(.policy) {
            var (rows, points) = try policyCurve()
            rows.title = "Miss ratio vs budget on \(trace.map { URL(fileURLWithPath: $0).lastPathComponent } ?? "a trace-gen trace")"
            tables.append(rows)
            results += points
        }
        if curves.contains(.shards) {
            var rows = Table("Throughput vs shard count (magpie, 10 % budget)", ["shards", "threads", "ops/s", "p99 ns", "hit ratio"])
            for shards in shardCounts {
                let options = try MemoryOptions.parse(
                    memoryBase + ["--shards", "\(shards)", "--threads"] + threads.map(String.init))
                progressLine("sweep shards: \(shards)")
                for var r in try MemoryScenario(options: options).run(progress: { _ in }) {
                    rows.append([
                        String(shards), String(r.threads), formatRate(r.ops_per_sec), String(r.latency_ns.p99),
                        String(format: "%.4f", r.hit_ratio),
                    ])
                    tag(&r, "shards", .int(shards))
                    results.append(r)
                }
            }
            tables.append(rows)
        }
        if curves.contains(.level) {
            var rows = Table(
                "Disk compression and speed vs zstd level (\(diskKeys) × 4 KiB, page-cache hot)",
                ["level", "compression ratio", "set ops/s", "set p50 ns", "get ops/s", "get p50 ns"])
            for level in levels {
                let options = try DiskOptions.parse([
                    "--keys", "\(diskKeys)", "--gets", "\(diskKeys * 4)", "--level", "\(level)", "--systems", "magpie",
                    "--workloads", "plain",
                ])
                progressLine("sweep level: \(level)")
                var points = try DiskScenario(options: options).run(progress: { _ in })
                guard let set = points.first(where: { $0.scenario == "disk-set" }),
                    let get = points.first(where: { $0.scenario == "disk-get" })
                else { continue }
                rows.append([
                    String(level), String(format: "%.3f", set.extra["compression_ratio"]?.numberValue ?? 1), formatRate(set.ops_per_sec), String(set.latency_ns.p50),
                    formatRate(get.ops_per_sec), String(get.latency_ns.p50),
                ])
                for index in points.indices { tag(&points[index], "zstd_level", .int(level)) }
                results += points
            }
            tables.append(rows)
        }
        return (results, tables)
    }

    /// Replays the trace through each chosen tier (the reference policies with the first) at every
    /// budget: the table (a column per budget) and the rows, tagged with the budget.
    func policyCurve() throws -> (Table, [BenchResult]) {
        var path = trace
        var made: String?
        if path == nil {
            // Named after what it holds (trace-gen is seeded), so that the rows of two runs, say two builds'
            // suites, name the same trace and `report --baseline` draws them in one chart.
            let folder = NSTemporaryDirectory() + "/magpie-sweep-\(getpid())-\(nowNanoseconds())"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let file = folder + "/trace-gen-\(traceRequests).csv"
            progressLine("sweep policy: writing a trace-gen trace of \(traceRequests) requests")
            try TraceGen.parse(["--requests", "\(traceRequests)", "--objects", "\(max(1, traceRequests / 10))", "-o", file]).run()
            (path, made) = (file, folder)
        }
        defer { if let made { try? FileManager.default.removeItem(atPath: made) } }
        var points: [BenchResult] = []
        for (n, tier) in tiers.enumerated() {
            var replay = try Replay.parse([path!, "--tier", tier.rawValue, "--budget"] + traceBudgets.map { "\($0)%" })
            if n > 0 { replay.references = [] }  // once is enough
            progressLine("sweep policy: magpie-\(tier.rawValue)")
            let (results, _, _) = try replay.measure()
            for var r in results {
                guard let percent = Double(r.scenario.dropFirst("replay ".count).dropLast()) else { continue }
                tag(&r, "trace_budget_percent", .double(percent))
                points.append(r)
            }
        }
        var rows = Table(nil, ["system"] + traceBudgets.map { String(format: "%g %%", $0) })
        for system in distinct(points.map(\.system)) {
            rows.append([system] + traceBudgets.map { percent in
                points.first { $0.system == system && $0.extra["sweep_value"]?.numberValue == percent }
                    .map { String(format: "%.4f", 1 - $0.hit_ratio) } ?? "-"
            })
        }
        return (rows, points)
    }

    /// Marks a row with the curve's parameter and its value at this point.
    func tag(_ result: inout BenchResult, _ parameter: String, _ value: JSONValue) {
        result.extra["sweep_parameter"] = .string(parameter)
        result.extra["sweep_value"] = value
    }
}
