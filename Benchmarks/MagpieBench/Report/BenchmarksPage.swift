import Foundation

/// BENCHMARKS.md, written by `magpie-bench report --markdown` from one suite run's results.json (and,
/// when given, one `make bench-service` run's): the run's provenance, how to read the numbers, the
/// headline comparisons, then a section per scenario, each table under the command that reproduces it.
/// Nothing on the page comes from anywhere else.
enum BenchmarksPage {
    static func render(_ suite: Report, source: String, service: Report?, serviceSource: String?) -> String {
        var page = """
            # Benchmarks

            Current results only: every table on this page comes from the one `make bench` run named below (the
            service table from one `make bench-service` run), written here by `make bench-md`
            (`magpie-bench report --markdown`). Dated measurements, experiments and the reasons behind the design
            are in [docs/lab-notes/](docs/lab-notes/README.md).


            """
        var run = "**Run:** `make bench` at " + (suite.commit.map { "commit `\($0)`" } ?? "an unrecorded commit")
        run += ", \(Markdown.date(suite.date)); the report: `\(source)` (not committed)."
        var bullets = [run, "**Machine:** \(Markdown.machine(suite.machine))."]
        if let service {
            var line =
                "**Service run:** `make bench-service` at "
                + (service.commit.map { "commit `\($0)`" } ?? "an unrecorded commit")
            line +=
                ", \(Markdown.date(service.date)), on \(Markdown.machine(service.machine)); the report: `\(serviceSource ?? "-")`."
            bullets.append(line)
        } else {
            bullets.append("**Service run:** none given (`make bench-service`, then `make bench-md`, adds it).")
        }
        bullets.append(
            "**Reproduce:** `make bench`, then `make bench-md`; each table also names the command that reproduces it alone."
        )
        page += bullets.map(Markdown.bullet).joined()
        page += """

            ## How to read these numbers

            - Compare within a table. This VM's speed swings by ±30 % between runs of the same binary and drifts over
              the day, so an absolute rate says little; a ratio of two rows of one run (a same-run ratio) is the figure
              to trust. Every ratio on this page is one.
            - Hit and miss ratios, compression ratios and bytes on disk are deterministic for a seed: they do not
              move between runs.
            - A before/after claim needs both builds run alternately, in pairs, in the same minutes
              (`magpie-bench compare A.json B.json`), and the spread of the pairs, not one run of each.
            - For a small change on a hot path, count instructions with callgrind (`Benchmarks/opcount.sh`): the
              count is deterministic, timings on this VM cannot resolve a few percent.
            - A latency is of one operation as its caller sees it, timer included; "p99.9" is the 99.9th percentile.

            ## At a glance


            """
        page += Glance.markdown(suite, service: service)
        let sections = [
            memory(suite), disk(suite), diskTasks(suite), tiered(suite), loader(suite), replay(suite), redis(suite),
            fleet(suite), remoteAsync(suite), service.map(serviceSection) ?? "", curves(suite),
        ]
        for section in sections where !section.isEmpty { page += "\n" + section }
        return page
    }

    /// A section: its heading, the command, commit and date, a sentence on the workload, then its tables.
    static func section(_ title: String, _ report: Report, command: String?, _ what: String, _ tables: [String])
        -> String
    {
        var text = "## \(title)\n\n" + Markdown.provenance(report, command: command) + "\n"
        if !what.isEmpty { text += Markdown.wrap(what) + "\n\n" }
        return text + tables.filter { !$0.isEmpty }.joined(separator: "\n")
    }

    static func command(_ report: Report, _ scenario: String) -> String? { report.commands?[scenario] }

    static func rows(_ report: Report) -> [BenchResult] { report.results.filter { $0.extra["sweep_parameter"] == nil } }

