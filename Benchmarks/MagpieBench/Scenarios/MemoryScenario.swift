import ArgumentParser
import Dispatch
import Foundation
import Histogram
import Magpie
import Synchronization

/// Options of the memory scenario. Defaults are the RocksDB peer's workload.
struct MemoryOptions: ParsableArguments {
    @Option(help: "Distinct keys.") var keys = 1_000_000
    @Option(help: "Key size in bytes (≥ 16; the first 16 bytes are the peer's key, the rest zeros).")
    var keySize = 16
    @Option(help: "Value size in bytes.") var valueSize = 100
    @Option(help: "Zipf exponent of key popularity.") var alpha = 0.99
    @Option(help: "Memory budget in bytes (overrides --budget-percent).") var budget: Int?
    @Option(help: "Budget as a percentage of the total key+value bytes.") var budgetPercent = 10.0
    @Option(parsing: .upToNextOption, help: "Thread counts to run.") var threads: [Int] = [1, 2]
    @Option(help: "Timed operations per thread.") var ops = 2_000_000
    @Option(help: "Warm-up operations (one thread) before each timed run.") var warmup = 1_000_000
    @Option(help: "Seed of the warm-up sequence.") var seed: UInt64 = 12345
    @Option(help: "Seed of thread t's sequence is this + t.") var threadSeedBase: UInt64 = 1000
    @Option(help: "Magpie shard count (power of two); default: the tier's default.") var shards: Int?
    @Option(
        parsing: .upToNextOption,
        help: "Systems to run. rocksdb-hcc and rocksdb-lru run the RocksDB peer (see --peer); by default rocksdb-hcc runs when the peer is built.")
    var systems: [String] = ["magpie", "magpie-inplace", "magpie-cache", "mutex-dictionary", "NSCache", "rocksdb-hcc"]
    @Option(
        parsing: .upToNextOption,
        help: "Workloads: zipf (cache-aside over Zipf keys: scenario memory), hot (every thread reads the same --hot-keys keys, uniformly: scenario memory-hotkeys).")
    var workloads: [String] = ["zipf", "hot"]
    @Option(parsing: .upToNextOption, help: "Key counts of the hot-key workload.") var hotKeys: [Int] = [1, 16, 256]
    @Option(help: "The RocksDB peer (Benchmarks/Peers/rocksdb_cache_peer.cc, built by `make peers`); default: .build/peers/rocksdb-cache-peer, found from the working directory or beside this executable's build directory.")
    var peer: String?
    @Option(help: "Operations per thread of the latency pass (every one timed).") var latencyOps: Int?
    @Option(help: "Timed passes per run; ops/s is their median, and their minimum is reported (the first pass gives the hit ratio).")
    var repetitions = 5
    @Option(help: "Timed operations per thread for NSCache (about 50x slower here); one pass, same sequences.")
    var nscacheOps = 300_000
    @Flag(
        inversion: .prefixedNo,
        help: "Measure each (system, threads) in a child process of its own, so one system's heap never shapes another's figures (resident memory above all).")
    var isolate = true

    /// The command-line arguments that reproduce these options for one (workload, system, threads) child.
    func childArguments(workload: MemoryWorkload, system: String, threads: Int, json: String) -> [String] {
        var arguments = [
            "memory", "--keys", "\(keys)", "--key-size", "\(keySize)", "--value-size", "\(valueSize)",
            "--alpha", "\(alpha)", "--budget", "\(effectiveBudget)", "--threads", "\(threads)", "--ops", "\(ops)",
            "--warmup", "\(warmup)", "--seed", "\(seed)", "--thread-seed-base", "\(threadSeedBase)",
            "--systems", system, "--repetitions", "\(repetitions)", "--nscache-ops", "\(nscacheOps)",
            "--no-isolate", "--json", json,
        ] + workload.arguments
        if let shards { arguments += ["--shards", "\(shards)"] }
        if let latencyOps { arguments += ["--latency-ops", "\(latencyOps)"] }
        return arguments
    }

    var effectiveBudget: Int {
        budget ?? Int(Double(keys * (keySize + valueSize)) * budgetPercent / 100)
    }

    func validate() throws {
        guard keys > 0, keys <= Int(UInt32.max) else { throw ValidationError("--keys must be 1...\(UInt32.max)") }
        guard keySize >= 16 else { throw ValidationError("--key-size must be at least 16") }
        guard valueSize >= 1 else { throw ValidationError("--value-size must be at least 1") }
        guard !threads.isEmpty, threads.allSatisfy({ $0 >= 1 }) else { throw ValidationError("--threads must be ≥ 1") }
        guard repetitions >= 1 else { throw ValidationError("--repetitions must be ≥ 1") }
        guard ops >= 1, warmup >= 0 else { throw ValidationError("--ops must be ≥ 1, --warmup ≥ 0") }
        let known = Set(["magpie", "magpie-inplace", "magpie-cache", "mutex-dictionary", "NSCache", "rocksdb-hcc", "rocksdb-lru"])
        for s in systems where !known.contains(s) { throw ValidationError("unknown system \(s); known: \(known.sorted())") }
        for w in workloads where w != "zipf" && w != "hot" { throw ValidationError("unknown workload \(w); known: zipf, hot") }
        guard !workloads.contains("hot") || hotKeys.allSatisfy({ $0 >= 1 && $0 <= keys }) else { throw ValidationError("--hot-keys must be 1...--keys") }
    }

