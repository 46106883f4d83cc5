import ArgumentParser
import Foundation
import Histogram
import Magpie

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Options of the tiered scenario.
struct TieredOptions: ParsableArguments {
    @Option(help: "Distinct keys (the working set); values as in the disk scenario.") var keys = 20_000
    @Option(help: "Value size in bytes (half JSON-like text, half random bytes).") var valueSize = 4096
    @Option(help: "Memory budget as a percentage of the working set (key + value bytes).") var memoryPercent = 10.0
    @Option(help: "Disk budget as a multiple of the working set.") var diskFactor = 2.0
    @Option(help: "Zipf exponent of key popularity.") var alpha = 0.99
    @Option(help: "Cache-aside gets after the warm-up (timed).") var gets = 200_000
    @Option(help: "Untimed cache-aside gets before them.") var warmup = 20_000
    @Option(help: "Seed of values and key sequences.") var seed: UInt64 = 7
    @Option(help: "zstd level for Magpie's disk tier; 0 stores raw.") var level = 1
    @Option(help: "Keys of the capped workload run on both Magpie and URLCache (URLCache slows as it fills).")
    var urlcacheKeys = 300
    @Option(help: "Gets of the capped workload.") var urlcacheGets = 600
    @Option(help: "Random hits per round of the hit-cost comparison (tier vs façade).") var hitOps = 2_000_000
    @Option(parsing: .upToNextOption, help: "Systems for the capped comparison.") var systems = ["magpie", "URLCache"]
    @Option(help: "Parent directory for the cache directories (removed afterwards).") var workDirectory: String?

    func validate() throws {
        guard keys >= 10, urlcacheKeys >= 10 else { throw ValidationError("--keys and --urlcache-keys must be ≥ 10") }
        guard valueSize >= 1, memoryPercent > 0, diskFactor >= 1.2 else {
            throw ValidationError("--value-size ≥ 1, --memory-percent > 0, --disk-factor ≥ 1.2")
        }
        guard gets >= 1, urlcacheGets >= 1, warmup >= 0, hitOps >= 1000 else {
            throw ValidationError("--gets, --urlcache-gets ≥ 1, --warmup ≥ 0, --hit-ops ≥ 1000")
        }
        for s in systems where !["magpie", "URLCache"].contains(s) { throw ValidationError("unknown system \(s)") }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("tiered"), "keys": .int(keys), "value_size": .int(valueSize),
            "memory_percent": .double(memoryPercent), "disk_factor": .double(diskFactor), "alpha": .double(alpha),
            "gets": .int(gets), "warmup": .int(warmup), "seed": .int(Int(truncatingIfNeeded: seed)), "level": .int(level),
            "urlcache_keys": .int(urlcacheKeys), "urlcache_gets": .int(urlcacheGets), "hit_ops": .int(hitOps),
            "systems": .array(systems.map { .string($0) }),
        ]
    }
}

/// A two-tier cache measured by the tiered scenario.
protocol TieredSystem {
    var name: String { get }
    /// The value and the tier that answered (nil tier when the system cannot tell).
    func get(_ key: String) -> (value: [UInt8]?, tier: CacheHit.Tier?)
    func set(_ value: [UInt8], key: String)
    func extra() -> [String: JSONValue]
}

struct TieredScenario {
    let options: TieredOptions

    func run(progress: (String) -> Void) throws -> [BenchResult] {
        let parent = options.workDirectory ?? NSTemporaryDirectory()
        let values = DiskValues(size: options.valueSize, seed: options.seed)
        var results: [BenchResult] = []
        progress("tiered: magpie, \(options.keys) keys")
        results.append(try measure("magpie", scenario: "tiered", keys: options.keys, gets: options.gets, values: values, parent: parent))
        for system in options.systems {
            progress("tiered-capped: \(system), \(options.urlcacheKeys) keys")
            results.append(
                try measure(
                    system, scenario: "tiered-capped", keys: options.urlcacheKeys, gets: options.urlcacheGets, values: values,
                    parent: parent))
        }
        progress("hit-cost: memory tier vs Cache façade")
        results += try hitCost()
        return results
    }

