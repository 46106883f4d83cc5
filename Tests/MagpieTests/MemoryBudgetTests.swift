import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// The memory budget acts as one budget: the largest entry does not shrink with the shard count, a large
/// store into a tier that has room evicts nothing, and the tier never charges more than its budget.
@Suite("MemoryTier: one budget")
struct MemoryBudgetTests {
    private func bytes(_ count: Int, _ seed: UInt8) -> [UInt8] { noiseBytes(count, seed: UInt64(seed)) }

    /// Σ shard limits + pool == budget, and every shard charges at most its limit (the tier quiescent).
    private func expectLedger(_ tier: MemoryTier, _ comment: Comment = "") {
        var limits = 0
        for shard in tier.shards {
            let (limit, charged) = shard.withLock { ($0.limit, $0.charged) }
            #expect(charged <= limit, comment)
            limits += limit
        }
        #expect(limits + tier.pool.available == tier.budget, comment)
        #expect(tier.chargedBytes <= tier.budget, comment)
    }

    @Test("with 64 shards a 64 MiB budget keeps a 4 MiB entry; with 8 to 512 shards a quarter of the budget")
    func largeEntryWhateverTheShards() throws {
        let tier = try MemoryTier(budget: 64 << 20, shardCount: 64)
        let value = bytes(4 << 20, 1)
        #expect(try tier.set(value, forKey: "four mebibytes"))
        #expect(tier.value(forKey: "four mebibytes") == value)
        expectLedger(tier)
        for shards in [8, 64, 512] {
            let tier = try MemoryTier(budget: 64 << 20, shardCount: shards)
            #expect(tier.largestStorableValue >= (64 << 20) / 2)
            let quarter = bytes(16 << 20, 2)
            #expect(try tier.set(quarter, forKey: "quarter"), "\(shards) shards")
            #expect(tier.value(forKey: "quarter") == quarter, "\(shards) shards")
        }
    }