    /// The workloads to run, in order.
    var workloadList: [MemoryWorkload] {
        workloads.flatMap { $0 == "zipf" ? [MemoryWorkload.zipf] : hotKeys.map { MemoryWorkload.hot($0) } }
    }

    /// The RocksDB peer executable: --peer, or the one `make peers` builds, if it exists.
    var peerPath: String? {
        if let peer { return peer }
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let candidates = [
            ".build/peers/rocksdb-cache-peer",
            // .build/<configuration>/magpie-bench → .build/peers
            executable.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("peers/rocksdb-cache-peer").path,
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("memory"), "keys": .int(keys), "key_size": .int(keySize),
            "value_size": .int(valueSize), "zipf_alpha": .double(alpha), "budget_bytes": .int(effectiveBudget),
            "threads": .array(threads.map { .int($0) }), "ops_per_thread": .int(ops), "warmup_ops": .int(warmup),
            "seed": .int(Int(seed)), "thread_seed_base": .int(Int(threadSeedBase)),
            "shards": .int(shards ?? MemoryTier.defaultShardCount),
            "latency_ops_per_thread": .int(latencyOps ?? ops), "latency_sampling": .string("every operation, separate pass"),
            "systems": .array(systems.map { .string($0) }), "repetitions": .int(repetitions),
            "workloads": .array(workloads.map { .string($0) }), "hot_keys": .array(hotKeys.map { .int($0) }),
            "peer": .string(peerPath ?? "not built"),
            "nscache_ops_per_thread": .int(min(nscacheOps, ops)), "isolated_processes": .bool(isolate),
        ]
    }
}

/// A workload of the memory scenario.
enum MemoryWorkload: Hashable, Sendable {
    /// Cache-aside over Zipf(α) keys (scenario `memory`).
    case zipf
    /// Every thread reads the same `n` keys (ranks 0..<n), uniformly (scenario `memory-hotkeys`).
    case hot(Int)

    var scenario: String { self == .zipf ? "memory" : "memory-hotkeys" }
    var hotKeys: Int { if case .hot(let n) = self { n } else { 0 } }
    /// The options that select it in a child run.
    var arguments: [String] { self == .zipf ? ["--workloads", "zipf"] : ["--workloads", "hot", "--hot-keys", "\(hotKeys)"] }
    var label: String { self == .zipf ? "Zipf" : "\(hotKeys) hot keys" }
}

/// The memory scenario: cache-aside over a Zipf workload, and reads of a few hot keys, per system and
/// thread count; the RocksDB peer (a process of its own) in the same run.
struct MemoryScenario {
    let options: MemoryOptions

    func run(progress: (String) -> Void) throws -> [BenchResult] {
        var results: [BenchResult] = []
        let peer = options.peerPath
        var sequences: [MemoryWorkload: Sequences] = [:]
        for workload in options.workloadList {
            for threads in options.threads {
                for system in options.systems {
                    if system.hasPrefix("rocksdb-") {
                        guard let peer else {
                            progress("\(system): the RocksDB peer is not built (`make peers`, or --peer PATH): skipped")
                            continue
                        }
                        progress("\(workload.scenario): \(system), \(workload.label), \(threads) thread(s)")
                        results.append(try runPeer(peer, kind: String(system.dropFirst(8)), workload: workload, threads: threads))
                    } else if options.isolate {
                        results += try runChild(system, workload: workload, threads: threads)
                    } else {
                        if sequences[workload] == nil {
                            progress("\(workload.scenario): generating the \(workload.label) sequences")
                            sequences[workload] = Sequences(options, workload)
                        }
                        progress("\(workload.scenario): \(system), \(workload.label), \(threads) thread(s)")
                        results.append(try runHere(system, workload: workload, sequences: sequences[workload]!, threads: threads))
                    }
                }
            }
        }
        return results
    }

    /// The warm-up and per-thread rank sequences of a workload, generated as the peer generates them.
    struct Sequences {
        let zipf: ZipfWorkload?
        let warmup: [UInt32]
        let threads: [[UInt32]]