    static func memory(_ report: Report) -> String {
        guard let table = memorySummaryTable(report.results) else { return "" }
        var workload = "Cache-aside on Zipf keys: a get, and a set on each miss."
        if case .object(let c) = report.config["memory"], let keys = c["keys"]?.intValue,
            let key = c["key_size"]?.intValue,
            let value = c["value_size"]?.intValue, let alpha = c["zipf_alpha"]?.numberValue,
            let budget = c["budget_bytes"]?.intValue
        {
            workload = String(
                format:
                    "Cache-aside on %d keys of %d B with %d-byte values, Zipf %g, a budget of %.1f MB (%.0f %% of the bytes): a get, and a set on each miss.",
                keys, key, value, alpha, Double(budget) / 1e6, 100 * Double(budget) / Double(keys * (key + value)))
        }
        return section(
            "Memory tier", report, command: command(report, "memory"),
            workload + """
                 `magpie` copies a hit's value out, `magpie-inplace` reads it in place (as \
                RocksDB's pinned read does), `magpie-cache` goes through `Cache`; `rocksdb-hcc` is RocksDB's \
                HyperClockCache on the same sequences (`Benchmarks/Peers/rocksdb_cache_peer.cc`). Rates are the median of \
                the timed passes; min/median is the slowest pass over that median.
                """, [table.markdown])
    }

    static func disk(_ report: Report) -> String {
        let disk = rows(report).filter { $0.scenario.hasPrefix("disk-") && $0.scenario != "disk-tasks" }
        guard disk.contains(where: { $0.system == "magpie" }) else { return "" }
        func row(_ scenario: String, _ system: String) -> BenchResult? {
            disk.first { $0.scenario == scenario && $0.system == system }
        }
        var table = Table(nil, [
            "system", "stores/s", "get p50, 4 KiB raw", "get p50, 4 KiB JSON", "evicting: ops/s", "evicting: hit ratio",
            "write amplification", "reopen + first get",
        ])
        for system in distinct(disk.filter { !$0.scenario.hasSuffix("-floor") }.map(\.system)) {
            let get = row("disk-get", system)
            let evict = row("disk-evict", system)
            table.append([
                system, row("disk-set", system).map { formatRate($0.ops_per_sec) } ?? "-",
                get?.p50("get_random_hit_latency_ns").map(formatNanoseconds) ?? "-",
                get?.p50("get_text_hit_latency_ns").map(formatNanoseconds) ?? "-",
                evict.map { formatRate($0.ops_per_sec) } ?? "-",
                evict.map { String(format: "%.4f", $0.hit_ratio) } ?? "-",
                evict?.extra["write_amplification"]?.numberValue.map { String(format: "%.2f", $0) } ?? "-",
                row("disk-reopen", system).map { Glance.milliseconds($0.seconds) } ?? "-",
            ])
        }
        let bars = DiskBars(report.results)
        var tables = [table.markdown]
        for bar in bars.tables { tables.append("\(bar.title ?? ""):\n\n" + bar.markdown) }
        if !bars.notes.isEmpty { tables.append(bars.notes.map { "- \($0)" }.joined(separator: "\n") + "\n") }
        return section(
            "Disk tier", report, command: command(report, "disk"),
            """
            Values of 4 KiB, half JSON-like text, half random bytes, read while the page cache holds them (gets \
            are hits only). Evicting: a 64 MiB budget, a working set 5 × the budget, Zipf 0.9, a store on each miss; \
            write amplification is bytes written to the device over bytes stored. RocksDB runs with FIFO \
            compaction, SQLite as a `diskcache`-style table. The floors are a 4 KiB copy out of a mapping and a \
            `ZSTD_decompress` of one value, timed in the same run.
            """, tables)
    }

    static func diskTasks(_ report: Report) -> String {
        let table = diskTasksTable(report.results)
        guard !table.isEmpty else { return "" }
        return section(
            "Disk hits from async tasks", report, command: command(report, "disk-tasks"),
            """
            Disk hits (entries stored disk-only, the page cache holding them) and stores of new keys from 1, 16 and \
            256 tasks: `cache.async` and the loader beside the synchronous call made in the task. "On the task": \
            the share of operations done on the caller's task, without a hop to an I/O thread.
            """, [table.markdown])
    }

