import ArgumentParser
import Foundation
import Magpie

// `magpie-bench disk-tasks`: disk reads called the way services call them, from N concurrent tasks on
// Swift's global executor, through `cache.async` (the read runs on the cache's own I/O threads, never on
// the cooperative pool) beside the plain alternative at the same concurrency: the same cache's synchronous
// read called inside the task, which holds the task's cooperative thread for the read (what a service
// does that calls a synchronous cache from async code; fine while the page cache holds the file, a
// stalled cooperative thread when it does not).
//
// One cache: a disk tier holding `--keys` values of the disk scenario's kind (half JSON-like text, zstd,
// half random bytes, raw), every one stored disk-only, so each read is a disk hit (no promotion); a
// small memory tier. Per concurrency (default 1, 16 and 256 tasks), in one run: `magpie-sync`, then
// `magpie-async` (`cache.async.value`), `magpie-async-lookup` (`cache.async.lookup`) and `magpie-loader`
// (`cache.value(forKey:load:)`, the get-or-load services call; its loader never runs, as every key is on
// disk: a run of it fails the row), each over the same uniformly drawn keys (`--apis` picks the async
// rows). Each read is checked against its value's digest outside the timed span; a row with any wrong
// read fails the run. Then stores (`--stores` per row, 0: none): `magpie-sync-set`, the synchronous
// `set` called in the task, beside `magpie-async-set` (`cache.async.set`), each of keys never stored
// before (the store a loader's miss makes), values of the same kind, into both tiers; the memtables are
// written in the background as they fill. After the rows every stored key is read back and checked.

struct DiskTasksOptions: ParsableArguments {
    @Option(parsing: .upToNextOption, help: "Concurrent tasks per measurement.") var tasks: [Int] = [1, 16, 256]
    @Option(help: "Distinct keys (page-cache hot).") var keys = 20_000
    @Option(help: "Value size in bytes (half JSON-like text, half random bytes).") var valueSize = 4096
    @Option(help: "Reads per row (a quarter of it at 1 task).") var gets = 100_000
    @Option(help: "Seed of the values and the keys read.") var seed: UInt64 = 42
    @Option(parsing: .upToNextOption, help: "Async reads to measure: value, lookup, loader.") var apis: [AsyncRead] = AsyncRead.allCases
    @Flag(help: "Every async disk read on an I/O thread (Configuration.inlineResidentDiskReads = false).") var noInlineReads = false
    @Option(help: "Stores per store row (new keys, both tiers; a quarter of it at 1 task); 0: no store rows.") var stores = 10_000
    @Flag(help: "Every async store on an I/O thread (Configuration.inlineDiskStores = false).") var noInlineStores = false
    @Option(help: "Parent directory for the cache directory (removed afterwards).") var workDirectory: String?

    /// Every workload parameter, for the JSON report.
    var config: [String: JSONValue] {
        [
            "tasks": .array(tasks.map { .int($0) }), "keys": .int(keys), "value_size": .int(valueSize), "gets": .int(gets),
            "seed": .int(Int(truncatingIfNeeded: seed)), "entries": .string("disk-only (every read a disk hit)"),
            "apis": .array(apis.map { .string($0.rawValue) }), "inline_resident_disk_reads": .bool(!noInlineReads),
            "stores": .int(stores), "inline_disk_stores": .bool(!noInlineStores),
        ]
    }
}

/// The async reads `disk-tasks` measures, each a row beside the synchronous read.
enum AsyncRead: String, CaseIterable, ExpressibleByArgument, Sendable {
    case value, lookup, loader

    /// The row's system name.
    var system: String {
        switch self {
        case .value: "magpie-async"
        case .lookup: "magpie-async-lookup"
        case .loader: "magpie-loader"
        }
    }
}

struct DiskTasksScenario {
    let options: DiskTasksOptions

    func run(progress: (String) -> Void) async throws -> [BenchResult] {
        let parent = options.workDirectory ?? NSTemporaryDirectory()
        let directory = (parent as NSString).appendingPathComponent("magpie-bench-disk-tasks-\(getpid())")
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let values = DiskValues(size: options.valueSize, seed: options.seed)
        let keyNames = (0..<options.keys).map { values.key($0) }
        let digest = KeyHash(seed: 0)
        let digests = (0..<options.keys).map { digest.hash(values.value($0)) }
        // Room for every value read and stored, twice over: a stored key read back must be there.
        let stored = options.tasks.reduce(0) { $0 + 2 * ($1 == 1 ? options.stores / 4 : options.stores) }
        let perValue = values.totalBytes(options.keys) / max(1, options.keys) + 256
        var configuration = Cache.Configuration(
            directory: directory, memoryBudget: 1 << 20,
            diskBudget: max(64 << 20, (values.totalBytes(options.keys) + stored * perValue) * 2))
        configuration.metrics = nil
        configuration.inlineResidentDiskReads = !options.noInlineReads
        configuration.inlineDiskStores = !options.noInlineStores
        let cache = try Cache(configuration)
        progress("disk-tasks: storing \(options.keys) values of \(options.valueSize) bytes, disk-only")
        let diskOnly = EntryOptions(tiers: .diskOnly)
        for i in 0..<options.keys { try cache.set(values.value(i), forKey: keyNames[i], options: diskOnly) }
        try cache.flush()

        let keys = options.keys
        let seed = options.seed
        @Sendable func key(_ i: Int) -> Int { Int(truncatingIfNeeded: splitmix64(seed ^ 0x7A5C &+ UInt64(i)) % UInt64(keys)) }
        let check: @Sendable (Int, [UInt8]?) -> Bool = { i, value in value.map { digest.hash($0) == digests[key(i)] } ?? false }
        var results: [BenchResult] = []
        for tasks in options.tasks {
            let count = tasks == 1 ? options.gets / 4 : options.gets
            progress("disk-tasks: \(tasks) task(s), the synchronous read in the task ×\(count)")
            results.append(
                try await row("magpie-sync", tasks: tasks, count: count, check: check) { i in try cache.value(forKey: keyNames[key(i)]) })
            for api in options.apis {
                progress("disk-tasks: \(tasks) task(s), \(api.system) ×\(count)")
                let inlineBefore = cache.statistics.inlineDiskReads
                var async: BenchResult
                switch api {
                case .value:
                    async = try await row(api.system, tasks: tasks, count: count, check: check) { i in
                        try await cache.async.value(forKey: keyNames[key(i)])
                    }
                case .lookup:
                    async = try await row(api.system, tasks: tasks, count: count, check: check) { i in
                        try await cache.async.lookup(keyNames[key(i)])?.value
                    }
                case .loader:
                    async = try await row(api.system, tasks: tasks, count: count, check: check) { i in
                        try await cache.value(forKey: keyNames[key(i)]) { throw BenchError("the loader ran for a key on disk") }
                    }
                }
                async.extra["inline_reads"] = .int(Int(cache.statistics.inlineDiskReads - inlineBefore))
                results.append(async)
            }
        }
        let hits = cache.statistics.disk?.hits ?? 0
        let reads = results.reduce(0) { $0 + $1.operations }
        guard hits >= UInt64(reads) else { throw BenchError("\(hits) disk hits for \(reads) reads: some reads did not reach the disk tier") }
        if options.stores > 0 { results += try await storeRows(cache, values: values, progress: progress) }
        try cache.close()
        return results
    }

