import ArgumentParser
import Foundation

/// The options of a scenario that a command runs alone (`magpie-bench memory`, `disk`, …) and the suite runs
/// in turn: what it measures, and the tables it prints.
protocol ScenarioOptions: ParsableArguments {
    /// The command's name, and the scenario's key in a report's `config`.
    static var command: String { get }
    static var abstract: String { get }
    /// Whether the command prints the rows' own table (`resultsTable`) above the scenario's tables.
    static var printsRows: Bool { get }
    /// Every workload parameter, for the JSON report.
    var config: [String: JSONValue] { get }
    func measure(progress: (String) -> Void) async throws -> [BenchResult]
    /// The scenario's tables, from whatever rows `results` holds of it.
    static func tables(_ results: [BenchResult]) -> [Table]
    /// The report's `config` of a run of these options (default: `config`).
    func config(of results: [BenchResult]) -> [String: JSONValue]
}

extension ScenarioOptions {
    static var printsRows: Bool { true }
    func config(of results: [BenchResult]) -> [String: JSONValue] { config }
}

/// `magpie-bench <scenario>`: one scenario alone; its tables, and with `--json` its report.
struct ScenarioCommand<Options: ScenarioOptions>: AsyncParsableCommand {
    static var configuration: CommandConfiguration { CommandConfiguration(commandName: Options.command, abstract: Options.abstract) }

    @OptionGroup var options: Options
    @OptionGroup var outputOptions: OutputOptions

    func run() async throws {
        let results = try await options.measure(progress: progressLine)
        if Options.printsRows {
            print()
            resultsTable(results).print()
        }
        for table in Options.tables(results) { table.print() }
        if let json = outputOptions.json {
            let config = [Options.command: JSONValue.object(options.config(of: results))]
            try Report(date: timestamp(), machine: .current(), config: config, results: results).write(to: json)
            print("\nwrote \(json)")
        }
    }
}

extension MemoryOptions: ScenarioOptions {
    static let command = "memory"
    static let abstract = "Memory tier vs NSCache and a mutex-guarded Dictionary: cache-aside over a Zipf workload."
    func measure(progress: (String) -> Void) throws -> [BenchResult] { try MemoryScenario(options: self).run(progress: progress) }
    static func tables(_ results: [BenchResult]) -> [Table] { [memorySummaryTable(results)].compactMap { $0 } }
}

extension DiskOptions: ScenarioOptions {
    static let command = "disk"
    static let abstract =
        "Disk tier vs RocksDB, LMDB, SQLite, one-file-per-key and URLCache: floors, set, page-cache-hot get, reopen, eviction-heavy, mixed sizes."
    func measure(progress: (String) -> Void) throws -> [BenchResult] { try DiskScenario(options: self).run(progress: progress) }
    static func tables(_ results: [BenchResult]) -> [Table] { diskTables(results) + [trickleTable(results)].compactMap { $0 } }
    func config(of results: [BenchResult]) -> [String: JSONValue] {
        config.merging(["system_configurations": diskConfigurations(results)]) { $1 }
    }
}

extension DiskTasksOptions: ScenarioOptions {
    static let command = "disk-tasks"
    static let abstract = "Disk hits from 1, 16 and 256 async tasks: cache.async.value beside the synchronous read called in the task."
    static let printsRows = false
    func measure(progress: (String) -> Void) async throws -> [BenchResult] {
        try await DiskTasksScenario(options: self).run(progress: progress)
    }
    static func tables(_ results: [BenchResult]) -> [Table] { [diskTasksTable(results)] }
}

extension TieredOptions: ScenarioOptions {
    static let command = "tiered"
    static let abstract = "Both tiers: a Zipf working set 10x the memory budget; per-tier hits, promoted-hit latency, vs URLCache."
    func measure(progress: (String) -> Void) throws -> [BenchResult] { try TieredScenario(options: self).run(progress: progress) }
    static func tables(_ results: [BenchResult]) -> [Table] { [tieredTable(results)] }
}

extension LoaderBenchOptions: ScenarioOptions {
    static let command = "loader"
    static let abstract =
        "Callers in front of a slow, failing origin: cache-aside, single flight, and stale-while-revalidate with fail-safe."
    func measure(progress: (String) -> Void) async throws -> [BenchResult] {
        try await LoaderScenario(options: self).run(progress: progress)
    }
    static func tables(_ results: [BenchResult]) -> [Table] { [loaderTable(results)].compactMap { $0 } }
}

extension RedisBenchOptions: ScenarioOptions {
    static let command = "redis"
    static let abstract =
        "GET/SET of 100-byte values with magpie-redis and redis-benchmark on the same server, in one run; and calls failed fast by an open breaker."
    static let printsRows = false
    func measure(progress: (String) -> Void) async throws -> [BenchResult] {
        try await RedisScenario(options: self).run(progress: progress)
    }
    static func tables(_ results: [BenchResult]) -> [Table] {
        redisTables(results).map { [$0.rows, $0.bars].compactMap { $0 } } ?? []
    }
}

extension FleetOptions: ScenarioOptions {
    static let command = "fleet"
    static let abstract =
        "Worker processes sharing a Redis: Magpie's remote tier (loader API) against async cache-aside on Redis, a local cache + Redis + pub/sub invalidation, and uncoherent local caches, in one run (remote reads, Redis CPU, invalidation lag, stale reads; faults with --fault)."
    static let printsRows = false
    func measure(progress: (String) -> Void) async throws -> [BenchResult] {
        try await FleetScenario(options: self).run(progress: progress)
    }
    static func tables(_ results: [BenchResult]) -> [Table] { fleetTables(results) }
}

extension RemoteAsyncOptions: ScenarioOptions {
    static let command = "fleet-async"
    static let abstract = "The remote tier from 1, 16 and 256 async tasks: cache.async set/get/memory hits beside RedisClient SET/GET."
    static let printsRows = false
    func measure(progress: (String) -> Void) async throws -> [BenchResult] {
        try await RemoteAsyncScenario(options: self).run(progress: progress)
    }
    static func tables(_ results: [BenchResult]) -> [Table] { [remoteAsyncTable(results)] }
}