    static func tiered(_ report: Report) -> String {
        let tiered = rows(report).filter { ["tiered", "tiered-capped", "hit-cost"].contains($0.scenario) }
        guard !tiered.isEmpty else { return "" }
        var table = Table(nil, ["workload", "system", "ops/s", "p50 ns", "p99 ns", "hit ratio"])
        for r in tiered {
            table.append([
                r.scenario, r.system, formatRate(r.ops_per_sec), String(r.latency_ns.p50), String(r.latency_ns.p99),
                String(format: "%.4f", r.hit_ratio),
            ])
        }
        var notes: [String] = []
        if let r = tiered.first(where: { $0.scenario == "tiered" && $0.system == "magpie" }),
            let memory = r.extra["memory_hit_ratio"]?.numberValue,
            let promoted = r.p50("promoted_hit_latency_ns"),
            let hit = r.p50("memory_hit_latency_ns")
        {
            notes.append(
                String(
                    format:
                        "- tiered: %.1f %% of gets hit memory (p50 %@), the rest are disk hits promoted into memory (p50 %@).",
                    100 * memory, formatNanoseconds(hit), formatNanoseconds(promoted)))
        }
        let capped = Dictionary(tiered.filter { $0.scenario == "tiered-capped" }.map { ($0.system, $0.ops_per_sec) }) {
            a, _ in a
        }
        if let magpie = capped["magpie"], let urlCache = capped["URLCache"], urlCache > 0 {
            notes.append(
                String(
                    format: "- tiered-capped: Magpie %.0f × URLCache's rate on the same small workload.",
                    magpie / urlCache))
        }
        if let r = tiered.first(where: { $0.scenario == "hit-cost" }),
            let ratio = r.extra["cache_over_tier"]?.numberValue
        {
            notes.append(
                String(
                    format: "- hit-cost: a memory hit through `Cache` costs %.2f × one on `MemoryTier` alone.", ratio))
        }
        return section(
            "Both tiers through `Cache`", report, command: command(report, "tiered"),
            """
            20,000 keys of 4 KiB, Zipf 0.99, memory at 10 % of the working set and disk at twice it, cache-aside. \
            `tiered-capped` is a workload small enough for URLCache's two tiers; `hit-cost` times memory hits through \
            `Cache` and through the memory tier alone.
            """, [table.markdown, notes.isEmpty ? "" : notes.joined(separator: "\n") + "\n"])
    }

    static func loader(_ report: Report) -> String {
        guard let table = loaderTable(report.results) else { return "" }
        return section(
            "Loaders in front of a slow, failing origin", report, command: command(report, "loader"),
            """
            Caller tasks read keys through a loader from a slow origin that fails for a few seconds mid-run: \
            cache-aside, single flight, and stale-while-revalidate with fail-safe. "Cached" are calls for keys \
            loaded within their hard lifetime; "beyond bound" counts stale values served past what \
            the options allow, "wrong" values of another key or version.
            """, [table.markdown])
    }

    static func replay(_ report: Report) -> String {
        let replays = rows(report).filter { $0.scenario.hasPrefix("replay ") && $0.scenario.hasSuffix("%") }
        guard !replays.isEmpty else { return "" }
        let trace = replays[0].extra["trace"]?.stringValue ?? "the trace"
        let table = missRatioTable(replays, budget: { Glance.budget($0.scenario) })
        return section(
            "Trace replay", report, command: command(report, "replay"),
            """
            `\(trace)` (Benchmarks/Traces: 113,872 block-I/O requests from libCacheSim's sample data) through the \
            memory tier, one shard, each entry charged its object's size as simulators charge, beside exact \
            reference policies. Miss ratio at each budget (% of the working set); bold: the lowest of the policies \
            a cache can run (Belady's optimum needs the future).
            """, [table.markdown])
    }

    /// Miss ratios with a row per budget and a column per system, the lowest but Belady's in bold.
    static func missRatioTable(_ replays: [BenchResult], budget: (BenchResult) -> String) -> Table {
        let systems = distinct(replays.map(\.system))
        var table = Table(nil, ["budget"] + systems)
        for b in distinct(replays.map(budget)) {
            let point = replays.filter { budget($0) == b }
            let best = point.filter { $0.system != "Belady" }.map(Glance.missRatio).min()
            table.append(
                [b]
                    + systems.map { system in
                        guard let r = point.first(where: { $0.system == system }) else { return "-" }
                        let text = String(format: "%.4f", Glance.missRatio(r))
                        return r.system != "Belady" && Glance.missRatio(r) == best ? "**\(text)**" : text
                    })
        }
        return table
    }
}