        init(_ options: MemoryOptions, _ workload: MemoryWorkload) {
            let maxThreads = options.threads.max() ?? 1
            if case .hot(let n) = workload {
                zipf = nil
                warmup = hotRanks(n, seed: options.seed, count: options.warmup)
                threads = (0..<maxThreads).map { hotRanks(n, seed: options.threadSeedBase + UInt64($0), count: options.ops) }
            } else {
                let workload = ZipfWorkload(keyCount: options.keys, alpha: options.alpha)
                zipf = workload
                warmup = workload.ranks(seed: options.seed, count: options.warmup)
                threads = (0..<maxThreads).map {
                    workload.ranks(seed: options.threadSeedBase + UInt64($0), count: options.ops)
                }
            }
        }
    }

    /// Runs one (workload, system, threads) in a child process of this executable and returns its rows.
    private func runChild(_ system: String, workload: MemoryWorkload, threads: Int) throws -> [BenchResult] {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("magpie-bench-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let json = directory.appendingPathComponent("\(system)-\(threads).json").path
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let (status, _) = try runProcess(executable, options.childArguments(workload: workload, system: system, threads: threads, json: json))
        guard status == 0 else {
            throw ValidationError("child run of \(system) (\(workload.label), \(threads) thread(s)) exited with \(status)")
        }
        let report = try JSONDecoder().decode(Report.self, from: Data(contentsOf: URL(fileURLWithPath: json)))
        return report.results
    }

    private func runHere(_ name: String, workload: MemoryWorkload, sequences: Sequences, threads: Int) throws -> BenchResult {
        let timerOverhead = timerOverheadNanoseconds()
        let baseline = residentBytes()
        var result = try measure(
            name, threads: threads, warmup: sequences.warmup, sequences: Array(sequences.threads.prefix(threads)))
        result.scenario = workload.scenario
        if workload != .zipf { result.extra["hot_keys"] = .int(workload.hotKeys) }
        if case .int(let resident) = result.extra["rss_after_bytes"] {
            result.extra["rss_before_bytes"] = .int(baseline)
            result.extra["rss_growth_bytes"] = .int(resident - baseline)
            result.extra["rss_growth_over_budget"] = .double(
                Double(resident - baseline) / Double(max(1, options.effectiveBudget)))
        }
        result.extra["timer_overhead_ns"] = .int(Int(timerOverhead))
        if let zipf = sequences.zipf { result.extra["top_k_bound_hit_ratio"] = .double(topBound(zipf, result.extra)) }
        return result
    }

    /// The hit ratio of a perfect static cache holding as many entries as the system held at the end.
    private func topBound(_ workload: ZipfWorkload, _ extra: [String: JSONValue]) -> Double {
        if case .int(let entries) = extra["entries"] ?? .int(0) { return workload.topMass(entries) }
        return 0
    }

    /// Dispatches on the concrete system type, so each measurement loop is specialized (an existential
    /// here would put witness-table calls and metadata look-ups inside every operation).
    private func measure(_ name: String, threads: Int, warmup: [UInt32], sequences: [[UInt32]]) throws
        -> BenchResult
    {
        let budget = options.effectiveBudget
        switch name {
        case "magpie":
            let tier = try MemoryTier(budget: budget, shardCount: options.shards)
            return measure(MagpieCopying(tier: tier), threads: threads, warmup: warmup, sequences: sequences)
        case "magpie-inplace":
            let tier = try MemoryTier(budget: budget, shardCount: options.shards)
            return measure(MagpieInPlace(tier: tier), threads: threads, warmup: warmup, sequences: sequences)
        case "magpie-cache":
            var configuration = Cache.Configuration(memoryBudget: budget)
            configuration.memory.shardCount = options.shards
            configuration.metrics = nil
            let cache = try Cache(configuration)
            return measure(MagpieCacheSystem(cache: cache), threads: threads, warmup: warmup, sequences: sequences)
        case "mutex-dictionary":
            return measure(MutexDictionary(), threads: threads, warmup: warmup, sequences: sequences)
        default:
            // The same warm-up and the same sequences, cut short: see --nscache-ops.
            let cap = min(options.nscacheOps, options.ops)
            return measure(
                NSCacheSystem(budget: budget), threads: threads, warmup: warmup,
                sequences: sequences.map { Array($0.prefix(cap)) }, repetitions: 1)
        }
    }

    private func measure(
        _ system: some MemorySystem, threads: Int, warmup: [UInt32], sequences: [[UInt32]], repetitions: Int? = nil
    ) -> BenchResult {
        let keySize = options.keySize
        let valueSize = options.valueSize
        _ = CacheAsideLoop(system: system, keySize: keySize, valueSize: valueSize).run(warmup[...], timing: .none)

        // Throughput passes: no clocks inside the loop. The first pass follows the warm-up directly and
        // gives the hit ratio; the reported rate is the median pass (this machine is shared and noisy).
        let loops = (0..<threads).map { _ in CacheAsideLoop(system: system, keySize: keySize, valueSize: valueSize) }
        let operations = sequences.reduce(0) { $0 + $1.count }
        var hits = 0
        var resident = 0
        var durations: [Double] = []
        for repetition in 0..<(repetitions ?? options.repetitions) {
            let start = nowNanoseconds()
            let passes = parallel(threads) { t in loops[t].run(sequences[t][...], timing: .none) }
            durations.append(Double(nowNanoseconds() - start) / 1e9)
            if repetition == 0 {
                hits = passes.reduce(0) { $0 + $1.hits }
                // Resident memory after the first timed pass, before any histogram is allocated.
                resident = residentBytes()
            }
        }
        let seconds = percentile(50, of: durations)!

        // Latency pass over the same sequences, every operation timed.
        let latencyCount = min(options.latencyOps ?? options.ops, sequences[0].count)
        let timed = parallel(threads) { t in loops[t].run(sequences[t].prefix(latencyCount), timing: .everyOperation) }
        var operation = latencyHistogram()
        var get = operation
        var put = operation
        for pass in timed {
            operation.add(pass.operation)
            get.add(pass.get)
            put.add(pass.put)
        }
        var extra = system.extra()
        extra["rss_after_bytes"] = .int(resident)
        extra["ops_per_sec_passes"] = .array(durations.map { .double(Double(operations) / $0) })
        extra["ops_per_sec_min"] = .double(Double(operations) / durations.max()!)
        extra["get_latency_ns"] = Percentiles(get).json
        extra["put_latency_ns"] = Percentiles(put).json
        extra["latency_hit_ratio"] = .double(Double(timed.reduce(0) { $0 + $1.hits }) / Double(max(1, timed.reduce(0) { $0 + $1.operations })))
        return BenchResult(
            scenario: "memory", system: system.name, threads: threads, operations: operations,
            seconds: seconds, ops_per_sec: Double(operations) / seconds, latency_ns: Percentiles(operation),
            hit_ratio: Double(hits) / Double(operations), extra: extra)
    }
}

/// One thread's cache-aside loop: get; on a miss, fill a value with the rank's byte and put it.
struct CacheAsideLoop<System: MemorySystem>: Sendable {
    enum Timing { case none, everyOperation }

