import ArgumentParser
import Foundation
import Magpie

/// `magpie-bench replay TRACE`: a request trace through Magpie's memory tier, disk tier or both (a
/// `Cache`) at one or more budgets, cache-aside (a miss stores the object), with reference policies
/// (exact LRU, FIFO, ARC, S3-FIFO, W-TinyLFU, LIRS, Belady's optimum) over the same trace and budgets.
struct Replay: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replay a request trace through the memory tier, the disk tier or both, beside reference policies.",
        discussion: """
            Budgets are bytes (4194304, 64MiB, 2GB) or a percentage of the trace's working set (1%, 10%). \
            With --charge object-size (the default) an entry is charged exactly its object's size, as \
            simulators such as libCacheSim charge, so miss ratios compare directly with theirs; the stored \
            value is then the object size less the key and the tier's per-entry overhead. With --charge \
            full an entry is charged what Magpie charges in production: object + key + \
            \(MemoryTier.entryOverhead) B. The disk tier stores values raw (no zstd: the replayed bytes are \
            zeros) and, under object-size charging, each record is the object's size (header and key \
            included); a bucket evicts to three quarters of its share, so it holds somewhat less than its \
            budget. --tier both replays a Cache whose memory budget is the budget and whose disk budget is \
            --disk-factor times it; its miss ratio counts misses of both tiers. --tier memory stores, on \
            a miss, a placeholder charged exactly as the value would be but holding no bytes (the same \
            policy decisions, at simulator speed); --store-values stores the bytes instead. References: \
            exact LRU, FIFO, ARC (bytes), S3-FIFO, W-TinyLFU and LIRS as libCacheSim runs them, and \
            Belady's optimum.
            """)

    @Argument(help: "The trace file.") var trace: String
    @Option(help: "Trace format.") var format: Trace.Format = .auto
    @Option(help: "Object size for text traces without sizes.") var defaultSize: UInt32 = 4096
    @Option(parsing: .upToNextOption, help: "Budgets: bytes, with KiB/MiB/GiB/KB/MB/GB, or % of the working set.")
    var budget: [String] = ["1%", "10%"]
    @Option(help: "What an entry is charged: object-size or full.") var charge: Charge = .objectSize
    @Option(help: "Memory tier shards (1: one global policy, as simulators have).") var shards = 1
    @Option(help: "Key hash seed of the tier replayed: it decides which shard and bucket a key lands in.")
    var hashSeed: UInt64 = 1
    @Option(
        help: ArgumentHelp(
            "Replay Magpie with this many hash seeds (--hash-seed, then the next ones) and report the spread.",
            discussion: """
                A seed decides which keys share a ghost group, a sketch counter or a shard, so Magpie's miss \
                ratio moves with it (a cache directory or tier picks a random one); the reference policies have \
                no seed. The table then shows the first seed's miss ratio and the mean, lowest and highest over \
                the seeds; the JSON row keeps the first seed's figures and adds every seed's miss ratio. \
                --hits-directory records the first seed's hits.
                """))
    var seeds = 1
    @Flag(help: "With --tier memory: store each missed object's bytes instead of a placeholder charged the same.")
    var storeValues = false
    @Option(help: "What to replay through: memory, disk or both.") var tier: TierChoice = .memory
    @Option(help: "With --tier both: the disk budget as a multiple of the memory budget.") var diskFactor = 10.0
    @Option(help: "Parent directory for disk-tier directories (removed afterwards).") var workDirectory: String?
    @Option(help: "With --tier disk: the disk tier's reinsertion threshold (DiskTier.Configuration); default: the tier's.")
    var reinsertionThreshold: Int?
    @Option(
        parsing: .upToNextOption, help: "Reference policies to run (LRU, FIFO, ARC, S3-FIFO, W-TinyLFU, LIRS, Belady).")
    var references: [String] = ReferencePolicy.allCases.map(\.rawValue)
    @Option(
        help: ArgumentHelp(
            "Write which requests hit, per budget and system, into this directory, and compare each reference "
                + "with Magpie request by request.",
            discussion: """
                Each file (BUDGET-SYSTEM.hits; a budget of 10% is named 10pct) holds a byte per request of the \
                trace, in order: 1 for a hit, 0 for a miss. A second table then counts, per budget and reference, \
                the requests only the reference hit and those only Magpie hit, and per tenth of the trace the first \
                less the second (positive: the reference ahead there): where in the trace a policy gains or loses \
                its lead (a warm-up, a scan, a phase change). Recording adds a byte's append per request to the \
                timed replay.
                """))
    var hitsDirectory: String?
    @OptionGroup var outputOptions: OutputOptions

    enum TierChoice: String, ExpressibleByArgument { case memory, disk, both }

    enum Charge: String, ExpressibleByArgument {
        case objectSize = "object-size"
        case full
    }

    func validate() throws {
        guard shards >= 1, shards <= MemoryTier.maximumShardCount else { throw ValidationError("--shards out of range") }
        guard diskFactor >= 1 else { throw ValidationError("--disk-factor must be ≥ 1") }
        guard seeds >= 1, seeds <= 10_000 else { throw ValidationError("--seeds must be 1 to 10000") }
        var isDirectory: ObjCBool = false
        if let hitsDirectory, FileManager.default.fileExists(atPath: hitsDirectory, isDirectory: &isDirectory),
            !isDirectory.boolValue
        {
            throw ValidationError("--hits-directory \(hitsDirectory) exists and is not a directory")
        }
        for name in references where ReferencePolicy(rawValue: name) == nil {
            throw ValidationError("unknown reference policy \(name); choose from \(ReferencePolicy.allCases.map(\.rawValue))")
        }
        for text in budget where Self.parseBudget(text, workingSet: 1) == nil {
            throw ValidationError("cannot read the budget \"\(text)\"")
        }
    }

    /// Bytes for "123", "64MiB", "2GB", or "10%" of `workingSet`.
    static func parseBudget(_ text: String, workingSet: Int) -> Int? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed.hasSuffix("%") {
            guard let percent = Double(trimmed.dropLast()), percent > 0 else { return nil }
            return max(1, Int(Double(workingSet) * percent / 100))
        }
        let units: [(String, Double)] = [
            ("KiB", 1024), ("MiB", 1_048_576), ("GiB", 1_073_741_824), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("B", 1),
        ]
        for (suffix, factor) in units where trimmed.hasSuffix(suffix) {
            guard let number = Double(trimmed.dropLast(suffix.count).trimmingCharacters(in: .whitespaces)), number > 0
            else { return nil }
            return Int(number * factor)
        }
        return Int(trimmed).flatMap { $0 > 0 ? $0 : nil }
    }

    func run() throws {
        let (results, rows, comparisons) = try measure()
        for table in [rows] + (comparisons.isEmpty ? [] : [comparisons]) {
            print()
            table.print()
        }
        if let json = outputOptions.json {
            try Report(date: timestamp(), machine: .current(), config: ["replay": .object(config)], results: results)
                .write(to: json)
        }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("replay"), "trace": .string(trace), "format": .string(format.rawValue),
            "budgets": .array(budget.map { .string($0) }), "charge": .string(charge.rawValue), "shards": .int(shards),
            "tier": .string(tier.rawValue), "disk_factor": .double(diskFactor), "store_values": .bool(storeValues),
            "references": .array(references.map { .string($0) }), "hash_seed": .int(Int(truncatingIfNeeded: hashSeed)),
            "seeds": .int(seeds),
        ]
    }

    /// Replays the trace at every budget through the chosen tier and every reference policy: a row per
    /// budget and system (tagged with the trace's file name), and the table.
    /// With --hits-directory, also the request-by-request comparison of each reference with Magpie.
    func measure() throws -> ([BenchResult], Table, Table) {
        progressLine("replay: loading \(trace)")
        let loaded = try Trace.load(trace, format: format, defaultSize: defaultSize)
        progressLine(
            "replay: \(loaded.count) requests, \(loaded.objects) objects, working set \(loaded.workingSetBytes) B "
                + "(\(String(format: "%.1f", Double(loaded.workingSetBytes) / 1_048_576)) MiB)")
        var results: [BenchResult] = []
        var rows = Table(nil, ["budget", "system", "miss ratio", "byte miss ratio", "requests/s"] + (seeds > 1 ? ["over \(seeds) seeds: mean (lowest-highest)"] : []))
        var comparisons = Table(
            nil, ["budget", "reference", "hit by it only", "by Magpie only", "by tenth of the trace: it only − Magpie only"])
        if let hitsDirectory {
            try FileManager.default.createDirectory(atPath: hitsDirectory, withIntermediateDirectories: true)
        }
        for text in budget {
            let bytes = Self.parseBudget(text, workingSet: loaded.workingSetBytes)!
            let label = text.hasSuffix("%") ? "\(text) = \(bytes) B" : "\(bytes) B"
            let system = "magpie-\(tier.rawValue)"
            progressLine("replay: \(system) at \(label)")
            let (outcome, seconds, extra) = try replayTier(loaded, budget: bytes, seed: hashSeed)
            var measured = result(text, bytes, system, outcome, seconds: seconds, loaded)
            measured.extra.merge(extra) { _, new in new }
            var magpieRow = row(label, system, outcome, rate: Double(outcome.requests) / seconds)
            if seeds > 1 {
                // The other seeds replay after the first (whose row, hits and rate stand as they are).
                var ratios = [outcome.missRatio]
                for offset in 1..<UInt64(seeds) {
                    progressLine("replay: \(system) at \(label), hash seed \(hashSeed &+ offset)")
                    ratios.append(try replayTier(loaded, budget: bytes, seed: hashSeed &+ offset).0.missRatio)
                }
                let spread = SeedSpread(ratios)
                measured.extra.merge(spread.json) { _, new in new }
                magpieRow.append(spread.text)
            }
            rows.append(magpieRow)
            if let path = try writeHits(outcome, budget: text, system: system) {
                measured.extra["hits_file"] = .string(path)
            }
            results.append(measured)
            for name in references {
                let policy = ReferencePolicy(rawValue: name)!
                progressLine("replay: \(name) at \(label)")
                let start = nowNanoseconds()
                let reference = policy.replay(loaded, capacity: bytes, recordingHits: hitsDirectory != nil)
                let seconds = Double(nowNanoseconds() - start) / 1e9
                rows.append(row(label, name, reference, rate: nil) + (seeds > 1 ? ["-"] : []))
                var referenceResult = result(text, bytes, name, reference, seconds: seconds, loaded)
                if let path = try writeHits(reference, budget: text, system: name) {
                    referenceResult.extra["hits_file"] = .string(path)
                    let (onlyIt, onlyMagpie, tenths) = Self.compareHits(reference.hits ?? [], outcome.hits ?? [])
                    referenceResult.extra["hit_only_by_reference"] = .int(onlyIt)
                    referenceResult.extra["hit_only_by_magpie"] = .int(onlyMagpie)
                    referenceResult.extra["hit_difference_by_tenth"] = .array(tenths.map { .int($0) })
                    let signed = tenths.map { $0 > 0 ? "+\($0)" : String($0) }.joined(separator: " ")
                    comparisons.append([text, name, String(onlyIt), String(onlyMagpie), signed])
                }
                results.append(referenceResult)
            }
        }
        return (results, rows, comparisons)
    }

    /// With --hits-directory, writes `outcome`'s hits (a byte per request) to BUDGET-SYSTEM.hits there;
    /// returns the path.
    func writeHits(_ outcome: ReplayOutcome, budget: String, system: String) throws -> String? {
        guard let hitsDirectory, let hits = outcome.hits else { return nil }
        let safe = { (text: String) in
            text.replacingOccurrences(of: "%", with: "pct")
                .map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." ? String($0) : "_" }.joined()
        }
        let path = hitsDirectory + "/" + safe(budget) + "-" + safe(system) + ".hits"
        try Data(hits).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// Requests hit by `reference` only and by `magpie` only (equal-length hit records), and per tenth of
    /// the trace the first less the second.
    static func compareHits(_ reference: [UInt8], _ magpie: [UInt8]) -> (Int, Int, [Int]) {
        var onlyReference = 0
        var onlyMagpie = 0
        var tenths = [Int](repeating: 0, count: 10)
        let count = min(reference.count, magpie.count)
        for index in 0..<count where reference[index] != magpie[index] {
            let tenth = index * 10 / count
            if reference[index] != 0 {
                onlyReference += 1
                tenths[tenth] += 1
            } else {
                onlyMagpie += 1
                tenths[tenth] -= 1
            }
        }
        return (onlyReference, onlyMagpie, tenths)
    }

    /// Cache-aside through a fresh memory tier: a hit is a read (it counts for the eviction policy), a
    /// miss stores a value sized per `charge`.
    typealias Measured = (ReplayOutcome, Double, [String: JSONValue])

    /// Runs the trace: `request` gets each request's key and the value a miss stores (zeros, sized
    /// per `charge`: the object's size less `overhead` bytes) and says whether the request hit.
    func drive(
        _ trace: Trace, overhead: Int,
        request: (_ key: UnsafeRawBufferPointer, _ missValue: UnsafeRawBufferPointer) throws -> Bool
    ) rethrows -> (ReplayOutcome, Double) {
        let largest = Int(trace.sizes.max() ?? 0)
        let zeros = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, largest), alignment: 16)
        defer { zeros.deallocate() }
        zeros.initializeMemory(as: UInt8.self, repeating: 0)
        // Options are read once: a property wrapper's getter costs a metadata lookup per call.
        let full = charge == .full
        let (ids, sizes) = (trace.ids, trace.sizes)
        var outcome = ReplayOutcome(recordingHits: hitsDirectory != nil)
        let start = nowNanoseconds()
        for index in ids.indices {
            var id = ids[index].littleEndian
            let size = sizes[index]
            let length = full ? Int(size) : max(0, Int(size) - overhead)
            let value = UnsafeRawBufferPointer(rebasing: zeros[0..<length])
            let hit = try withUnsafeBytes(of: &id) { try request($0, value) }
            outcome.count(size: size, hit: hit)
        }
        return (outcome, Double(nowNanoseconds() - start) / 1e9)
    }

    /// The memory tier alone: a hit is a read (it counts for the eviction policy) without a copy. A
    /// miss stores a placeholder charged as the value (`MemoryTier.simulateRequest`), or with
    /// `--store-values` the value's bytes.
    func replayMagpie(_ trace: Trace, budget: Int, seed: UInt64) throws -> Measured {
        let tier = try MemoryTier(budget: budget, shardCount: shards, hashSeed: seed)
        let overhead = MemoryLayout<UInt64>.size + MemoryTier.entryOverhead
        let (outcome, seconds) =
            if storeValues {
                try drive(trace, overhead: overhead) { key, value in
                    if tier.withValue(forKey: key, { _ in true }) != nil { return true }
                    _ = try tier.set(value, forKey: key)
                    return false
                }
            } else {
                drive(trace, overhead: overhead) { key, value in tier.simulateRequest(forKey: key, valueLength: value.count) }
            }
        return (outcome, seconds, ["refused": .int(Int(tier.statistics.refusals)), "store_values": .bool(storeValues)])
    }

    /// The chosen tier (--tier) replayed with hash seed `seed`.
    func replayTier(_ trace: Trace, budget: Int, seed: UInt64) throws -> Measured {
        switch tier {
        case .memory: try replayMagpie(trace, budget: budget, seed: seed)
        case .disk: try replayDisk(trace, budget: budget, seed: seed)
        case .both: try replayCache(trace, budget: budget, seed: seed)
        }
    }

    /// A fresh directory for a disk replay, removed by the caller.
    func scratchDirectory() -> String {
        (workDirectory ?? NSTemporaryDirectory()) + "/magpie-replay-\(getpid())-\(nowNanoseconds())"
    }

    /// Bucket count for a disk budget: the default, halved while a bucket's share could not hold two
    /// of the trace's largest records.
    func bucketCount(budget: Int, largest: Int) -> Int {
        var count = DiskTier.defaultBucketCount(budget: budget)
        while count > 1 && budget / count < 2 * (largest + 64) { count /= 2 }
        return count
    }

    /// The disk tier alone, raw values; a store the tier refuses (larger than a bucket's share) is a miss.
    func replayDisk(_ trace: Trace, budget: Int, seed: UInt64) throws -> Measured {
        let directory = scratchDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let count = bucketCount(budget: budget, largest: Int(trace.sizes.max() ?? 0))
        // A fixed seed (--hash-seed), as the memory and Cache replays: a random one moved keys between
        // buckets from run to run, and the miss ratio with them (up to 0.4 points on the shared trace).
        var configuration = DiskTier.Configuration(directory: directory, budget: budget, bucketCount: count, compressionLevel: nil, hashSeed: seed)
        if let reinsertionThreshold { configuration.reinsertionThreshold = reinsertionThreshold }
        let tier = try DiskTier(configuration)
        var refused = 0
        // Overhead: a record's 64-byte header and the key.
        let (outcome, seconds) = try drive(trace, overhead: RecordHeader.size + MemoryLayout<UInt64>.size) { key, value in
            if try tier.value(forKey: key) != nil { return true }
            if (try? tier.set(value, forKey: key)) == nil { refused += 1 }
            return false
        }
        let stats = tier.statistics
        try tier.close()
        return (
            outcome, seconds,
            ["buckets": .int(count), "refused": .int(refused), "disk_evictions": .int(Int(stats.evictions)),
             "bytes_on_disk": .int(stats.bytesOnDisk)]
        )
    }

    /// A `Cache`: memory budget `budget`, disk budget `budget` × --disk-factor.
    func replayCache(_ trace: Trace, budget: Int, seed: UInt64) throws -> Measured {
        let directory = scratchDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let diskBudget = Int(Double(budget) * diskFactor)
        var configuration = Cache.Configuration(directory: directory, memoryBudget: budget, diskBudget: diskBudget)
        configuration.memory.shardCount = shards
        configuration.disk?.bucketCount = bucketCount(budget: diskBudget, largest: Int(trace.sizes.max() ?? 0))
        configuration.disk?.compressionLevel = nil
        configuration.hashSeed = seed
        configuration.metrics = nil
        let cache = try Cache(configuration)
        var memoryHits = 0
        let (outcome, seconds) = try drive(trace, overhead: MemoryLayout<UInt64>.size + MemoryTier.entryOverhead) {
            key, value in
            if let hit = try cache.lookup(key) {
                if hit.tier == .memory { memoryHits += 1 }
                return true
            }
            try? cache.set(value, forKey: key)
            return false
        }
        try cache.close()
        return (
            outcome, seconds,
            ["disk_budget_bytes": .int(diskBudget), "memory_hits": .int(memoryHits),
             "disk_hits": .int(outcome.requests - outcome.misses - memoryHits)]
        )
    }

    func row(_ budget: String, _ system: String, _ outcome: ReplayOutcome, rate: Double?) -> [String] {
        [
            budget, system, String(format: "%.4f", outcome.missRatio), String(format: "%.4f", outcome.byteMissRatio),
            rate.map(formatRate) ?? "-",
        ]
    }

    func result(_ budget: String, _ bytes: Int, _ system: String, _ outcome: ReplayOutcome, seconds: Double, _ trace: Trace)
        -> BenchResult
    {
        var result = BenchResult(
            scenario: "replay \(budget)", system: system, threads: 1, operations: outcome.requests, seconds: seconds,
            ops_per_sec: seconds > 0 ? Double(outcome.requests) / seconds : 0, latency_ns: Percentiles.zero,
            hit_ratio: 1 - outcome.missRatio, extra: [:])
        result.extra = [
            "miss_ratio": .double(outcome.missRatio), "byte_miss_ratio": .double(outcome.byteMissRatio),
            "budget_bytes": .int(bytes), "working_set_bytes": .int(trace.workingSetBytes), "objects": .int(trace.objects),
            "charge": .string(charge.rawValue), "trace": .string(URL(fileURLWithPath: self.trace).lastPathComponent),
        ]
        return result
    }
}

/// Magpie's miss ratios over several hash seeds (`replay --seeds`), the first seed's first.
struct SeedSpread {
    let ratios: [Double]

    init(_ ratios: [Double]) { self.ratios = ratios }

    var mean: Double { ratios.reduce(0, +) / Double(max(1, ratios.count)) }
    var lowest: Double { ratios.min() ?? 0 }
    var highest: Double { ratios.max() ?? 0 }

    /// The table's cell: mean (lowest-highest), four digits as the miss ratio column.
    var text: String { String(format: "%.4f (%.4f-%.4f)", mean, lowest, highest) }

    /// The JSON row's additions.
    var json: [String: JSONValue] {
        [
            "miss_ratio_by_seed": .array(ratios.map { .double($0) }), "miss_ratio_mean": .double(mean),
            "miss_ratio_lowest": .double(lowest), "miss_ratio_highest": .double(highest),
        ]
    }
}
