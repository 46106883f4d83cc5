import ArgumentParser
import Foundation
import Magpie

/// `magpie-bench replay TRACE`: a request trace through Magpie's memory tier at one or more budgets,
/// cache-aside (a miss stores the object), with exact LRU, FIFO and Belady's optimum over the same
/// trace and budgets for reference.
struct Replay: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replay a request trace through the memory tier at several budgets, beside LRU, FIFO and Belady.",
        discussion: """
            Budgets are bytes (4194304, 64MiB, 2GB) or a percentage of the trace's working set (1%, 10%). \
            With --charge object-size (the default) an entry is charged exactly its object's size, as \
            simulators such as libCacheSim charge, so miss ratios compare directly with theirs; the stored \
            value is then the object size less the key and the tier's per-entry overhead. With --charge \
            full an entry is charged what Magpie charges in production: object + key + \
            \(MemoryTier.entryOverhead) B. Only the memory tier is replayed so far.
            """)

    @Argument(help: "The trace file.") var trace: String
    @Option(help: "Trace format.") var format: Trace.Format = .auto
    @Option(help: "Object size for text traces without sizes.") var defaultSize: UInt32 = 4096
    @Option(parsing: .upToNextOption, help: "Budgets: bytes, with KiB/MiB/GiB/KB/MB/GB, or % of the working set.")
    var budget: [String] = ["1%", "10%"]
    @Option(help: "What an entry is charged: object-size or full.") var charge: Charge = .objectSize
    @Option(help: "Memory tier shards (1: one global policy, as simulators have).") var shards = 1
    @Option(parsing: .upToNextOption, help: "Reference policies to run (LRU, FIFO, Belady).")
    var references: [String] = ReferencePolicy.allCases.map(\.rawValue)
    @OptionGroup var outputOptions: OutputOptions

    enum Charge: String, ExpressibleByArgument {
        case objectSize = "object-size"
        case full
    }

    func validate() throws {
        guard shards >= 1, shards <= MemoryTier.maximumShardCount else { throw ValidationError("--shards out of range") }
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
        progressLine("replay: loading \(trace)")
        let loaded = try Trace.load(trace, format: format, defaultSize: defaultSize)
        progressLine(
            "replay: \(loaded.count) requests, \(loaded.objects) objects, working set \(loaded.workingSetBytes) B "
                + "(\(String(format: "%.1f", Double(loaded.workingSetBytes) / 1_048_576)) MiB)")
        var results: [BenchResult] = []
        var rows = [["budget", "system", "miss ratio", "byte miss ratio", "requests/s"]]
        for text in budget {
            let bytes = Self.parseBudget(text, workingSet: loaded.workingSetBytes)!
            let label = text.hasSuffix("%") ? "\(text) = \(bytes) B" : "\(bytes) B"
            progressLine("replay: magpie-memory at \(label)")
            let (outcome, seconds) = try replayMagpie(loaded, budget: bytes)
            rows.append(row(label, "magpie-memory", outcome, rate: Double(outcome.requests) / seconds))
            results.append(result(text, bytes, "magpie-memory", outcome, seconds: seconds, loaded))
            for name in references {
                let policy = ReferencePolicy(rawValue: name)!
                progressLine("replay: \(name) at \(label)")
                let start = nowNanoseconds()
                let reference = policy.replay(loaded, capacity: bytes)
                let seconds = Double(nowNanoseconds() - start) / 1e9
                rows.append(row(label, name, reference, rate: nil))
                results.append(result(text, bytes, name, reference, seconds: seconds, loaded))
            }
        }
        print()
        printAligned(rows)
        if let json = outputOptions.json {
            let config: [String: JSONValue] = [
                "scenario": .string("replay"), "trace": .string(trace), "format": .string(format.rawValue),
                "budgets": .array(budget.map { .string($0) }), "charge": .string(charge.rawValue), "shards": .int(shards),
                "references": .array(references.map { .string($0) }),
            ]
            try Report(date: timestamp(), machine: .current(), config: ["replay": .object(config)], results: results)
                .write(to: json)
        }
    }

    /// Cache-aside through a fresh memory tier: a hit is a read (it counts for the eviction policy), a
    /// miss stores a value sized per `charge`.
    func replayMagpie(_ trace: Trace, budget: Int) throws -> (ReplayOutcome, Double) {
        let tier = try MemoryTier(budget: budget, shardCount: shards, hasher: KeyHash(seed: 1))
        let largest = Int(trace.sizes.max() ?? 0)
        let zeros = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, largest), alignment: 16)
        defer { zeros.deallocate() }
        zeros.initializeMemory(as: UInt8.self, repeating: 0)
        let keyLength = MemoryLayout<UInt64>.size
        var outcome = ReplayOutcome()
        let start = nowNanoseconds()
        for request in 0..<trace.count {
            var id = trace.ids[request].littleEndian
            let size = trace.sizes[request]
            let hit = withUnsafeBytes(of: &id) { key in tier.withValue(forKey: key) { _ in true } } ?? false
            outcome.count(size: size, hit: hit)
            if !hit {
                let length = charge == .full ? Int(size) : max(0, Int(size) - keyLength - MemoryTier.entryOverhead)
                let value = UnsafeRawBufferPointer(rebasing: zeros[0..<length])
                _ = try withUnsafeBytes(of: &id) { key in try tier.set(value, forKey: key) }
            }
        }
        return (outcome, Double(nowNanoseconds() - start) / 1e9)
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
            "charge": .string(charge.rawValue),
        ]
        return result
    }
}
