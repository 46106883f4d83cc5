import ArgumentParser
import Foundation

/// Options of the disk scenario.
struct DiskOptions: ParsableArguments {
    static let knownSystems = ["magpie", "rocksdb", "lmdb", "sqlite", "file-per-key", "URLCache"]
    static let knownWorkloads = ["floor", "plain", "evict", "mixed", "trickle", "paired"]
    /// The workloads run when none are named (`trickle` takes seconds of wall time per rate and system).
    static let defaultWorkloads = ["floor", "plain", "evict", "mixed"]

    @Option(help: "Distinct keys written in the set phase.") var keys = 100_000
    @Option(help: "Value size in bytes (half the values JSON-like text, half random bytes).") var valueSize = 4096
    @Option(help: "Disk budget in bytes; default: room for every value, uncompressed, plus 25 %.") var budget: Int?
    @Option(help: "Random gets in the get phase (uniform over the keys, page-cache hot).") var gets = 200_000
    @Option(help: "Seed of the values and the get sequence.") var seed: UInt64 = 42
    @Option(help: "zstd level for Magpie; 0 stores raw.") var level = 1
    @Option(help: "Magpie's reinsertion threshold (DiskTier.Configuration.reinsertionThreshold); default: the tier's.")
    var reinsertionThreshold: Int?
    @Option(help: "Magpie bucket count; default: from the budget.") var buckets: Int?
    @Flag(help: "Magpie with huge pages for its bucket files (DiskTier.Configuration.hugePageFiles = true).")
    var hugePages = false
    @Option(parsing: .upToNextOption, help: "Systems to run (\(knownSystems.joined(separator: ", "))).")
    var systems = knownSystems
    @Option(
        parsing: .upToNextOption,
        help: "Workloads: floor (pread, mapped copy, zstd, XXH3), plain (set / get / reopen), evict, mixed; not run by default: trickle (CPU of stores at a low rate), paired (plain's gets with every system and the zstd floor sampled in turns).")
    var workloads = defaultWorkloads
    @Option(help: "Operations per phase for URLCache (each store costs more as it fills: 500 take about 20 s).")
    var urlcacheOps = 500
    @Option(help: "Keys for file-per-key (about 1,000 stores/s here); default: all of --keys.")
    var fileperkeyKeys: Int?
    @Option(help: "Eviction-heavy workload: the byte budget (the working set is 5 × this).") var evictBudget = 64 << 20
    @Option(help: "Eviction-heavy workload: operations (a Zipf get, and a set on a miss).") var evictOps = 200_000
    @Option(help: "Eviction-heavy workload: Zipf exponent of the reads.") var evictAlpha = 0.9
    @Option(help: "Mixed sizes: keys (values log-uniform between --mixed-min and --mixed-max bytes).") var mixedKeys = 4000
    @Option(help: "Mixed sizes: smallest value.") var mixedMin = 1024
    @Option(help: "Mixed sizes: largest value.") var mixedMax = 256 << 10
    @Option(help: "Samples per floor (each timed alone).") var floorSamples = 100_000
    @Option(parsing: .upToNextOption, help: "Trickle workload: store rates per second (0: open and idle).")
    var trickleRates = [0, 100, 1000]
    @Option(help: "Trickle workload: seconds per rate.") var trickleSeconds = 3.0
    @Option(help: "Paired workload: operations per system (and per floor) in each turn (shorter turns cool each system's CPU caches for the next).")
    var pairedBlock = 20_000
    @Option(help: "Paired workload: rounds (each gives every system and floor one turn).") var pairedRounds = 40
    @Option(help: "Parent directory for the cache directories (removed afterwards).") var workDirectory: String?

    var effectiveBudget: Int { budget ?? keys * (valueSize + 256) * 5 / 4 }

    /// The eviction workload's key count: working set = 5 × its budget, in uncompressed values.
    var evictKeys: Int { max(1, 5 * evictBudget / max(valueSize, 1)) }

    /// The mixed workload's budget: every value, uncompressed, plus 25 % (nothing is evicted).
    var mixedBudget: Int { DiskValues(size: mixedMin, maxSize: mixedMax, seed: seed).totalBytes(mixedKeys) * 5 / 4 }