    struct Pass: Sendable {
        var hits = 0
        var operations = 0
        var sink: UInt64 = 0
        var operation = latencyHistogram()
        var get = latencyHistogram()
        var put = latencyHistogram()
    }

    let system: System
    let keySize: Int
    let valueSize: Int

    func run(_ ranks: ArraySlice<UInt32>, timing: Timing) -> Pass {
        var pass = Pass()
        var value = [UInt8](repeating: 0, count: valueSize)
        var keyBytes = [UInt8](repeating: 0, count: keySize)
        for rank in ranks {
            withKey(rank: rank) { key16 in
                keyBytes.withUnsafeMutableBytes { key in
                    key.copyMemory(from: key16)
                    let key = UnsafeRawBufferPointer(key)
                    let t0 = timing == .none ? 0 : nowNanoseconds()
                    let hit = system.get(key, sink: &pass.sink)
                    let t1 = timing == .none ? 0 : nowNanoseconds()
                    if hit {
                        pass.hits += 1
                    } else {
                        value.withUnsafeMutableBytes { v in
                            v.initializeMemory(as: UInt8.self, repeating: UInt8(truncatingIfNeeded: rank))
                            system.put(key, UnsafeRawBufferPointer(v))
                        }
                    }
                    if timing == .everyOperation {
                        let t2 = nowNanoseconds()
                        _ = pass.get.record(t1 - t0)
                        _ = pass.operation.record(t2 - t0)
                        if !hit { _ = pass.put.record(t2 - t1) }
                    }
                }
            }
        }
        pass.operations = ranks.count
        if pass.sink == 42 { FileHandle.standardError.write(" ".data(using: .utf8)!) }
        return pass
    }
}

/// `count` ranks drawn uniformly from 0..<n, as the RocksDB peer draws its hot keys.
func hotRanks(_ n: Int, seed: UInt64, count: Int) -> [UInt32] {
    var state = seed
    return (0..<count).map { _ in
        state = splitmix64(state)
        return UInt32(state % UInt64(n))
    }
}

/// Runs `body(t)` for t in 0..<threads on `threads` threads at once and returns the results in order.
func parallel<T: Sendable>(_ threads: Int, _ body: @Sendable (Int) -> T) -> [T] {
    let results = Mutex<[Int: T]>([:])
    DispatchQueue.concurrentPerform(iterations: threads) { t in
        let value = body(t)
        results.withLock { $0[t] = value }
    }
    return results.withLock { table in (0..<threads).map { table[$0]! } }
}
