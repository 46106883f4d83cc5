import ArgumentParser
import Foundation
import Histogram
import Magpie

/// The disk scenario: Magpie's disk tier beside RocksDB, LMDB, SQLite, one-file-per-key and URLCache in
/// one process, on the same values: the floors of a get (`Peers/DiskFloors.swift`), set / page-cache-hot get /
/// reopen (`plain`, and `mixed` with sizes of 1–256 KiB), an eviction-heavy workload
/// (`DiskScenario+Evict.swift`), and, not by default, stores at a trickle (`DiskScenario+Trickle.swift`) and
/// gets in alternation (`DiskScenario+Paired.swift`).
struct DiskScenario {
    let options: DiskOptions

    func run(progress: (String) -> Void) throws -> [BenchResult] {
        let values = DiskValues(size: options.valueSize, seed: options.seed)
        let work = options.workDirectory ?? FileManager.default.temporaryDirectory.path
        let root = work + "/magpie-bench-disk-\(getpid())"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        var results: [BenchResult] = []
        /// Measures each system in a directory of its own, removed afterwards.
        func each(_ names: [String], _ what: String, _ measure: (String, String) throws -> [BenchResult]) throws {
            for name in names {
                progress("disk: \(what)\(name)")
                results += try measure(name, root + "/" + name)
                try? FileManager.default.removeItem(atPath: root + "/" + name)
            }
        }
        let evicting = options.systems.filter { Self.evictionSystems.contains($0) }
        if options.workloads.contains("floor") {
            progress("disk: floors (pread, mapped copy, ZSTD_decompress, XXH3 of 4 KiB)")
            results += try DiskFloors(directory: root, samples: options.floorSamples, seed: options.seed).measure(values: values)
        }
        if options.workloads.contains("plain") {
            progress("disk: zstd -1 reference ratio over the same values")
            let reference = try zstdReference(values, keys: options.keys)
            try each(options.systems, "") { try measure($0, directory: $1, values: values, plan: plainPlan($0), reference: reference) }
        }
        if options.workloads.contains("evict") {
            try each(evicting, "eviction-heavy, ") { [try measureEviction($0, directory: $1, values: values)] }
        }
        if options.workloads.contains("mixed") {
            let mixed = DiskValues(size: options.mixedMin, maxSize: options.mixedMax, seed: options.seed)
            let reference = try zstdReference(mixed, keys: options.mixedKeys)
            let plan = Plan(keys: options.mixedKeys, gets: options.mixedKeys * 5, budget: options.mixedBudget, prefix: "disk-mixed")
            try each(evicting, "mixed sizes, ") { try measure($0, directory: $1, values: mixed, plan: plan, reference: reference) }
        }
        if options.workloads.contains("paired") {
            results += try measurePaired(root: root, values: values, progress: progress)
        }
        if options.workloads.contains("trickle") {
            let rates = options.trickleRates.map(String.init).joined(separator: ", ")
            try each(["none"] + evicting, "stores at a trickle (\(rates) per s), ") { try measureTrickle($0, directory: $1, values: values) }
        }
        return results
    }

    /// The systems of the eviction-heavy and mixed workloads: the stores a user would choose among
    /// (file-per-key and URLCache are too slow to run them in a useful time).
    static let evictionSystems: Set = ["magpie", "rocksdb", "lmdb", "sqlite"]

    /// Sizes of one set / get / reopen measurement.
    struct Plan {
        var keys: Int
        var gets: Int
        var budget: Int
        var prefix = "disk"
    }

    private func plainPlan(_ name: String) -> Plan {
        var plan = Plan(keys: options.keys, gets: options.gets, budget: options.effectiveBudget)
        if name == "URLCache" {
            plan.keys = min(plan.keys, options.urlcacheOps)
            plan.gets = min(plan.gets, options.urlcacheOps)
        } else if name == "file-per-key" {
            plan.keys = min(plan.keys, options.fileperkeyKeys ?? plan.keys)
        }
        return plan
    }

    /// zstd level 1 on each value on its own (what a per-blob compressor can reach), as original / compressed.
    private func zstdReference(_ values: DiskValues, keys: Int) throws -> Double {
        let compressor = try ZstdCompressor(level: 1)
        var original = 0
        var compressed = 0
        for i in 0..<min(keys, 2000) {
            let value = values.value(i)
            original += value.count
            compressed += try compressor.compress(value).count
        }
        return compressed == 0 ? 1 : Double(original) / Double(compressed)
    }

