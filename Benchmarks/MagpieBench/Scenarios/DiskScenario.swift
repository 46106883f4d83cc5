import ArgumentParser
import Foundation
import Histogram
import Magpie

/// Options of the disk scenario.
struct DiskOptions: ParsableArguments {
    @Option(help: "Distinct keys written in the set phase.") var keys = 100_000
    @Option(help: "Value size in bytes (half the values JSON-like text, half random bytes).") var valueSize = 4096
    @Option(help: "Disk budget in bytes; default: room for every value, uncompressed, plus 25 %.") var budget: Int?
    @Option(help: "Random gets in the get phase (uniform over the keys, page-cache hot).") var gets = 200_000
    @Option(help: "Seed of the values and the get sequence.") var seed: UInt64 = 42
    @Option(help: "zstd level for Magpie; 0 stores raw.") var level = 1
    @Option(help: "Magpie bucket count; default: from the budget.") var buckets: Int?
    @Option(parsing: .upToNextOption, help: "Systems to run.") var systems = ["magpie", "file-per-key", "URLCache"]
    @Option(help: "Operations per phase for URLCache (each store costs more as it fills: 500 take about 20 s).")
    var urlcacheOps = 500
    @Option(help: "Keys for file-per-key (about 1,000 stores/s here); default: all of --keys.")
    var fileperkeyKeys: Int?
    @Option(help: "Parent directory for the cache directories (removed afterwards).") var workDirectory: String?

    var effectiveBudget: Int { budget ?? keys * (valueSize + 256) * 5 / 4 }

    func validate() throws {
        guard keys > 0, valueSize >= 0, gets >= 0 else { throw ValidationError("--keys, --value-size, --gets must be positive") }
        let known = Set(["magpie", "file-per-key", "URLCache"])
        for s in systems where !known.contains(s) { throw ValidationError("unknown system \(s); known: \(known.sorted())") }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("disk"), "keys": .int(keys), "value_size": .int(valueSize),
            "budget_bytes": .int(effectiveBudget), "gets": .int(gets), "seed": .int(Int(seed)), "zstd_level": .int(level),
            "buckets": buckets.map { .int($0) } ?? .string("default"), "urlcache_ops": .int(urlcacheOps),
            "fileperkey_keys": .int(min(fileperkeyKeys ?? keys, keys)),
            "systems": .array(systems.map { .string($0) }),
            "values": .string("even keys JSON-like text, odd keys random bytes"),
        ]
    }
}

/// Deterministic values: even keys are JSON-like records (compressible), odd keys random bytes.
struct DiskValues {
    let size: Int
    let seed: UInt64

    func key(_ i: Int) -> String { "user:\(i):profile" }

