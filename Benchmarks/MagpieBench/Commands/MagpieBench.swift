import ArgumentParser
import Foundation

@main
struct MagpieBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "magpie-bench",
        abstract: "Measures Magpie and the caches it replaces on the same workload, in one process.",
        version: magpieBenchVersion,
        subcommands: [
            Suite.self, ScenarioCommand<MemoryOptions>.self, ScenarioCommand<DiskOptions>.self, ScenarioCommand<TieredOptions>.self,
            ScenarioCommand<LoaderBenchOptions>.self, Stress.self, Replay.self, Sweep.self, ScenarioCommand<RedisBenchOptions>.self,
            ScenarioCommand<FleetOptions>.self, ScenarioCommand<RemoteAsyncOptions>.self, ScenarioCommand<DiskTasksOptions>.self,
            FleetWorker.self, Compare.self, RenderReport.self, TraceGen.self,
        ],
        defaultSubcommand: Suite.self)

    /// Parses and runs the command, with the library's log lines sent to a file (BenchLogging.swift).
    static func main() async {
        BenchLogging.bootstrap()
        do {
            var command = try parseAsRoot()
            if var command = command as? AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
            // A fleet worker's standard output is its parent's protocol: nothing more there.
            if !(command is FleetWorker), let summary = BenchLogging.summary() { print(summary) }
        } catch {
            exit(withError: error)
        }
    }
}

/// Shared output options.
struct OutputOptions: ParsableArguments {
    @Option(help: "Also write the JSON report here.") var json: String?
}

