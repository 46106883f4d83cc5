import Foundation

/// "Magpie at a glance": the headline comparisons of one suite run (and of one `make bench-service` run),
/// each Magpie beside the system a user would pick instead, measured in the same invocation, with the
/// ratio between the two. README.md and BENCHMARKS.md show the same rows (`report --markdown`).
///
/// A row is left out when its run lacks the rows it needs (a peer that did not build, a scenario that
/// did not run); a ratio is always of two figures of one run, never of figures of two runs.
struct GlanceRow: Equatable {
    /// What is compared, and on what workload.
    var comparison: String
    var magpie: String
    /// The other system and its figure.
    var reference: String
    /// Magpie's figure over the reference's, with what the ratio is of ("1.20 × its rate").
    var ratio: String
    /// Which run: "suite" (results.json of `make bench`) or "service" (`make bench-service`).
    var run: Run

    enum Run: Equatable { case suite, service }
}

enum Glance {
    /// The rows that the runs hold, in the order of the page.
    static func rows(_ suite: Report, service: Report?) -> [GlanceRow] {
        var rows: [GlanceRow] = []
        func add(_ comparison: String, _ magpie: String, _ reference: String, _ ratio: String, _ run: GlanceRow.Run = .suite) {
            rows.append(GlanceRow(comparison: comparison, magpie: magpie, reference: reference, ratio: ratio, run: run))
        }
        let results = suite.results.filter { $0.extra["sweep_parameter"] == nil }
        func row(_ scenario: String, _ system: String) -> BenchResult? {
            results.first { $0.scenario == scenario && $0.system == system }
        }

        // Memory, at the run's highest thread count, beside HyperClockCache: the read in place (as RocksDB
        // reads, pinning the entry) and the copying read.
        let memory = results.filter { $0.scenario == "memory" && $0.extra["hot_keys"] == nil }
        if let threads = memory.map(\.threads).max(),
            let peer = memory.first(where: { $0.system == "rocksdb-hcc" && $0.threads == threads })
        {
            let reads = [("magpie-inplace", "in place"), ("magpie", "copying")].compactMap { system, label in
                memory.first { $0.system == system && $0.threads == threads }.map { (label, $0.ops_per_sec) }
            }
            if !reads.isEmpty {
                add(
                    "Memory tier: Zipf 0.99 gets, a set on each miss, \(threads) threads (ops/s)",
                    reads.map { "\(formatRate($0.1)) \($0.0)" }.joined(separator: ", "),
                    "RocksDB HyperClockCache \(formatRate(peer.ops_per_sec))",
                    reads.map { String(format: "%.2f × (%@)", $0.1 / peer.ops_per_sec, $0.0) }.joined(separator: ", "))
            }
        }

        // Disk: stores, page-cache-hot gets, the eviction-heavy hit ratio and the reopen.
        if let magpie = row("disk-set", "magpie"), let rocksdb = row("disk-set", "rocksdb") {
            add(
                "Disk tier: stores of 4 KiB values, compression on (ops/s)", formatRate(magpie.ops_per_sec),
                "RocksDB \(formatRate(rocksdb.ops_per_sec))", times(magpie.ops_per_sec / rocksdb.ops_per_sec, "its rate"))
        }
        if let magpie = row("disk-get", "magpie")?.p50("get_random_hit_latency_ns"),
            let lmdb = row("disk-get", "lmdb")?.p50("get_random_hit_latency_ns")
        {
            add(
                "Disk tier: get of a 4 KiB value the page cache holds (p50)", formatNanoseconds(magpie),
                "LMDB \(formatNanoseconds(lmdb))", times(magpie / lmdb, "its time"))
        }
        if let magpie = row("disk-evict", "magpie"), let rocksdb = row("disk-evict", "rocksdb") {
            add(
                "Disk tier: hit ratio, a working set 5 × the budget, Zipf 0.9, a store on each miss",
                String(format: "%.4f", magpie.hit_ratio), String(format: "RocksDB (FIFO) %.4f", rocksdb.hit_ratio),
                String(format: "%+.1f points", 100 * (magpie.hit_ratio - rocksdb.hit_ratio)))
        }
        if let magpie = row("disk-reopen", "magpie"), let lmdb = row("disk-reopen", "lmdb"), lmdb.seconds > 0 {
            add(
                "Disk tier: reopen and first get after a clean close", milliseconds(magpie.seconds),
                "LMDB \(milliseconds(lmdb.seconds))", times(magpie.seconds / lmdb.seconds, "its time"))
        }

        // Replay of the committed trace: Magpie's memory tier against the best reference policy at each budget
        // (Belady's optimum, which needs the future, is not a policy a cache can run).
        let replays = results.filter { $0.scenario.hasPrefix("replay ") && $0.scenario.hasSuffix("%") }
        let budgets = replays.filter { $0.system == "magpie-memory" }
        if !budgets.isEmpty {
            var ahead = 0
            var worst: (budget: String, magpie: Double, reference: String, miss: Double)?
            var cells: [(String, Double, String, Double)] = []
            for magpie in budgets {
                let others = replays.filter {
                    $0.scenario == magpie.scenario && !$0.system.hasPrefix("magpie") && $0.system != "Belady"
                }
                guard let best = others.min(by: { missRatio($0) < missRatio($1) }) else { continue }
                let budget = Glance.budget(magpie.scenario)
                cells.append((budget, missRatio(magpie), best.system, missRatio(best)))
                if missRatio(magpie) <= missRatio(best) {
                    ahead += 1
                } else if worst == nil || missRatio(magpie) - missRatio(best) > worst!.magpie - worst!.miss {
                    worst = (budget, missRatio(magpie), best.system, missRatio(best))
                }
            }
            if !cells.isEmpty {
                let trace = budgets.first?.extra["trace"]?.stringValue ?? "the trace"
                let shown = cells.filter { ["1 %", "10 %"].contains($0.0) || $0.0 == worst?.budget }
                var ratio = "lower or equal at \(ahead) of \(cells.count) budgets"
                if let worst {
                    ratio += String(
                        format: "; %@ higher by %.2f points", worst.budget, 100 * (worst.magpie - worst.miss))
                }
                add(
                    "Memory tier replaying \(trace) (miss ratio at % of its working set)",
                    shown.map { String(format: "%@: %.4f", $0.0, $0.1) }.joined(separator: ", "),
                    "the best policy but Belady's: " + shown.map { String(format: "%@ %.4f", $0.2, $0.3) }.joined(separator: ", "),
                    ratio)
            }
        }

        // The fleet: every tasks value and mix the run measured, Magpie's remote tier beside cache-aside on Redis.
        for magpie in results where magpie.scenario == "fleet" && magpie.system == "magpie-fleet" {
            guard
                let aside = results.first(where: {
                    $0.scenario == "fleet" && $0.system == "redis-cache-aside"
                        && $0.extra["tasks"] == magpie.extra["tasks"] && FleetMix(of: $0) == FleetMix(of: magpie)
                }), aside.ops_per_sec > 0
            else { continue }
            let tasks = magpie.extra["tasks"]?.intValue.map { "\($0) tasks each" } ?? "threads"
            var workload = ""
            if case .object(let fleet) = suite.config["fleet"] {
                let workers = fleet["workers"]?.intValue.map { "\($0) processes" } ?? "processes"
                // The row's own shares (rows written before there were mixes: the run's).
                let (sets, removals) = (
                    magpie.extra["set_share"]?.numberValue ?? fleet["set_share"]?.numberValue ?? 0,
                    magpie.extra["remove_share"]?.numberValue ?? fleet["remove_share"]?.numberValue ?? 0
                )
                let changes =
                    sets + removals == 0
                    ? "no request changes a key"
                    : String(format: "%.0f %% of requests change a key%@", 100 * (sets + removals), sets == 0 ? ", all removals" : "")
                workload = "\(workers) on one Redis, \(tasks), \(changes)"
            }
            add(
                "Fleet: \(workload.isEmpty ? tasks : workload) (ops/s)", formatRate(magpie.ops_per_sec),
                "cache-aside on Redis \(formatRate(aside.ops_per_sec))", times(magpie.ops_per_sec / aside.ops_per_sec, "its rate"))
        }

        // The example service under wrk: Magpie memory-only beside Hummingbird's MemoryPersistDriver.
        if let service {
            let healthy = service.results.filter { $0.scenario == "service-healthy" }
            if let magpie = healthy.first(where: { $0.system == "magpie-memory" }),
                let hummingbird = healthy.first(where: { $0.system == "hummingbird-memory" }),
                hummingbird.ops_per_sec > 0
            {
                add(
                    "A Hummingbird service under wrk, 64 connections, cached reads (requests/s, p99)",
                    "\(formatRate(magpie.ops_per_sec)), \(milliseconds(Double(magpie.latency_ns.p99) / 1e9))",
                    "MemoryPersistDriver \(formatRate(hummingbird.ops_per_sec)), " + milliseconds(Double(hummingbird.latency_ns.p99) / 1e9),
                    times(magpie.ops_per_sec / hummingbird.ops_per_sec, "its rate"), .service)
            }
        }
        return rows
    }

