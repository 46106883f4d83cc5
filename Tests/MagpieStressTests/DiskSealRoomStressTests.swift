import Foundation
import Magpie
import MagpieTestSupport
import Testing

// Issue #58: a store that returned is written. Random stores of 1 B to the largest storable value (noise,
// stored raw, and text, which zstd shrinks; now and then text longer than the largest storable value,
// which fits compressed), interleaved with `flush()` and with reopens (a close that seals what is left,
// or a flush first), so that buckets borrow from each other, a reopen finds shares lent away, and large
// values make the others evict to lend.
//
// Invariants: no store, `flush()` or `close()` throws; no buffered store is lost (`lostBufferedStores`);
// after every `flush()` and every reopen each key reads back exactly its last value, or nothing only if
// the tier evicted something since that store; the directory stays within its budget.
// MAGPIE_TEST_SEED replays one seed, MAGPIE_SEAL_ROOM_OPS lengthens the sequences.

@Suite("Disk tier: every store that returned is written (random sizes, flushes, reopens)")
struct DiskSealRoomStressTests {
    /// Operations per seed: MAGPIE_SEAL_ROOM_OPS, default 120 (CI).
    static var operations: Int { ProcessInfo.processInfo.environment["MAGPIE_SEAL_ROOM_OPS"].flatMap(Int.init) ?? 120 }

    static var seeds: [UInt64] {
        ProcessInfo.processInfo.environment["MAGPIE_TEST_SEED"].flatMap(UInt64.init).map { [$0] } ?? [1, 2, 3]
    }

    /// A key's last store: how to make its value again, and the evictions counted before it.
    struct Stored {
        var text: Bool
        var length: Int
        var seed: UInt64
        var evictionsBefore: UInt64

        var value: [UInt8] { text ? textBytes(length, seed: seed) : noiseBytes(length, seed: seed) }
    }

    /// Whether two values are equal (one `memcmp`: an element-wise `==` of MiBs is slow in a debug build,
    /// and a failed `#expect(a == b)` would print them whole).
    static func same(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count == b.count
            && a.withUnsafeBytes { x in
                b.withUnsafeBytes { y in a.isEmpty || memcmp(x.baseAddress!, y.baseAddress!, a.count) == 0 }
            }
    }

    @Test(
        "stores of 1 B to the largest storable value, with flushes and reopens: every one that returned reads back unless evicted",
        arguments: seeds)
    func storesAreWritten(seed: UInt64) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 16 << 20
        let configuration = DiskTier.Configuration(directory: directory.path, budget: budget, hashSeed: seed)
        var tier = try DiskTier(configuration)
        let largest = tier.largestStorableValue
        var generator = SeededGenerator(seed: seed)
        var model: [Int: Stored] = [:]
        /// Evictions counted by the tiers closed before this one.
        var evictedBefore: UInt64 = 0
        var evictions: UInt64 { evictedBefore + tier.statistics.evictions }

        func check(_ when: String) throws {
            for (key, stored) in model.sorted(by: { $0.key < $1.key }) {
                let got = try tier.value(forKey: keyBytes(key))
                if let got {
                    #expect(
                        Self.same(got, stored.value),
                        "seed \(seed), \(when): key \(key) read \(got.count) B, not its \(stored.length)-byte value")
                } else {
                    #expect(
                        evictions > stored.evictionsBefore,
                        "seed \(seed), \(when): key \(key) (\(stored.text ? "text" : "noise"), \(stored.length) B) lost with nothing evicted"
                    )
                }
            }
            #expect(tier.statistics.lostBufferedStores == 0, "seed \(seed), \(when)")
        }

        for step in 0..<Self.operations {
            let key = Int.random(in: 0..<24, using: &generator)
            switch Int.random(in: 0..<100, using: &generator) {
            case 0..<75:
                let text = Bool.random(using: &generator)
                // Log-uniform, 1 B to the largest storable value; now and then text past it (it fits compressed).
                var length = Int(exp(Double.random(in: 0...log(Double(largest)), using: &generator)).rounded(.down))
                length = min(max(1, length), largest - keyBytes(key).count)
                if text && Int.random(in: 0..<10, using: &generator) == 0 { length = largest + 4096 }
                let stored = Stored(
                    text: text, length: length, seed: seed &* 1_000_003 &+ UInt64(step), evictionsBefore: evictions)
                try tier.set(stored.value, forKey: keyBytes(key))
                model[key] = stored
                let got = try tier.value(forKey: keyBytes(key))
                #expect(
                    got.map { Self.same($0, stored.value) } == true,
                    "seed \(seed), step \(step): key \(key) does not read back at once")
            case 75..<87:
                try tier.flush()
                try check("after the flush at step \(step)")
            case 87..<97:
                if Bool.random(using: &generator) { try tier.flush() }
                try tier.close()
                // Read after the close: the counters of what the close's seals did.
                let statistics = tier.statistics
                #expect(statistics.lostBufferedStores == 0, "seed \(seed), close at step \(step)")
                evictedBefore += statistics.evictions
                #expect(directoryBytes(directory.path) <= budget)
                tier = try DiskTier(configuration)
                try check("after the reopen at step \(step)")
            default:
                if let stored = model[key], let got = try tier.value(forKey: keyBytes(key)) {
                    #expect(Self.same(got, stored.value), "seed \(seed), step \(step): key \(key)")
                }
            }
        }
        try tier.flush()
        try check("at the end")
        try tier.close()
        #expect(directoryBytes(directory.path) <= budget)
    }
}