    func validate() throws {
        guard keys > 0, valueSize >= 0, gets >= 0 else { throw ValidationError("--keys, --value-size, --gets must be positive") }
        guard trickleRates.allSatisfy({ $0 >= 0 && $0 <= 1_000_000 }), trickleSeconds > 0, trickleSeconds <= 3600 else {
            throw ValidationError("--trickle-rates must be 0–1,000,000 per second, --trickle-seconds 0–3600")
        }
        guard evictBudget > 0, evictOps >= 0, mixedKeys > 0, mixedMin > 0, mixedMax >= mixedMin, floorSamples > 0, pairedBlock > 0, pairedRounds > 0 else {
            throw ValidationError("--evict-budget, --evict-ops, --mixed-*, --floor-samples, --paired-* must be positive")
        }
        for s in systems where !Self.knownSystems.contains(s) {
            throw ValidationError("unknown system \(s); known: \(Self.knownSystems)")
        }
        for w in workloads where !Self.knownWorkloads.contains(w) {
            throw ValidationError("unknown workload \(w); known: \(Self.knownWorkloads)")
        }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("disk"), "keys": .int(keys), "value_size": .int(valueSize),
            "budget_bytes": .int(effectiveBudget), "gets": .int(gets), "seed": .int(Int(seed)), "zstd_level": .int(level),
            "buckets": buckets.map { .int($0) } ?? .string("default"), "huge_page_files": .bool(hugePages), "urlcache_ops": .int(urlcacheOps),
            "fileperkey_keys": .int(min(fileperkeyKeys ?? keys, keys)),
            "systems": .array(systems.map { .string($0) }), "workloads": .array(workloads.map { .string($0) }),
            "values": .string("even keys JSON-like text, odd keys random bytes"),
            "evict_budget_bytes": .int(evictBudget), "evict_keys": .int(evictKeys), "evict_ops": .int(evictOps),
            "evict_alpha": .double(evictAlpha), "mixed_keys": .int(mixedKeys), "mixed_min": .int(mixedMin),
            "mixed_max": .int(mixedMax), "mixed_budget_bytes": .int(mixedBudget), "floor_samples": .int(floorSamples),
            "trickle_rates": .array(trickleRates.map { .int($0) }), "trickle_seconds": .double(trickleSeconds),
            "paired_block": .int(pairedBlock), "paired_rounds": .int(pairedRounds),
        ]
    }
}

/// Deterministic values: even keys are JSON-like records (compressible), odd keys random bytes. With a
/// `maxSize`, each key's size is drawn log-uniformly between `size` and `maxSize`.
struct DiskValues {
    let size: Int
    var maxSize: Int? = nil
    let seed: UInt64

    func key(_ i: Int) -> String { "user:\(i):profile" }

    func size(_ i: Int) -> Int {
        guard let maxSize, maxSize > size else { return size }
        let u = Double(splitmix64(seed ^ 0x5123 &+ UInt64(i)) >> 11) * (1.0 / 9_007_199_254_740_992.0)
        return min(maxSize, Int(Double(size) * pow(Double(maxSize) / Double(size), u)))
    }

    func totalBytes(_ keys: Int) -> Int { (0..<keys).reduce(0) { $0 + size($1) } }

    func value(_ i: Int) -> [UInt8] {
        let size = size(i)
        var state = splitmix64(seed &+ UInt64(i))
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size + 200)
        if i % 2 == 1 {
            while bytes.count < size {
                state = splitmix64(state)
                withUnsafeBytes(of: state) { bytes.append(contentsOf: $0) }
            }
        } else {
            var line = 0
            while bytes.count < size {
                state = splitmix64(state)
                let record = #"{"id":\#(i),"line":\#(line),"user":"user\#(state % 5000)","email":"u\#(state % 5000)@example.com","score":\#(state % 100_000),"active":\#(state % 2 == 0),"tags":["cache","swift","linux"]},"#
                bytes.append(contentsOf: record.utf8)
                line += 1
            }
        }
        return Array(bytes.prefix(size))
    }
}