    func value(_ i: Int) -> [UInt8] {
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

struct DiskScenario {
    let options: DiskOptions

    func run(progress: (String) -> Void) throws -> [BenchResult] {
        let values = DiskValues(size: options.valueSize, seed: options.seed)
        let work = options.workDirectory ?? FileManager.default.temporaryDirectory.path
        let root = work + "/magpie-bench-disk-\(getpid())"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        progress("disk: zstd -1 reference ratio over the same values")
        let reference = try zstdReference(values)
        var results: [BenchResult] = []
        for name in options.systems {
            let directory = root + "/" + name
            progress("disk: \(name)")
            results += try measure(name, directory: directory, values: values, reference: reference)
            try? FileManager.default.removeItem(atPath: directory)
        }
        return results
    }

    /// zstd level 1 on each value on its own (what a per-blob compressor can reach), as original / compressed.
    private func zstdReference(_ values: DiskValues) throws -> Double {
        let compressor = try ZstdCompressor(level: 1)
        var original = 0
        var compressed = 0
        for i in 0..<min(options.keys, 2000) {
            let value = values.value(i)
            original += value.count
            compressed += try compressor.compress(value).count
        }
        return compressed == 0 ? 1 : Double(original) / Double(compressed)
    }

    private func open(_ name: String, _ directory: String) throws -> any DiskSystem {
        switch name {
        case "magpie":
            return try MagpieDisk(
                directory: directory, budget: options.effectiveBudget, level: options.level == 0 ? nil : options.level,
                buckets: options.buckets)
        case "file-per-key":
            return FilePerKey(directory: directory, budget: options.effectiveBudget)
        default:
            return URLCacheDisk(directory: directory, budget: options.effectiveBudget)
        }
    }

    private func measure(_ name: String, directory: String, values: DiskValues, reference: Double) throws -> [BenchResult] {
        var keys = options.keys
        var gets = options.gets
        if name == "URLCache" {
            keys = min(keys, options.urlcacheOps)
            gets = min(gets, options.urlcacheOps)
        } else if name == "file-per-key" {
            keys = min(keys, options.fileperkeyKeys ?? keys)
        }
        var system = try open(name, directory)

        // Set phase: every key once, in order.
        var setLatency = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        var failures = 0
        var setNanoseconds: UInt64 = 0
        // Each value's XXH3 digest, to verify reads without regenerating values between timed reads.
        let digest = KeyHash(seed: 0)
        var digests = [UInt64](repeating: 0, count: keys)
        let names = (0..<keys).map { values.key($0) }
        for i in 0..<keys {
            let key = names[i]
            let value = values.value(i)
            digests[i] = digest.hash(value)
            let start = nowNanoseconds()
            if !system.set(value, key: key) { failures += 1 }
            let elapsed = nowNanoseconds() - start
            setNanoseconds += elapsed
            _ = setLatency.record(elapsed)
        }
        let setSeconds = Double(setNanoseconds) / 1e9

        // Get phase: uniform random keys, page-cache hot; JSON (even) and random (odd) values apart.
        var textLatency = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        var randomLatency = textLatency
        var allLatency = textLatency
        var hits = 0
        var wrong = 0
        var getNanoseconds: UInt64 = 0
        var state = options.seed ^ 0xD15C
        for _ in 0..<gets {
            state = splitmix64(state)
            let i = Int(state % UInt64(keys))
            let key = names[i]
            let start = nowNanoseconds()
            let got = system.get(key)
            let elapsed = nowNanoseconds() - start
            getNanoseconds += elapsed
            _ = allLatency.record(elapsed)
            if i % 2 == 0 { _ = textLatency.record(elapsed) } else { _ = randomLatency.record(elapsed) }
            if let got {
                hits += 1
                if digest.hash(got) != digests[i] { wrong += 1 }
            }
        }
        let getSeconds = Double(getNanoseconds) / 1e9
        var extra = system.extra()
        extra["du_bytes"] = .int(directoryBytes(directory))
        extra["budget_bytes"] = .int(options.effectiveBudget)
        extra["zstd1_reference_ratio"] = .double(reference)
        extra["set_failures"] = .int(failures)

        // Reopen phase: close, open again, first get.
        system.close()
        let reopenStart = nowNanoseconds()
        system = try open(name, directory)
        let reopenSeconds = Double(nowNanoseconds() - reopenStart) / 1e9
        let firstStart = nowNanoseconds()
        let first = system.get(values.key(keys / 2))
        let firstGet = nowNanoseconds() - firstStart
        if let magpie = system as? MagpieDisk {
            extra["buckets_opened_from_snapshot"] = .int(magpie.tier.statistics.bucketsOpenedFromSnapshot)
        }
        system.close()
        if name == "magpie" {
            // The after-a-crash path: no snapshots, every record read and verified.
            let buckets = directory + "/buckets"
            for file in (try? FileManager.default.contentsOfDirectory(atPath: buckets)) ?? [] where file.hasSuffix(".index") {
                try? FileManager.default.removeItem(atPath: buckets + "/" + file)
            }
            let scanStart = nowNanoseconds()
            let scanned = try open(name, directory)
            extra["reopen_scan_seconds"] = .double(Double(nowNanoseconds() - scanStart) / 1e9)
            scanned.close()
        }

        var getExtra = extra
        getExtra["get_text_latency_ns"] = Percentiles(textLatency).json
        getExtra["get_random_latency_ns"] = Percentiles(randomLatency).json
        getExtra["wrong_values"] = .int(wrong)
        getExtra["reopen_seconds"] = .double(reopenSeconds)
        getExtra["first_get_after_reopen_ns"] = .int(Int(firstGet))
        getExtra["first_get_after_reopen_hit"] = .bool(first == values.value(keys / 2))
        return [
            BenchResult(
                scenario: "disk-set", system: name, threads: 1, operations: keys, seconds: setSeconds,
                ops_per_sec: Double(keys) / setSeconds, latency_ns: Percentiles(setLatency), hit_ratio: 0, extra: extra),
            BenchResult(
                scenario: "disk-get", system: name, threads: 1, operations: gets, seconds: getSeconds,
                ops_per_sec: gets == 0 ? 0 : Double(gets) / getSeconds, latency_ns: Percentiles(allLatency),
                hit_ratio: gets == 0 ? 0 : Double(hits) / Double(gets), extra: getExtra),
        ]
    }
}

/// Sum of the sizes of the regular files under `path`.
func directoryBytes(_ path: String) -> Int {
    guard let names = FileManager.default.subpaths(atPath: path) else { return 0 }
    return names.reduce(0) { total, name in
        let attributes = try? FileManager.default.attributesOfItem(atPath: path + "/" + name)
        guard (attributes?[.type] as? FileAttributeType) == .typeRegular else { return total }
        return total + ((attributes?[.size] as? Int) ?? 0)
    }
}