/// The default suite (what `make bench` runs): every scenario at its defaults, a table, and
/// bench-results/<timestamp>/results.json.
struct Suite: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the default suite and write bench-results/<timestamp>/results.json.")

    @Option(help: "Directory for the timestamped results.") var output = "bench-results"
    @Option(help: "The trace the suite replays beside the reference policies; skipped when absent.")
    var trace = "Benchmarks/Traces/cloudPhysicsIO.oracleGeneral.bin"
    @OptionGroup var outputOptions: OutputOptions

    func run() async throws {
        // The commit of the checkout that was built, read before the run: a commit made while it runs is not
        // what ran.
        let commit = Provenance.commit()
        // Each scenario's options as a command line: parsed here, and written to the report, which names the
        // command that reproduces each table (`magpie-bench report --markdown`).
        var commands: [String: String] = [:]
        var config: [String: JSONValue] = [:]
        var results: [BenchResult] = []
        var scenarios: [any ScenarioOptions.Type] = []
        func arguments(_ scenario: String, _ arguments: [String]) -> [String] {
            commands[scenario] = (["magpie-bench", scenario] + arguments).joined(separator: " ")
            return arguments
        }
        func run<Options: ScenarioOptions>(_: Options.Type, _ given: [String]) async throws {
            let options = try Options.parse(arguments(Options.command, given))
            let rows = try await options.measure(progress: progressLine)
            config[Options.command] = .object(options.config(of: rows))
            results += rows
            scenarios.append(Options.self)
        }
        // The hot-key workload at 16 keys only (1 and 256 with `magpie-bench memory`), to keep the suite short.
        try await run(MemoryOptions.self, ["--hot-keys", "16"])
        // file-per-key stores about 1,000 values/s here: 20,000 of them keep the suite short; the
        // eviction-heavy workload at 100,000 operations (200,000 with `magpie-bench disk`), as SQLite
        // takes about 10 s per 100,000 there.
        try await run(DiskOptions.self, ["--fileperkey-keys", "20000", "--evict-ops", "100000"])
        // Disk hits from 1, 16 and 256 async tasks: cache.async.value, lookup and the loader beside the
        // synchronous read in the task (`magpie-bench disk-tasks`, the same; about 6 s).
        try await run(DiskTasksOptions.self, [])
        try await run(TieredOptions.self, [])
        // The loader scenario at 12 s per system (20 s with `magpie-bench loader`).
        try await run(LoaderBenchOptions.self, ["--seconds", "12", "--outage-at", "5", "--outage-seconds", "3"])
        // The Redis client beside redis-benchmark: one round of 2 s measurements (`magpie-bench redis`:
        // 2 rounds of 5 s), on a private redis-server that `make bench` installs.
        try await run(RedisBenchOptions.self, ["--seconds", "2", "--rounds", "1", "--keys", "20000"])
        // The fleet: 4 worker processes on one private Redis, its four systems 3 s each after 2 s of
        // warm-up (`magpie-bench fleet`: 10 s after 3 s; `--fault` for the outage run); 16 async caller
        // tasks per worker only (`magpie-bench fleet` runs 1, 16 and 256). The no-change and removals-only
        // mixes for Magpie and cache-aside only (the × aside ratio; `fleet` runs every system in every
        // mix): four runs more, about 23 s.
        try await run(
            FleetOptions.self,
            [
                "--seconds", "3", "--warmup-seconds", "2", "--tasks", "16", "--mixes", "default", "none", "removals",
                "--mix-systems", "magpie-fleet", "redis-cache-aside",
            ])
        // The remote tier from 16 and 256 async tasks beside RedisClient (`magpie-bench fleet-async`: also
        // 1 task, and twice the operations).
        try await run(RemoteAsyncOptions.self, ["--tasks", "16", "256", "--operations", "20000", "--hits", "200000"])
        // The committed trace (Benchmarks/Traces, 113,872 requests) through the memory tier beside every
        // reference policy at the sweep's budgets: a few seconds.
        var replayTables: [Table] = []
        if FileManager.default.fileExists(atPath: trace) {
            let replay = try Replay.parse(arguments("replay", [trace, "--budget", "1%", "2%", "5%", "10%", "20%", "40%"]))
            var (rows, table, _) = try replay.measure()
            results += rows
            config["replay"] = .object(replay.config)
            let name = URL(fileURLWithPath: trace).lastPathComponent
            table.title = "replay \(name): miss ratio vs budget, Magpie's memory tier and the reference policies"
            replayTables = table.isEmpty ? [] : [table]
        } else {
            progressLine("replay: skipped, no trace at \(trace) (run from the repository's root)")
        }
        // Short tuning curves for the report: hit ratio vs budget, miss ratio vs budget on a trace-gen trace
        // (Magpie beside the reference policies, about 5 s), throughput vs shards.
        let sweep = try Sweep.parse(arguments("sweep", ["--curves", "budget", "policy", "shards", "--keys", "200000", "--ops", "300000"]))
        let (curves, curveTables) = try sweep.measure()
        results += curves
        config["sweep"] = .object(sweep.config)
        let stamp = timestamp()
        let report = Report(
            date: stamp, machine: .current(), config: config, results: results, commit: commit, commands: commands)
        print()
        // The curves, the replay and the Redis rows get their own tables.
        resultsTable(results.filter {
            $0.extra["sweep_parameter"] == nil && !$0.scenario.hasPrefix("redis-") && !$0.scenario.hasPrefix("fleet")
                && $0.scenario != "disk-tasks" && !$0.scenario.hasPrefix("replay ")
        }).print()
        let glance = Table(
            "At a glance (same-run ratios; `magpie-bench report --markdown` writes them into BENCHMARKS.md and README.md)",
            ["comparison", "Magpie", "instead", "Magpie against it"],
            rows: Glance.rows(report, service: nil).map { [$0.comparison, $0.magpie, $0.reference, $0.ratio] })
        for table in scenarios.flatMap({ $0.tables(results) }) + replayTables + curveTables + [glance] { table.print() }
        let path = "\(output)/\(stamp)/results.json"
        try report.write(to: path)
        let page = "\(output)/\(stamp)/report.html"
        try HTMLReport.render(report).write(toFile: page, atomically: true, encoding: .utf8)
        print("\nwrote \(path) and \(page)")
        if let json = outputOptions.json { try report.write(to: json) }
    }
}

func progressLine(_ text: String) {
    FileHandle.standardError.write("[\(timestamp(short: true))] \(text)\n".data(using: .utf8)!)
}

func timestamp(short: Bool = false) -> String {
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "UTC")
    formatter.dateFormat = short ? "HH:mm:ss" : "yyyyMMdd'T'HHmmss'Z'"
    return formatter.string(from: Date())
}