    func open(_ name: String, _ directory: String, budget: Int) throws -> any DiskSystem {
        switch name {
        case "magpie":
            return try MagpieDisk(
                directory: directory, budget: budget, level: options.level == 0 ? nil : options.level,
                buckets: options.buckets, reinsertionThreshold: options.reinsertionThreshold, hugePages: options.hugePages)
        case "rocksdb": return try RocksDBDisk(directory: directory, budget: budget)
        case "lmdb": return try LMDBDisk(directory: directory, budget: budget)
        case "sqlite": return try SQLiteDisk(directory: directory, budget: budget)
        case "file-per-key": return FilePerKey(directory: directory, budget: budget)
        default: return URLCacheDisk(directory: directory, budget: budget)
        }
    }

    private func measure(
        _ name: String, directory: String, values: DiskValues, plan: Plan, reference: Double
    ) throws -> [BenchResult] {
        let keys = plan.keys
        let gets = plan.gets
        var system = try open(name, directory, budget: plan.budget)

        // Set phase: every key once, in order. Device writes counted from here to the close below.
        let writesBefore = ProcessIO.current()
        let cpuBefore = processCPUSeconds()
        var setLatency = latencyHistogram()
        var failures = 0
        var setNanoseconds: UInt64 = 0
        var storedBytes = 0
        // Each value's XXH3 digest, to verify reads without regenerating values between timed reads.
        let digest = KeyHash(seed: 0)
        var digests = [UInt64](repeating: 0, count: keys)
        let names = (0..<keys).map { values.key($0) }
        for i in 0..<keys {
            let key = names[i]
            let value = values.value(i)
            digests[i] = digest.hash(value)
            storedBytes += key.utf8.count + value.count
            let start = nowNanoseconds()
            if !system.set(value, key: key) { failures += 1 }
            let elapsed = nowNanoseconds() - start
            setNanoseconds += elapsed
            _ = setLatency.record(elapsed)
        }
        let setSeconds = Double(setNanoseconds) / 1e9
        // CPU of every thread of the process (background flushes and compactions too) over the set phase.
        let setCPU = processCPUSeconds() - cpuBefore

        // Get phase: uniform random keys, page-cache hot; JSON (even) and random (odd) values apart.
        var textLatency = latencyHistogram()
        var randomLatency = textLatency
        var allLatency = textLatency
        // Hits alone: a store that evicted part of the keys (LMDB's pages hold less than the budget's
        // worth) answers its misses faster, which would flatter its percentiles.
        var textHitLatency = textLatency
        var randomHitLatency = textLatency
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
                if i % 2 == 0 { _ = textHitLatency.record(elapsed) } else { _ = randomHitLatency.record(elapsed) }
                if digest.hash(got) != digests[i] { wrong += 1 }
            }
        }
        let getSeconds = Double(getNanoseconds) / 1e9
        var extra = system.extra()
        extra["configuration"] = .string(system.configuration)
        extra["du_bytes"] = .int(directoryBytes(directory))
        let mappings = hugePageMappings(under: directory)
        extra["mapped_resident_bytes"] = .int(mappings.resident)
        extra["huge_page_mapped_bytes"] = .int(mappings.pmdMapped)
        extra["budget_bytes"] = .int(plan.budget)
        extra["slack_bytes"] = .int(system.slackBytes)
        extra["zstd1_reference_ratio"] = .double(reference)
        extra["set_failures"] = .int(failures)
        if let maxSize = values.maxSize { extra["value_sizes"] = .string("\(values.size)-\(maxSize) log-uniform") }

        // Reopen phase: close, open again, first get.
        system.close()
        let written = ProcessIO.current().deviceWrites(since: writesBefore)
        var setExtra = extra
        setExtra["device_write_bytes"] = .int(written)
        setExtra["stored_bytes"] = .int(storedBytes)
        setExtra["process_cpu_seconds"] = .double(setCPU)
        setExtra["process_cpu_us_per_op"] = .double(setCPU * 1e6 / Double(max(keys, 1)))
        setExtra["write_amplification"] = .double(Double(written) / Double(max(storedBytes, 1)))
        // The closed instance is released after the timing, not by the assignment inside it: freeing the
        // previous process's objects is no part of opening (and a restarted service has none to free).
        let closed = system
        let reopenStart = nowNanoseconds()
        system = try open(name, directory, budget: plan.budget)
        let reopenNanoseconds = nowNanoseconds() - reopenStart
        withExtendedLifetime(closed) {}
        let firstStart = nowNanoseconds()
        let first = system.get(values.key(keys / 2))
        let firstGet = nowNanoseconds() - firstStart
        var reopenExtra: [String: JSONValue] = [
            "configuration": .string(system.configuration), "entries_stored": .int(keys),
            "open_seconds": .double(Double(reopenNanoseconds) / 1e9), "first_get_ns": .int(Int(firstGet)),
            "first_get_hit": .bool(first == values.value(keys / 2)),
        ]
        if let magpie = system as? MagpieDisk {
            extra["buckets_opened_from_snapshot"] = .int(magpie.tier.statistics.bucketsOpenedFromSnapshot)
            reopenExtra["buckets_opened_from_snapshot"] = extra["buckets_opened_from_snapshot"]
        }
        system.close()
        if name == "magpie" {
            // The after-a-crash path: no snapshots, every record read and verified.
            let buckets = directory + "/buckets"
            for file in (try? FileManager.default.contentsOfDirectory(atPath: buckets)) ?? [] where file.hasSuffix(".index") {
                try? FileManager.default.removeItem(atPath: buckets + "/" + file)
            }
            // The open itself reads no index (the buckets load after it): timed until every bucket has
            // been scanned, which `statistics` waits for.
            let scanStart = nowNanoseconds()
            let scanned = try open(name, directory, budget: plan.budget)
            if let magpie = scanned as? MagpieDisk { _ = magpie.tier.statistics }
            extra["reopen_scan_seconds"] = .double(Double(nowNanoseconds() - scanStart) / 1e9)
            reopenExtra["reopen_scan_seconds"] = extra["reopen_scan_seconds"]
            scanned.close()
        }

        var getExtra = extra
        getExtra["get_text_latency_ns"] = Percentiles(textLatency).json
        getExtra["get_random_latency_ns"] = Percentiles(randomLatency).json
        getExtra["get_text_hit_latency_ns"] = Percentiles(textHitLatency).json
        getExtra["get_random_hit_latency_ns"] = Percentiles(randomHitLatency).json
        getExtra["wrong_values"] = .int(wrong)
        getExtra["reopen_seconds"] = .double(Double(reopenNanoseconds) / 1e9)
        getExtra["first_get_after_reopen_ns"] = .int(Int(firstGet))
        getExtra["first_get_after_reopen_hit"] = reopenExtra["first_get_hit"]
        let reopenSeconds = Double(reopenNanoseconds + firstGet) / 1e9
        let reopenLatency = Percentiles(
            p50: reopenNanoseconds + firstGet, p90: reopenNanoseconds + firstGet, p99: reopenNanoseconds + firstGet,
            p999: reopenNanoseconds + firstGet, max: reopenNanoseconds + firstGet)
        return [
            BenchResult(
                scenario: plan.prefix + "-set", system: name, threads: 1, operations: keys, seconds: setSeconds,
                ops_per_sec: Double(keys) / setSeconds, latency_ns: Percentiles(setLatency), hit_ratio: 0, extra: setExtra),
            BenchResult(
                scenario: plan.prefix + "-get", system: name, threads: 1, operations: gets, seconds: getSeconds,
                ops_per_sec: gets == 0 ? 0 : Double(gets) / getSeconds, latency_ns: Percentiles(allLatency),
                hit_ratio: gets == 0 ? 0 : Double(hits) / Double(gets), extra: getExtra),
            BenchResult(
                scenario: plan.prefix + "-reopen", system: name, threads: 1, operations: 1, seconds: reopenSeconds,
                ops_per_sec: 1 / max(reopenSeconds, 1e-9), latency_ns: reopenLatency,
                hit_ratio: first == nil ? 0 : 1, extra: reopenExtra),
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

/// User + system CPU seconds of the whole process (all threads), from `getrusage`.
func processCPUSeconds() -> Double { Double(cpuNanoseconds(children: false)) / 1e9 }

/// The process's I/O counters from `/proc/self/io` (all its threads): `write_bytes` is what it caused to
/// be sent to the storage layer (counted when a page cache page turns dirty), `cancelled_write_bytes`
/// what it then truncated or deleted before writeback.
struct ProcessIO {
    var writeBytes = 0
    var cancelledWriteBytes = 0

    static func current() -> ProcessIO {
        var io = ProcessIO()
        guard let text = try? String(contentsOfFile: "/proc/self/io", encoding: .utf8) else { return io }
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":").map { $0.trimmingCharacters(in: .whitespaces) }
            guard fields.count == 2, let value = Int(fields[1]) else { continue }
            if fields[0] == "write_bytes" { io.writeBytes = value }
            if fields[0] == "cancelled_write_bytes" { io.cancelledWriteBytes = value }
        }
        return io
    }

    /// Bytes written to the device since `earlier`: write_bytes less cancelled_write_bytes.
    func deviceWrites(since earlier: ProcessIO) -> Int {
        max(0, (writeBytes - earlier.writeBytes) - (cancelledWriteBytes - earlier.cancelledWriteBytes))
    }
}