    private func measure(
        _ name: String, scenario: String, keys: Int, gets: Int, values: DiskValues, parent: String
    ) throws -> BenchResult {
        let directory = parent + "/magpie-tiered-\(name)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let names = (0..<keys).map { values.key($0) }
        let workingSet = names.reduce(0) { $0 + $1.utf8.count + options.valueSize }
        let memoryBudget = Int(Double(workingSet) * options.memoryPercent / 100)
        let diskBudget = Int(Double(workingSet) * options.diskFactor)
        let system: any TieredSystem
        if name == "URLCache" {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            system = URLCacheTiered(cache: URLCache(memoryCapacity: memoryBudget, diskCapacity: diskBudget, diskPath: directory))
        } else {
            var configuration = Cache.Configuration(directory: directory, memoryBudget: memoryBudget, diskBudget: diskBudget)
            configuration.disk?.compressionLevel = options.level == 0 ? nil : options.level
            configuration.hashSeed = options.seed
            configuration.metrics = nil
            system = MagpieTiered(cache: try Cache(configuration))
        }
        let digest = KeyHash(seed: 0)
        let digests = (0..<keys).map { digest.hash(values.value($0)) }
        for i in 0..<keys { system.set(values.value(i), key: names[i]) }  // fill: every key once

        let workload = ZipfWorkload(keyCount: keys, alpha: options.alpha)
        let warmup = workload.ranks(seed: options.seed &+ 1, count: scenario == "tiered" ? options.warmup : 0)
        for rank in warmup where system.get(names[Int(rank)]).value == nil {
            system.set(values.value(Int(rank)), key: names[Int(rank)])
        }
        let ranks = workload.ranks(seed: options.seed &+ 2, count: gets)
        var all = latencyHistogram()
        var memoryHits = latencyHistogram()
        var diskHits = latencyHistogram()
        var missCost = latencyHistogram()
        var hits = 0
        var wrong = 0
        let writesBefore = (system as? MagpieTiered)?.cache.statistics.disk?.writes
        let start = nowNanoseconds()
        for rank in ranks {
            let i = Int(rank)
            let t0 = nowNanoseconds()
            let (value, tier) = system.get(names[i])
            if value == nil { system.set(values.value(i), key: names[i]) }
            let elapsed = nowNanoseconds() - t0
            _ = all.record(elapsed)
            if let value {
                hits += 1
                if digest.hash(value) != digests[i] { wrong += 1 }
                switch tier {
                case .memory: _ = memoryHits.record(elapsed)
                case .disk: _ = diskHits.record(elapsed)
                case .remote, nil: break
                }
            } else {
                _ = missCost.record(elapsed)
            }
        }
        let seconds = Double(nowNanoseconds() - start) / 1e9
        var extra = system.extra()
        if let writesBefore, let writesAfter = (system as? MagpieTiered)?.cache.statistics.disk?.writes {
            // Promotions must not write to disk: only the sets after misses may.
            extra["disk_writes_during_gets"] = .int(Int(writesAfter - writesBefore))
            extra["misses_during_gets"] = .int(gets - hits)
        }
        extra["working_set_bytes"] = .int(workingSet)
        extra["memory_budget_bytes"] = .int(memoryBudget)
        extra["disk_budget_bytes"] = .int(diskBudget)
        extra["wrong_values"] = .int(wrong)
        extra["miss_latency_ns"] = Percentiles(missCost).json
        if name == "magpie" {
            extra["memory_hit_ratio"] = .double(Double(memoryHits.totalCount) / Double(gets))
            extra["disk_hit_ratio"] = .double(Double(diskHits.totalCount) / Double(gets))
            extra["memory_hit_latency_ns"] = Percentiles(memoryHits).json
            extra["promoted_hit_latency_ns"] = Percentiles(diskHits).json
        }
        if let magpie = system as? MagpieTiered { try magpie.cache.close() }
        return BenchResult(
            scenario: scenario, system: name, threads: 1, operations: gets, seconds: seconds,
            ops_per_sec: Double(gets) / seconds, latency_ns: Percentiles(all), hit_ratio: Double(hits) / Double(gets),
            extra: extra)
    }

