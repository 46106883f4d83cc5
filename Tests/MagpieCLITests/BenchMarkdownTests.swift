import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench report --markdown`: BENCHMARKS.md and README.md's glance table from a small results.json.
@Suite("magpie-bench report --markdown")
struct BenchMarkdownTests {
    static func row(
        _ scenario: String, _ system: String, threads: Int = 1, ops: Double, p50: Int = 100, hit: Double = 1,
        seconds: Double = 1,
        extra: String = "{}"
    ) -> String {
        BenchReportTests.row(scenario, system, threads: threads, ops: ops, p50: p50, hit: hit, extra: extra)
            .replacingOccurrences(of: #""seconds": 1,"#, with: "\"seconds\": \(seconds),")
    }

    static func report(
        _ rows: [String], commit: String?, date: String, config: String = "{}", commands: String = "null"
    ) -> String {
        """
        {"tool": "magpie-bench", "version": "0.1.0", "date": "\(date)", \(commit.map { "\"commit\": \"\($0)\"," } ?? "")
         "commands": \(commands),
         "machine": {"cores": 2, "os": "Debian GNU/Linux 12 (bookworm)", "cpu": "Test CPU", "memory_bytes": 25769803776, "swift": "6.3+"},
         "config": \(config), "results": [\(rows.joined(separator: ",\n"))]}
        """
    }

    /// A suite run: memory at 1 and 2 threads beside the RocksDB peer, disk beside RocksDB and LMDB, a
    /// replay at two budgets, and the fleet at 16 tasks.
    static let suite = report(
        [
            row("memory", "magpie", threads: 1, ops: 3e6), row("memory", "magpie-inplace", threads: 1, ops: 4e6),
            row("memory", "rocksdb-hcc", threads: 1, ops: 2.5e6),
            row("memory", "magpie", threads: 2, ops: 4.5e6), row("memory", "magpie-inplace", threads: 2, ops: 6e6),
            row("memory", "rocksdb-hcc", threads: 2, ops: 4.8e6),
            row("disk-set", "magpie", ops: 300e3), row("disk-set", "rocksdb", ops: 200e3),
            row("disk-set", "lmdb", ops: 100e3),
            row(
                "disk-get", "magpie", ops: 500e3,
                extra: #"{"get_random_hit_latency_ns": {"p50": 1500}, "get_text_hit_latency_ns": {"p50": 6000}}"#),
            row(
                "disk-get", "lmdb", ops: 600e3,
                extra: #"{"get_random_hit_latency_ns": {"p50": 1200}, "get_text_hit_latency_ns": {"p50": 1300}}"#),
            row("disk-evict", "magpie", ops: 300e3, hit: 0.7718, extra: #"{"write_amplification": 0.62}"#),
            row("disk-evict", "rocksdb", ops: 120e3, hit: 0.7441, extra: #"{"write_amplification": 0.64}"#),
            row("disk-reopen", "magpie", ops: 1, seconds: 0.0012), row("disk-reopen", "lmdb", ops: 1, seconds: 0.0006),
            row(
                "replay 1%", "magpie-memory", ops: 5e6, hit: 1 - 0.81, extra: #"{"miss_ratio": 0.81, "trace": "t.bin"}"#
            ),
            row("replay 1%", "LIRS", ops: 0, hit: 1 - 0.822, extra: #"{"miss_ratio": 0.822, "trace": "t.bin"}"#),
            row("replay 1%", "Belady", ops: 0, hit: 1 - 0.80, extra: #"{"miss_ratio": 0.80, "trace": "t.bin"}"#),
            row(
                "replay 20%", "magpie-memory", ops: 5e6, hit: 1 - 0.6534,
                extra: #"{"miss_ratio": 0.6534, "trace": "t.bin"}"#),
            row("replay 20%", "LIRS", ops: 0, hit: 1 - 0.6413, extra: #"{"miss_ratio": 0.6413, "trace": "t.bin"}"#),
            row("replay 20%", "S3-FIFO", ops: 0, hit: 1 - 0.6755, extra: #"{"miss_ratio": 0.6755, "trace": "t.bin"}"#),
            // The removals-only mix's rows first: each Magpie row is compared with cache-aside's of its own mix.
            row("fleet", "magpie-fleet", threads: 16, ops: 30e3, extra: #"{"tasks": 16, "mix": "removals", "set_share": 0, "remove_share": 0.03}"#),
            row("fleet", "redis-cache-aside", threads: 16, ops: 10e3, extra: #"{"tasks": 16, "mix": "removals", "set_share": 0, "remove_share": 0.03}"#),
            row("fleet", "magpie-fleet", threads: 16, ops: 60e3, extra: #"{"tasks": 16}"#),
            row("fleet", "redis-cache-aside", threads: 16, ops: 40e3, extra: #"{"tasks": 16}"#),
        ], commit: "abc1234", date: "20261206T023512Z",
        config: #"{"fleet": {"workers": 4, "set_share": 0.02, "remove_share": 0.01, "zipf": 0.99, "keys": 20000}}"#,
        commands: #"{"memory": "magpie-bench memory --hot-keys 16", "disk": "magpie-bench disk --evict-ops 100000"}"#)

    static let service = report(
        [
            row("service-healthy", "hummingbird-memory", ops: 40_000, p50: 1_000_000),
            row("service-healthy", "magpie-memory", ops: 48_000, p50: 800_000),
            row(
                "service-failing", "magpie-memory", ops: 47_000, p50: 800_000, extra: #"{"errors": 0, "log_lines": 2}"#),
        ], commit: "def5678", date: "20261206T031000Z", config: #"{"service": {"connections": 64, "keys": 1000}}"#)

    static let readme = """
        # A project

        Before the table.

        <!-- glance:begin (magpie-bench report --markdown writes this table) -->
        an old table
        <!-- glance:end -->

        After the table.

        """

    /// The table lines of `text` whose first cell starts with `prefix`.
    static func tableRow(_ text: String, _ prefix: String) -> String? {
        text.split(separator: "\n").map(String.init).first { $0.hasPrefix("| " + prefix) }
    }

    @Test(
        "BENCHMARKS.md: the run's commit and machine, each table under its command, same-run ratios in the glance table"
    )
    func page() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try Self.suite.write(toFile: directory.child("results.json"), atomically: true, encoding: .utf8)
        try Self.service.write(toFile: directory.child("service.json"), atomically: true, encoding: .utf8)
        try Self.readme.write(toFile: directory.child("README.md"), atomically: true, encoding: .utf8)
        #expect(
            try runBench([
                "report", directory.child("results.json"), "--markdown", directory.child("BENCHMARKS.md"),
                "--service", directory.child("service.json"), "--readme", directory.child("README.md"),
            ]) == 0)
        let page = try String(contentsOfFile: directory.child("BENCHMARKS.md"), encoding: .utf8)

        #expect(page.contains("- **Run:** `make bench` at commit `abc1234`, 2026-12-06 02:35 UTC"))
        #expect(page.contains("- **Machine:** 2 cores, Test CPU, 24 GiB, Debian GNU/Linux 12 (bookworm), Swift 6.3+."))
        #expect(page.contains("`magpie-bench memory --hot-keys 16` · commit `abc1234` · 2026-12-06 02:35 UTC"))
        #expect(page.contains("`magpie-bench disk --evict-ops 100000` · commit `abc1234` · 2026-12-06 02:35 UTC"))
        // A table whose command the report does not name is `make bench`'s; the service's, its own run's.
        #expect(page.contains("`make bench` · commit `abc1234` · 2026-12-06 02:35 UTC"))
        #expect(page.contains("· commit `def5678` · 2026-12-06 03:10 UTC"))

        // The glance rows: each ratio is of the two figures beside it, from the same run.
        let memory = try #require(Self.tableRow(page, "Memory tier: Zipf"))
        #expect(memory.contains("6.00 M in place, 4.50 M copying"))
        #expect(memory.contains("RocksDB HyperClockCache 4.80 M"))
        #expect(memory.contains("1.25 × (in place), 0.94 × (copying)"))
        #expect(memory.contains("2026-12-06, `abc1234`"))
        #expect(
            try #require(Self.tableRow(page, "Disk tier: stores")).contains(
                "| 300 k | RocksDB 200 k | 1.50 × its rate |"))
        #expect(
            try #require(Self.tableRow(page, "Disk tier: get")).contains("| 1500 ns | LMDB 1200 ns | 1.25 × its time |")
        )
        #expect(
            try #require(Self.tableRow(page, "Disk tier: hit ratio")).contains(
                "| 0.7718 | RocksDB (FIFO) 0.7441 | +2.8 points |"))
        #expect(
            try #require(Self.tableRow(page, "Disk tier: reopen")).contains(
                "| 1.20 ms | LMDB 0.60 ms | 2.00 × its time |"))
        let replay = try #require(Self.tableRow(page, "Memory tier replaying t.bin"))
        #expect(replay.contains("1 %: 0.8100, 20 %: 0.6534"))
        #expect(replay.contains("LIRS 0.8220, LIRS 0.6413"))  // Belady's 0.80 is not a policy a cache can run
        #expect(replay.contains("lower or equal at 1 of 2 budgets; 20 % higher by 1.21 points"))
        let fleet = try #require(
            Self.tableRow(page, "Fleet: 4 processes on one Redis, 16 tasks each, 3 % of requests change a key (ops/s)"))
        #expect(fleet.contains("| 60 k | cache-aside on Redis 40 k | 1.50 × its rate |"))
        let removals = try #require(
            Self.tableRow(page, "Fleet: 4 processes on one Redis, 16 tasks each, 3 % of requests change a key, all removals (ops/s)"))
        #expect(removals.contains("| 30 k | cache-aside on Redis 10 k | 3.00 × its rate |"))
        // The fleet section's rows name their mix, each ratio within it.
        #expect(page.contains("change a key in the default mix"))
        #expect(try #require(Self.tableRow(page, "magpie-fleet | 16 | removals only (3 %) | 30 k | 3.00 |")) != "")
        #expect(try #require(Self.tableRow(page, "magpie-fleet | 16 | default | 60 k | 1.50 |")) != "")
        let service = try #require(Self.tableRow(page, "A Hummingbird service"))
        #expect(service.contains("1.20 × its rate") && service.contains("2026-12-06, `def5678`"))

        // The replay table: a row per budget, the lowest but Belady's in bold.
        #expect(page.contains("| 1 % | **0.8100** | 0.8220 | 0.8000 | - |"))
        #expect(page.contains("| 20 % | 0.6534 | **0.6413** | - | 0.6755 |"))
        // The disk systems side by side.
        #expect(
            try #require(Self.tableRow(page, "magpie |")).contains(
                "| 300 k | 1500 ns | 6000 ns | 300 k | 0.7718 | 0.62 | 1.20 ms |"))

        // README.md: the block between the markers replaced, nothing else touched.
        let readme = try String(contentsOfFile: directory.child("README.md"), encoding: .utf8)
        #expect(!readme.contains("an old table"))
        #expect(readme.hasPrefix("# A project\n\nBefore the table.\n\n<!-- glance:begin"))
        #expect(readme.hasSuffix("<!-- glance:end -->\n\nAfter the table.\n"))
        #expect(Self.tableRow(readme, "Disk tier: stores") == Self.tableRow(page, "Disk tier: stores"))
        #expect(readme.contains("Machines: `make bench` on 2 cores, Test CPU") == false)  // one machine: one line
        #expect(readme.contains("Machine: 2 cores, Test CPU, 24 GiB, Debian GNU/Linux 12 (bookworm), Swift 6.3+."))
    }

    @Test("a row the run cannot support is left out, and a README without the markers is an error")
    func missingRows() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // No RocksDB peer (it did not build), no LMDB: no memory, store or get rows in the glance table.
        let rows = [
            Self.row("memory", "magpie", threads: 2, ops: 4e6), Self.row("disk-set", "magpie", ops: 300e3),
            Self.row("disk-get", "magpie", ops: 500e3, extra: #"{"get_random_hit_latency_ns": {"p50": 1500}}"#),
        ]
        try Self.report(rows, commit: nil, date: "20261206T023512Z").write(
            toFile: directory.child("results.json"), atomically: true, encoding: .utf8)
        try "# No markers\n".write(toFile: directory.child("README.md"), atomically: true, encoding: .utf8)
        #expect(try runBench(["report", directory.child("results.json"), "--markdown", directory.child("B.md")]) == 0)
        let page = try String(contentsOfFile: directory.child("B.md"), encoding: .utf8)
        #expect(page.contains("`make bench` at an unrecorded commit"))
        #expect(Self.tableRow(page, "Memory tier: Zipf") == nil)
        #expect(Self.tableRow(page, "Disk tier: stores") == nil)
        #expect(Self.tableRow(page, "Disk tier: get") == nil)
        #expect(page.contains("- **Service run:** none given"))
        #expect(
            try runBench([
                "report", directory.child("results.json"), "--markdown", directory.child("B.md"), "--readme",
                directory.child("README.md"),
            ])
                != 0)
        #expect(try String(contentsOfFile: directory.child("README.md"), encoding: .utf8) == "# No markers\n")
    }
}
