import Foundation
import Magpie
import MagpieTestSupport
import Testing

// A model-based differential test of `Cache`: long seeded sequences of every public operation
// (stores with per-tier expiry, groups and tiers; reads; removals; group removal; remove all; remove
// expired; time passing; flush; clean and unclean reopen) run against the cache and a plain model.
//
// Invariants after every step:
//   - a read returns nil or exactly the latest value stored for the key and not removed since;
//   - it returns nil when every copy the model knows of has expired;
//   - with budgets roomy enough that nothing is evicted, it returns exactly the model's value while a
//     copy is live;
//   - the memory tier's charge and the bucket files stay within their budgets;
//   - the statistics add up (hits + misses = reads that consulted memory).
// A failure is shrunk (chunks of operations removed while it still fails) and reported with its seed;
// MAGPIE_TEST_SEED replays one seed, MAGPIE_MODEL_OPS lengthens the sequences.

enum ModelOp: CustomStringConvertible, Sendable {
    case set(key: Int, version: Int, length: Int, memory: Int?, disk: Int??, group: Int?, tiers: Tiers)
    case get(key: Int)
    case remove(key: Int)
    case removeAll
    case removeGroup(Int)
    case removeExpired
    case advance(seconds: Int)
    case flush
    case reopen(clean: Bool)

    var description: String {
        switch self {
        case .set(let key, let version, let length, let memory, let disk, let group, let tiers):
            "set(k\(key), v\(version), \(length) B, memory \(memory.map { "\($0)s" } ?? "never"), disk \(disk.map { $0.map { "\($0)s" } ?? "never" } ?? "mirror"), group \(group.map(String.init) ?? "-"), \(tiers))"
        case .get(let key): "get(k\(key))"
        case .remove(let key): "remove(k\(key))"
        case .removeAll: "removeAll"
        case .removeGroup(let group): "removeGroup(\(group))"
        case .removeExpired: "removeExpired"
        case .advance(let seconds): "advance(\(seconds)s)"
        case .flush: "flush"
        case .reopen(let clean): clean ? "close+reopen" : "drop+reopen"
        }
    }

    static func generate(count: Int, keys: Int, using generator: inout SeededGenerator) -> [ModelOp] {
        var version = 0
        return (0..<count).map { _ in
            let key = Int.random(in: 0..<keys, using: &generator)
            switch Int.random(in: 0..<100, using: &generator) {
            case 0..<38:
                version += 1
                let memory: Int? = Bool.random(using: &generator) ? Int.random(in: 1...30, using: &generator) : nil
                let disk: Int?? =
                    switch Int.random(in: 0..<4, using: &generator) {
                    case 0: .none  // mirror memory
                    case 1, 2: .some(Int.random(in: 1...60, using: &generator))
                    default: .some(nil)  // never
                    }
                let group: Int? = Int.random(in: 0..<2, using: &generator) == 0 ? Int.random(in: 0..<3, using: &generator) : nil
                let tiers: Tiers = [.memoryAndDisk, .memoryAndDisk, .memoryAndDisk, .memoryOnly, .diskOnly][Int.random(in: 0..<5, using: &generator)]
                let length = [0, 1, 40, 300, 2000][Int.random(in: 0..<5, using: &generator)]
                return .set(key: key, version: version, length: length, memory: memory, disk: disk, group: group, tiers: tiers)
            case 38..<75: return .get(key: key)
            case 75..<82: return .remove(key: key)
            case 82..<83: return .removeAll
            case 83..<86: return .removeGroup(Int.random(in: 0..<3, using: &generator))
            case 86..<88: return .removeExpired
            case 88..<95: return .advance(seconds: Int.random(in: 1...20, using: &generator))
            case 95..<96: return .flush
            default: return .reopen(clean: Bool.random(using: &generator))
            }
        }
    }
}

/// What the model knows of a key.
private struct ModelEntry {
    var value: [UInt8]
    var group: Int?
    var tiers: Tiers
    /// The memory original's deadline (0 never); nil once it cannot be in memory any more (reopen).
    var memoryDeadline: Int64?
    /// The disk copy's deadline (0 never); nil when there is no disk copy.
    var diskDeadline: Int64?

    func live(_ deadline: Int64?, now: Int64) -> Bool {
        guard let deadline else { return false }
        return deadline == 0 || deadline > now
    }
}

struct CacheModelRun {
    let roomy: Bool
    let keys = 12