    /// "10 %" from a replay row's scenario, "replay 10%".
    static func budget(_ scenario: String) -> String {
        let text = scenario.dropFirst("replay ".count)
        return text.hasSuffix("%") ? text.dropLast() + " %" : String(text)
    }

    static func times(_ ratio: Double, _ of: String) -> String { String(format: "%.2f × %@", ratio, of) }

    /// The rows as a Markdown table, each with its run's day and commit, then the machines the runs had.
    static func markdown(_ suite: Report, service: Report?) -> String {
        let rows = rows(suite, service: service)
        func run(_ which: GlanceRow.Run) -> Report { which == .service ? service ?? suite : suite }
        func stamp(_ report: Report) -> String { Markdown.day(report.date) + (report.commit.map { ", `\($0)`" } ?? "") }
        var text = Table(nil, ["comparison", "Magpie", "instead", "Magpie against it", "run"], rows: rows.map {
            [$0.comparison, $0.magpie, $0.reference, $0.ratio, stamp(run($0.run))]
        }).markdown
        let machines = [suite] + (service.map { [$0] } ?? [])
        if machines.allSatisfy({ Markdown.sameMachine($0.machine, suite.machine) }) {
            text += "\nMachine: \(Markdown.machine(suite.machine)).\n"
        } else {
            text += "\nMachines: `make bench` on \(Markdown.machine(suite.machine)); "
            text += "`make bench-service` on \(Markdown.machine(service!.machine)).\n"
        }
        return text
    }

    static func milliseconds(_ seconds: Double) -> String { String(format: "%.2f ms", seconds * 1e3) }

    static func missRatio(_ r: BenchResult) -> Double { r.extra["miss_ratio"]?.numberValue ?? 1 - r.hit_ratio }
}