    /// Random hits on 10,000 resident 100-byte values: the bare `MemoryTier` and a memory-only `Cache` of
    /// the same budget and shards, in alternating rounds (this machine is noisy); the best round of each.
    private func hitCost() throws -> [BenchResult] {
        let keys = 10_000
        let budget = 64 << 20
        let tier = try MemoryTier(budget: budget, shardCount: 16, hashSeed: options.seed)
        var configuration = Cache.Configuration(memoryBudget: budget)
        configuration.memory.shardCount = 16
        configuration.hashSeed = options.seed
        configuration.metrics = nil
        let cache = try Cache(configuration)
        let value = [UInt8](repeating: 7, count: 100)
        var keyBytes = [[UInt8]]()
        for rank in 0..<keys {
            let key = withKey(rank: UInt32(rank)) { [UInt8]($0) }
            keyBytes.append(key)
            _ = try tier.set(value, forKey: key)
            try cache.set(value, forKey: key)
        }
        var state = options.seed
        let order = (0..<options.hitOps).map { _ -> Int32 in
            state = splitmix64(state)
            return Int32(state % UInt64(keys))
        }
        var best = (tier: Double.infinity, cache: Double.infinity)
        var sink: UInt64 = 0
        // Both read the same key arrays: whichever runs second finds them warmer, so the order alternates.
        func timeTier(_ slice: ArraySlice<Int32>) -> UInt64 {
            let t0 = nowNanoseconds()
            for i in slice { sink &+= UInt64(tier.value(forKey: keyBytes[Int(i)])?.first ?? 0) }
            return nowNanoseconds() - t0
        }
        func timeCache(_ slice: ArraySlice<Int32>) -> UInt64 {
            let t0 = nowNanoseconds()
            for i in slice { sink &+= UInt64((try? cache.value(forKey: keyBytes[Int(i)]))??.first ?? 0) }
            return nowNanoseconds() - t0
        }
        for round in 0..<6 {
            let (a, b) = round % 2 == 0 ? (timeTier(order[...]), timeCache(order[...])) : ({ let c = timeCache(order[...]); return (timeTier(order[...]), c) })()
            best.tier = min(best.tier, Double(a) / Double(order.count))
            best.cache = min(best.cache, Double(b) / Double(order.count))
        }
        // Latency: the mean hit time of each batch of 64 (a clock read per hit would cost as much as the hit).
        var tierBatches = latencyHistogram()
        var cacheBatches = tierBatches
        var position = 0
        while position + 64 <= order.count {
            let batch = order[position..<(position + 64)]
            if (position / 64) % 2 == 0 {
                _ = tierBatches.record(timeTier(batch) / 64)
                _ = cacheBatches.record(timeCache(batch) / 64)
            } else {
                _ = cacheBatches.record(timeCache(batch) / 64)
                _ = tierBatches.record(timeTier(batch) / 64)
            }
            position += 64
        }
        precondition(sink == UInt64(order.count * 12 + position * 2) * 7, "every read must hit")
        func row(_ system: String, _ nanoseconds: Double, _ batches: Histogram<UInt64>) -> BenchResult {
            BenchResult(
                scenario: "hit-cost", system: system, threads: 1, operations: order.count,
                seconds: nanoseconds * Double(order.count) / 1e9, ops_per_sec: 1e9 / nanoseconds,
                latency_ns: Percentiles(batches), hit_ratio: 1,
                extra: [
                    "ns_per_hit_best_round": .double(nanoseconds), "cache_over_tier": .double(best.cache / best.tier),
                    "latency_note": .string("percentiles of per-hit means over batches of 64 hits"),
                ])
        }
        return [row("magpie-tier", best.tier, tierBatches), row("magpie-cache", best.cache, cacheBatches)]
    }
}

/// Per-tier figures and the bars' ratios, under the table: lines, no columns.
func tieredTable(_ results: [BenchResult]) -> Table {
    var lines: [String] = []
    for r in results where r.scenario == "tiered" && r.system == "magpie" {
        func number(_ key: String) -> String { r.extra[key]?.numberValue.map { String(format: "%.3f", $0) } ?? "?" }
        func p50(_ key: String) -> String { Percentiles(r.extra[key]).map { "\($0.p50) ns" } ?? "?" }
        lines.append(
            "tiered: memory hit ratio \(number("memory_hit_ratio")), disk \(number("disk_hit_ratio")); "
                + "p50 memory hit \(p50("memory_hit_latency_ns")), promoted hit \(p50("promoted_hit_latency_ns"))")
    }
    let capped = Dictionary(results.filter { $0.scenario == "tiered-capped" }.map { ($0.system, $0.ops_per_sec) }) { a, _ in a }
    if let magpie = capped["magpie"], let urlCache = capped["URLCache"], urlCache > 0 {
        lines.append(String(format: "tiered-capped: magpie / URLCache ops/s = %.1f x", magpie / urlCache))
    }
    if let ratio = results.first(where: { $0.scenario == "hit-cost" })?.extra["cache_over_tier"]?.numberValue {
        lines.append(String(format: "hit-cost: Cache façade / memory tier = %.2f x", ratio))
    }
    return Table(notes: lines)
}