    /// Runs `ops`; the first violated invariant, or nil.
    func run(_ ops: [ModelOp]) -> String? {
        let directory = TemporaryDirectory("magpie-model")
        defer { directory.cleanup() }
        let clock = ManualClock()
        let memoryBudget = roomy ? 8 << 20 : 12 << 10
        let diskBudget = roomy ? 32 << 20 : 96 << 10
        func open() throws -> Cache {
            var configuration = Cache.Configuration(directory: directory.path, memoryBudget: memoryBudget, diskBudget: diskBudget)
            configuration.disk?.bucketCount = 4
            configuration.memory.shardCount = 2
            configuration.clock = clock.cacheClock
            configuration.hashSeed = 3
            configuration.metrics = nil
            return try Cache(configuration)
        }
        var model: [Int: ModelEntry] = [:]
        var reads: UInt64 = 0
        do {
            var cache: Cache? = try open()
            for (step, op) in ops.enumerated() {
                let now = clock.now
                func fail(_ text: String) -> String { "step \(step) \(op): \(text)" }
                switch op {
                case .set(let key, let version, let length, let memory, let disk, let group, let tiers):
                    let memoryExpiry: Expiry = memory.map { .after(.seconds($0)) } ?? .never
                    let diskExpiry: Expiry? = disk.map { $0.map { .after(.seconds($0)) } ?? .never }
                    let options = EntryOptions(memoryExpiry: memoryExpiry, diskExpiry: diskExpiry, group: group.map { "g\($0)" }, tiers: tiers)
                    let value = selfDescribingValue(key: key, version: version, length: length)
                    let outcome = Result { () throws(MagpieError) in try cache!.set(value, forKey: "k\(key)", options: options) }
                    if case .failure(let error) = outcome {
                        // Refused as too large: the key keeps its previous value, as the model does.
                        guard error.code == .valueTooLarge else { throw error }
                        break
                    }
                    let memoryDeadline = memory.map { now + Int64($0) * 1000 } ?? 0
                    let diskSeconds = disk ?? memory
                    let diskDeadline = diskSeconds.map { now + Int64($0) * 1000 } ?? 0
                    model[key] = ModelEntry(
                        value: value, group: group, tiers: tiers,
                        memoryDeadline: tiers == .diskOnly ? nil : memoryDeadline,
                        diskDeadline: tiers == .memoryOnly ? nil : diskDeadline)
                case .get(let key):
                    let got = try cache!.value(forKey: "k\(key)")
                    reads += 1
                    let entry = model[key]
                    if let got {
                        guard let entry, got == entry.value else {
                            return fail("read \(got.prefix(24)) but the latest value is \(entry.map { "\($0.value.prefix(24))" } ?? "none")")
                        }
                    }
                    if let entry {
                        let anyLive = entry.live(entry.memoryDeadline, now: now) || entry.live(entry.diskDeadline, now: now)
                        if got != nil && !anyLive { return fail("served a value whose every copy has expired") }
                        if roomy && got == nil && anyLive { return fail("lost a live value although nothing was evicted") }
                    }
                case .remove(let key):
                    try cache!.removeValue(forKey: "k\(key)")
                    model[key] = nil
                case .removeAll:
                    try cache!.removeAll()
                    model.removeAll()
                case .removeGroup(let group):
                    try cache!.removeAll(inGroup: "g\(group)")
                    model = model.filter { $0.value.group != group }
                case .removeExpired:
                    try cache!.removeExpired()
                case .advance(let seconds):
                    clock.advance(seconds: Int64(seconds))
                case .flush:
                    try cache!.flush()
                case .reopen(let clean):
                    if clean { try cache!.close() }
                    cache = nil  // an unclean drop: no close, no snapshot (what a killed process leaves)
                    cache = try open()
                    reads = 0
                    for (key, entry) in model {
                        if entry.tiers == .memoryOnly {
                            model[key] = nil
                        } else {
                            model[key]?.memoryDeadline = nil
                        }
                    }
                }
                let stats = cache!.statistics
                if stats.memory.chargedBytes > memoryBudget { return fail("memory charge \(stats.memory.chargedBytes) > \(memoryBudget)") }
                if let disk = stats.disk, disk.bytesOnDisk > diskBudget { return fail("bucket files \(disk.bytesOnDisk) B > \(diskBudget)") }
                if stats.hits + stats.misses != reads || stats.memory.hits + stats.memory.misses != reads {
                    return fail("statistics do not add up: \(stats.hits) hits + \(stats.misses) misses for \(reads) reads")
                }
            }
            try cache?.close()
        } catch {
            return "unexpected error: \(error)"
        }
        return nil
    }

    /// Removes chunks of operations while the run still fails; returns the smallest failing list found.
    func shrink(_ ops: [ModelOp]) -> [ModelOp] {
        var current = ops
        var chunk = max(1, current.count / 2)
        while chunk >= 1 {
            var start = 0
            var removedAny = false
            while start < current.count {
                var candidate = current
                candidate.removeSubrange(start..<min(current.count, start + chunk))
                if run(candidate) != nil {
                    current = candidate
                    removedAny = true
                } else {
                    start += chunk
                }
            }
            if !removedAny || chunk == 1 { chunk /= 2 } else { chunk = max(1, chunk / 2) }
            if chunk == 0 { break }
        }
        return current
    }
}

@Suite("Cache: model-based differential test")
struct CacheModelTests {
    static var operations: Int { ProcessInfo.processInfo.environment["MAGPIE_MODEL_OPS"].flatMap(Int.init) ?? 600 }

    @Test("random operation sequences against a model: never a stale, removed or expired value; budgets and statistics hold",
        arguments: [false, true])
    func differential(roomy: Bool) {
        let seeds: [UInt64] =
            ProcessInfo.processInfo.environment["MAGPIE_TEST_SEED"].flatMap(UInt64.init).map { [$0] } ?? Array(1...8)
        let runner = CacheModelRun(roomy: roomy)
        for seed in seeds {
            var generator = SeededGenerator(seed: seed)
            let ops = ModelOp.generate(count: Self.operations, keys: runner.keys, using: &generator)
            guard let failure = runner.run(ops) else { continue }
            let minimal = runner.shrink(ops)
            Issue.record(
                """
                seed \(seed) (roomy: \(roomy)) failed: \(failure)
                shrunk to \(minimal.count) operations, failing with: \(runner.run(minimal) ?? "?")
                \(minimal.map(\.description).joined(separator: "\n"))
                replay: MAGPIE_TEST_SEED=\(seed) swift test --filter CacheModelTests
                """)
        }
    }
}