    /// The store rows: per concurrency, the synchronous `set` in the task, then `cache.async.set`, each of new
    /// keys (`s<row>-<i>`, value `i % keys` of the workload's kind); then every stored key read back.
    private func storeRows(_ cache: Cache, values: DiskValues, progress: (String) -> Void) async throws -> [BenchResult] {
        let keys = options.keys
        var results: [BenchResult] = []
        var written: [(prefix: String, count: Int)] = []
        for tasks in options.tasks {
            let count = tasks == 1 ? options.stores / 4 : options.stores
            for (system, inTask) in [("magpie-sync-set", true), ("magpie-async-set", false)] {
                let prefix = "s\(results.count)-"
                progress("disk-tasks: \(tasks) task(s), \(system) ×\(count)")
                let inlineBefore = cache.statistics.inlineDiskStores
                var result = try await row(system, tasks: tasks, count: count, check: { _, stored in stored != nil }) { i in
                    let value = values.value(i % keys)
                    if inTask { try cache.set(value, forKey: prefix + "\(i)") } else { try await cache.async.set(value, forKey: prefix + "\(i)") }
                    return []
                }
                result.extra["workload"] = .string("set")
                if !inTask { result.extra["inline_stores"] = .int(Int(cache.statistics.inlineDiskStores - inlineBefore)) }
                results.append(result)
                written.append((prefix, count))
            }
        }
        progress("disk-tasks: reading the stored keys back")
        try cache.flush()
        var wrong = 0
        var missing = 0
        for (prefix, count) in written {
            for i in 0..<count {
                guard let got = try cache.value(forKey: prefix + "\(i)") else {
                    missing += 1
                    continue
                }
                if got != values.value(i % keys) { wrong += 1 }
            }
        }
        // The disk budget holds every value twice over: nothing stored may be missing.
        guard wrong == 0, missing == 0 else { throw BenchError("stores: \(wrong) wrong and \(missing) missing values read back") }
        return results
    }

    private func row(
        _ system: String, tasks: Int, count: Int, check: @escaping @Sendable (Int, [UInt8]?) -> Bool,
        _ read: @escaping @Sendable (Int) async throws -> [UInt8]?
    ) async throws -> BenchResult {
        let measured = await driveTasks(tasks: tasks, count: count, read, check: check)
        guard measured.tally.errors == 0, measured.tally.found == count else {
            throw BenchError("\(system), \(tasks) tasks: \(count - measured.tally.found) of \(count) reads wrong or missing, \(measured.tally.errors) errors")
        }
        return taskRow("disk-tasks", system, workload: "get", tasks: tasks, count: count, measured)
    }
}

/// The disk-tasks rows as a table: per concurrency, the synchronous read in the task and `cache.async` side
/// by side, each async row's rate over the synchronous row of its concurrency and workload, and the share
/// of its operations done on the caller's task.
func diskTasksTable(_ results: [BenchResult]) -> Table {
    var table = Table(
        "disk-tasks: disk hits (entries stored disk-only) and stores of new keys (both tiers) from async tasks",
        ["tasks", "system", "ops/s", "p50 µs", "p99 µs", "p99.9 µs", "async / sync", "on the task"])
    var sync: [String: Double] = [:]  // "threads workload" -> the synchronous row's ops/s
    for row in results where row.scenario == "disk-tasks" {
        var (ratio, inline) = ("-", "-")
        let workload = "\(row.threads) " + (row.system.hasSuffix("-set") ? "set" : "get")
        if row.system.hasPrefix("magpie-sync") {
            sync[workload] = row.ops_per_sec
        } else if let base = sync[workload] {
            ratio = String(format: "%.2f ×", row.ops_per_sec / base)
        }
        if let done = (row.extra["inline_reads"] ?? row.extra["inline_stores"])?.intValue {
            inline = String(format: "%.2f %%", 100 * Double(done) / Double(max(1, row.operations)))
        }
        table.append([
            String(row.threads), row.system, String(format: "%.0f", row.ops_per_sec), micros(row.latency_ns.p50),
            micros(row.latency_ns.p99), micros(row.latency_ns.p999), ratio, inline,
        ])
    }
    return table
}