    @Test("in a tier at 10 % of its budget a large store evicts nothing")
    func largeStoreEvictsNothing() throws {
        let tier = try MemoryTier(budget: 64 << 20, shardCount: 64)
        var key = 0
        while tier.chargedBytes < (64 << 20) / 10 {
            #expect(try tier.set(bytes(1000, UInt8(key & 0xff)), forKey: "small-\(key)"))
            key += 1
        }
        for round in 0..<3 { #expect(try tier.set(bytes(4 << 20, UInt8(round)), forKey: "large-\(round)")) }
        #expect(tier.statistics.evictions == 0)
        for k in 0..<key { #expect(tier.value(forKey: "small-\(k)") == bytes(1000, UInt8(k & 0xff))) }
        for round in 0..<3 { #expect(tier.value(forKey: "large-\(round)") == bytes(4 << 20, UInt8(round))) }
        expectLedger(tier)
    }

    @Test("the largest storable value is exact in an empty and in a full tier; one byte more is refused", arguments: [1, 4, 64])
    func largestExact(shards: Int) throws {
        let tier = try MemoryTier(budget: 4 << 20, shardCount: shards)
        let largest = tier.largestStorableValue
        #expect(!(try tier.set(bytes(largest + 1, 3), forKey: [])))
        #expect(tier.statistics.refusals == 1)
        #expect(try tier.set(bytes(largest, 4), forKey: []))
        #expect(tier.value(forKey: []) == bytes(largest, 4))
        tier.removeValue(forKey: [])
        for k in 0..<20_000 { try tier.set(bytes(300, UInt8(k & 0xff)), forKey: "k\(k)") }  // full: evicting
        #expect(tier.statistics.evictions > 0)
        #expect(try tier.set(bytes(largest, 5), forKey: []))
        #expect(tier.value(forKey: []) == bytes(largest, 5))
        expectLedger(tier)
    }

    @Test("a full tier lends for a large entry and gets its room back once the entry is gone")
    func lendersRecover() throws {
        let budget = 8 << 20
        let tier = try MemoryTier(budget: budget, shardCount: 16)
        func fill(_ from: Int) throws {
            for k in from..<(from + 40_000) { try tier.set(bytes(400, UInt8(k & 0xff)), forKey: "k\(k)") }
        }
        try fill(0)
        let full = tier.chargedBytes
        #expect(full > budget * 9 / 10)
        #expect(try tier.set(bytes(budget / 3, 6), forKey: "large"))
        expectLedger(tier, "with the large entry")
        #expect(tier.chargedBytes <= budget)
        tier.removeValue(forKey: "large")
        try fill(100_000)
        try fill(200_000)  // the large entry's shard evicts its dead block, returns the loan; lenders take it back
        expectLedger(tier, "after refilling")
        #expect(tier.chargedBytes > budget * 9 / 10, "lenders got their room back: \(tier.chargedBytes) of \(budget)")
        let limits = tier.shards.map { shard in shard.withLock { $0.limit } }
        #expect(limits.allSatisfy { $0 >= tier.shardBudget * 3 / 4 }, "\(limits)")
    }

    /// Each shard's (limit, charged, evictions), under its lock.
    private func shardStates(_ tier: MemoryTier) -> [(limit: Int, charged: Int, evictions: UInt64)] {
        tier.shards.map { shard in shard.withLock { ($0.limit, $0.charged, $0.counters.evictions) } }
    }

    /// A tier of 16 shards filled with 400-byte values until every shard evicts.
    private func fullTier(budget: Int) throws -> MemoryTier {
        let tier = try MemoryTier(budget: budget, shardCount: 16)
        for k in 0..<(budget / 200) { try tier.set(bytes(400, UInt8(k & 0xff)), forKey: "k\(k)") }
        #expect(shardStates(tier).allSatisfy { $0.evictions > 0 })
        return tier
    }

    @Test("a store longer than the largest storable value is refused at once: nothing evicted, nothing borrowed")
    func hopelessStoreEvictsNothing() throws {
        let tier = try fullTier(budget: 8 << 20)
        try tier.set(bytes(100, 9), forKey: [])
        let before = shardStates(tier)
        let statistics = tier.statistics
        #expect(!(try tier.set(bytes(tier.largestStorableValue + 1, 7), forKey: [])))
        #expect(tier.statistics.refusals == statistics.refusals + 1)
        #expect(tier.statistics.evictions == statistics.evictions, "a refused store made the tier evict")
        #expect(tier.value(forKey: []) == nil)  // the key's older value is gone all the same
        #expect(shardStates(tier).map(\.limit) == before.map(\.limit), "a refused store kept borrowed room")
        expectLedger(tier)
    }

    @Test("a refused store gives back the room it borrowed")
    func refusalReturnsTheLoan() throws {
        let tier = try MemoryTier(budget: 1 << 20, shardCount: 4)
        #expect(!(try tier.set(bytes(tier.largestStorableValue + 1, 7), forKey: [])))
        #expect(shardStates(tier).map(\.limit) == Array(repeating: tier.shardBudget, count: 4))
        expectLedger(tier)
    }

    @Test(
        "a large entry's room goes back to the lenders as soon as it is removed or replaced", arguments: [false, true])
    func loanReturnedAtOnce(replaced: Bool) throws {
        let budget = 8 << 20
        let tier = try fullTier(budget: budget)
        let large = bytes(budget / 3, 6)
        #expect(try tier.set(large, forKey: "large"))
        let charged = tier.chargedBytes
        if replaced { try tier.set(bytes(10, 1), forKey: "large") } else { tier.removeValue(forKey: "large") }
        #expect(tier.chargedBytes <= charged - large.count + 10, "the removed entry's memory is still held")
        #expect(shardStates(tier).allSatisfy { $0.limit <= max(tier.shardBudget, $0.charged + tier.shardBudget / 16) })
        expectLedger(tier)
        for k in 0..<(budget / 400) { try tier.set(bytes(400, UInt8(k & 0xff)), forKey: "again\(k)") }
        #expect(shardStates(tier).allSatisfy { $0.limit == tier.shardBudget }, "\(shardStates(tier).map(\.limit))")
        #expect(tier.chargedBytes > budget * 9 / 10)
        expectLedger(tier)
    }

    @Test("a full tier makes room for a large entry by evicting about equally from every other shard")
    func lendersEvictEqually() throws {
        let tier = try fullTier(budget: 8 << 20)
        let before = shardStates(tier)
        let value = bytes((8 << 20) / 3, 6)
        #expect(try tier.set(value, forKey: "large"))
        let hash = tier.hasher.hash("large")
        let borrower = Int(truncatingIfNeeded: hash) & tier.shardMask
        let evicted = zip(shardStates(tier), before).enumerated().filter { $0.offset != borrower }
            .map { Int($0.element.0.evictions - $0.element.1.evictions) }
        #expect(evicted.min()! > 0 && evicted.max()! <= evicted.min()! * 3 / 2, "evictions per lender: \(evicted)")
        expectLedger(tier)
    }

    @Test("threads mixing large and small stores, reads and removals: reads belong to their key, the budget holds")
    func concurrent() async throws {
        let budget = 4 << 20
        let tier = try MemoryTier(budget: budget, shardCount: 8)
        let seed = TestSeed.value(default: 41)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<4 {
                group.addTask {
                    var random = SeededGenerator(seed: seed &+ UInt64(task))
                    for step in 0..<3000 {
                        let key = Int.random(in: 0..<200, using: &random)
                        let roll = Int.random(in: 0..<100, using: &random)
                        if roll < 40 {
                            let length = roll < 3 ? Int.random(in: 300_000...1_500_000, using: &random) : Int.random(in: 0...2000, using: &random)
                            _ = try? tier.set(selfDescribingValue(key: key, version: step, length: length), forKey: keyBytes(key))
                        } else if roll < 90 {
                            if let got = tier.value(forKey: keyBytes(key)) {
                                let prefix = Array("k\(key)v".utf8)
                                #expect(got.count < prefix.count || Array(got.prefix(prefix.count)) == prefix, "a read of key \(key) returned another key's bytes")
                            }
                        } else {
                            tier.removeValue(forKey: keyBytes(key))
                        }
                        if step % 500 == 0 { #expect(tier.chargedBytes <= budget) }
                    }
                }
            }
        }
        expectLedger(tier, "after the threads")
    }

    /// The dead blocks' charge, kept apart from the live entries' (the policy's mean charge is over these):
    /// checked against a walk of both rings.
    private func expectDeadCharge(_ tier: MemoryTier, _ comment: Comment = "") -> Int {
        var dead = 0
        for shard in tier.shards {
            let (walkedDead, walkedLive, deadCharged, liveCharged) = shard.withLock { storage in
                var dead = 0
                var live = 0
                for ring in [storage.small, storage.main] {
                    ring.forEach { block in
                        let header = EntryHeader(of: block)
                        let charge = ShardStorage.charge(storedLength: header.storedLength)
                        if header.isDead { dead += charge } else { live += charge }
                    }
                }
                return (dead, live, storage.deadCharged, storage.liveCharged)
            }
            #expect(deadCharged == walkedDead, comment)
            #expect(liveCharged == walkedLive, comment)
            dead += walkedDead
        }
        return dead
    }

    @Test("dead blocks' charge is kept apart through overwrites, removals, compactions, evictions and removeAll")
    func deadChargeKeptApart() throws {
        let tier = try MemoryTier(budget: 1 << 20, shardCount: 1)
        for key in 0..<200 { #expect(try tier.set(bytes(200, UInt8(key % 250)), forKey: "k\(key)", group: "g\(key % 3)")) }
        #expect(expectDeadCharge(tier, "stored") == 0)
        // Overwrites leave the replaced blocks dead in their ring (30: no compaction yet).
        for key in 0..<30 { #expect(try tier.set(bytes(400, 7), forKey: "k\(key)")) }
        #expect(expectDeadCharge(tier, "overwritten") > 0)
        // Removals past half the ring compact it.
        for key in 30..<130 { tier.removeValue(forKey: "k\(key)") }
        _ = expectDeadCharge(tier, "removed")
        // Evictions pop dead blocks; overwrites and removals keep making them.
        var state: UInt64 = 5
        for step in 0..<20_000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let key = "e\(Int(state >> 33) % 3_000)"
            if step % 7 == 0 {
                tier.removeValue(forKey: key)
            } else {
                _ = try tier.set(bytes(50 + Int(state >> 40) % 2_000, UInt8(step % 250)), forKey: key, group: "g\(step % 3)")
            }
        }
        #expect(tier.shards[0].withLock { $0.counters.evictions } > 0)
        _ = expectDeadCharge(tier, "evicting")
        _ = tier.removeAll(inGroup: "g1")
        _ = expectDeadCharge(tier, "group removed")
        tier.removeAll()
        #expect(expectDeadCharge(tier, "all removed") == 0)
        #expect(tier.shards[0].withLock { $0.deadCharged } == 0)
        // `main`'s compaction: keys read once go to `main` when `small` turns over; removing most of them
        // leaves more dead blocks than live ones there, and the ring is compacted.
        let small = try MemoryTier(budget: 64 << 10, shardCount: 1)
        for key in 0..<400 {
            #expect(try small.set(bytes(100, UInt8(key % 250)), forKey: "m\(key)"))
            _ = small.value(forKey: "m\(key)")
        }
        for key in 0..<300 { _ = try small.set(bytes(100, 1), forKey: "f\(key)") }
        let inMain = small.shards[0].withLock { $0.main.count }
        #expect(inMain >= 200, "\(inMain) blocks in main")
        for key in 0..<400 { small.removeValue(forKey: "m\(key)") }
        let (mainBlocks, mainDead) = small.shards[0].withLock { ($0.main.count, $0.main.dead) }
        #expect(mainBlocks < inMain - 100, "main compacted: \(mainBlocks) blocks (\(mainDead) dead) of \(inMain)")
        _ = expectDeadCharge(small, "main compacted")
    }
}
