import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// The disk budget acts as one budget: buckets lend each other room, large values are storable whatever
/// the bucket count, a store evicts nothing while the tier has room, and everything the tier writes in its
/// directory (snapshots and temporary files included) stays within the budget.
@Suite("Disk tier: one budget")
struct DiskBudgetTests {
    private func noise(_ count: Int, seed: UInt64) -> [UInt8] { noiseBytes(count, seed: seed) }

    @Test("a 1 GiB tier (256 buckets) stores and reads back a 64 MiB value, and keeps it across a reopen")
    func sixtyFourMebibytes() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let configuration = DiskTier.Configuration(directory: directory.path, budget: 1 << 30, hashSeed: 11)
        let tier = try DiskTier(configuration)
        #expect(tier.bucketCount == 256)
        #expect(tier.largestStorableValue >= (1 << 30) / 16)
        let value = noise(64 << 20, seed: 1)
        try tier.set(value, forKey: "sixty-four")
        #expect(try tier.value(forKey: "sixty-four") == value)
        #expect(tier.statistics.evictions == 0)
        try tier.close()
        let again = try DiskTier(configuration)
        #expect(try again.value(forKey: "sixty-four") == value)
        try again.close()
    }

    @Test("in a tier at 10 % of its budget a 4 MiB store evicts nothing, and a 1-byte entry is never lost")
    func largeStoreEvictsNothing() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(.init(directory: directory.path, budget: 64 << 20, hashSeed: 12))
        try tier.set([1], forKey: "one byte")
        var key = 0
        while tier.statistics.bytesOnDisk < (64 << 20) / 10 {
            try tier.set(noise(1000, seed: UInt64(key)), forKey: keyBytes(key))
            key += 1
        }
        for round in 0..<4 { try tier.set(noise(4 << 20, seed: 100 + UInt64(round)), forKey: "large-\(round)") }
        #expect(tier.statistics.evictions == 0)
        #expect(try tier.value(forKey: "one byte") == [1])
        for k in 0..<key { #expect(try tier.value(forKey: keyBytes(k)) == noise(1000, seed: UInt64(k))) }
        for round in 0..<4 { #expect(try tier.value(forKey: "large-\(round)") == noise(4 << 20, seed: 100 + UInt64(round))) }
    }

    @Test("in a 64 MiB tier at 10 % of its budget the largest storable value evicts nothing (the others lend below half a share)")
    func largestStoreEvictsNothing() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(.init(directory: directory.path, budget: 64 << 20, hashSeed: 17))
        var key = 0
        while tier.statistics.bytesOnDisk < (64 << 20) / 10 {
            try tier.set(noise(1000, seed: UInt64(key)), forKey: keyBytes(key))
            key += 1
        }
        let largest = tier.largestStorableValue
        let value = noise(largest, seed: 99)  // incompressible: stored as it is
        try tier.set(value, forKey: [])  // the largest value is for an empty key
        #expect(tier.statistics.evictions == 0)
        #expect(try tier.value(forKey: []) == value)
        for k in 0..<key { #expect(try tier.value(forKey: keyBytes(k)) == noise(1000, seed: UInt64(k)), "key \(k)") }
        // The small entries keep coming: the lenders borrow back or, with the tier full, evict; values stay exact.
        for k in key..<(key + 2000) { try tier.set(noise(1000, seed: UInt64(k)), forKey: keyBytes(k)) }
        for k in 0..<(key + 2000) {
            let got = try tier.value(forKey: keyBytes(k))
            #expect(got == nil || got == noise(1000, seed: UInt64(k)))
        }
        try tier.close()
        #expect(directoryBytes(directory.path) <= 64 << 20)
    }

    @Test("a value longer than the largest storable is stored when it fits compressed, as documented; an incompressible one is refused")
    func largestMeasuredCompressed() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(.init(directory: directory.path, budget: 8 << 20, bucketCount: 4, hashSeed: 18))
        let largest = tier.largestStorableValue
        let line = Array(#"{"id":12345,"name":"a cached value","tags":["x","y","z"],"score":0.75}\n"#.utf8)
        let text = (0..<(largest + 4096)).map { line[$0 % line.count] }
        try tier.set(text, forKey: "text")
        #expect(try tier.value(forKey: "text") == text)
        let refused = #expect(throws: MagpieError.self) { try tier.set(noise(largest + 1, seed: 5), forKey: "noise") }
        #expect(refused?.code == .valueTooLarge)
        #expect(try tier.value(forKey: "noise") == nil)
        #expect(try tier.value(forKey: "text") == text)
        try tier.close()
    }

    @Test("the largest storable value is exact: it fits an empty and a full tier, one byte more is refused", arguments: [1, 4, 64])
    func largestExact(buckets: Int) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(.init(directory: directory.path, budget: 8 << 20, bucketCount: buckets, compressionLevel: nil, hashSeed: 13))
        let largest = tier.largestStorableValue
        #expect(largest >= (8 << 20) / 16)
        let tooLarge = #expect(throws: MagpieError.self) { try tier.set(noise(largest + 1, seed: 2), forKey: []) }
        #expect(tooLarge?.code == .valueTooLarge)
        try tier.set(noise(largest, seed: 3), forKey: [])
        #expect(try tier.value(forKey: []) == noise(largest, seed: 3))
        // Full of small entries, then the largest again: the others evict to lend.
        try tier.removeValue(forKey: [])
        for k in 0..<3000 { try tier.set(noise(2000, seed: UInt64(k)), forKey: keyBytes(k)) }
        try tier.set(noise(largest, seed: 4), forKey: [])
        #expect(try tier.value(forKey: []) == noise(largest, seed: 4))
        for k in 0..<3000 {
            let got = try tier.value(forKey: keyBytes(k))
            #expect(got == nil || got == noise(2000, seed: UInt64(k)))
        }
        try tier.close()
        #expect(directoryBytes(directory.path) <= 8 << 20)
    }

    @Test("everything in the directory stays within the budget: files, snapshots and compactions", arguments: [1, 16])
    func directoryWithinBudget(buckets: Int) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 8 << 20
        let configuration = DiskTier.Configuration(directory: directory.path, budget: budget, bucketCount: buckets, hashSeed: 14)
        let tier = try DiskTier(configuration)
        // Small entries until the tier is full (evicting), so the index snapshots are large; then
        // overwrites, for garbage and compactions.
        var k = 0
        while tier.statistics.evictions < 1000 {
            try tier.set(Array("v-\(k)".utf8), forKey: keyBytes(k))
            if k % 20_000 == 0 { #expect(tier.directoryBytes(directory.path) <= budget) }
            k += 1
        }
        for j in 0..<2000 { try tier.set(noise(3000, seed: UInt64(j)), forKey: keyBytes(j * 7)) }
        #expect(tier.statistics.regionsReclaimed > 0)
        #expect(tier.directoryBytes(directory.path) <= budget)
        try tier.close()
        #expect(directoryBytes(directory.path) <= budget, "after close, snapshots included")
        let again = try DiskTier(configuration)
        #expect(again.statistics.entries > 0)
        try again.close()
        #expect(directoryBytes(directory.path) <= budget)
    }

    @Test(
        "a bucket asked to evict for a record its limit cannot hold even alone reports the shortfall and evicts nothing"
    )
    func evictReportsWhatNoEvictionCovers() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(
            .init(directory: directory.path, budget: 4 << 20, bucketCount: 8, compressionLevel: nil, hashSeed: 21))
        let hasher = KeyHash(seed: 21)
        let inOne = (0..<2_000).filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 8) == 1 }.prefix(100)
        for key in inOne { try tier.set(noise(2000, seed: UInt64(key)), forKey: keyBytes(key)) }
        try tier.flush()
        let before = tier.statistics
        // The room loop chose `.evict` when the record fitted the bucket's limit alone; the room was lent
        // away before the attempt (another thread's store gathered it). Evicting every region would not make
        // the record fit: the bucket used to do so, then refuse it as too large.
        let outcome = try tier.bucketSet.buckets[1].withLock {
            (state: inout BucketState) throws(MagpieError) -> RoomOutcome<Void> in
            var batch = WriteBatch()
            batch.append(length: 4 << 20, origin: .other) { _ in }
            return try state.write(&batch, policy: .evict, now: 0)
        }
        guard case .short(let shortfall) = outcome else {
            Issue.record("a record larger than the whole budget was written")
            return
        }
        #expect(!shortfall.fitsAlone)
        #expect(shortfall.bytes > 0)
        #expect(tier.statistics.evictions == before.evictions)
        #expect(tier.statistics.regionsReclaimed == before.regionsReclaimed)
        #expect(tier.ledgerTotal == 4 << 20, "what the bucket took from the pool is in its limit")
        for key in inOne { #expect(try tier.value(forKey: keyBytes(key)) == noise(2000, seed: UInt64(key))) }
        // `.last` refuses it, before anything changes (it used to empty the bucket first).
        let refused = #expect(throws: MagpieError.self) {
            try tier.bucketSet.buckets[1].withLock { (state: inout BucketState) throws(MagpieError) in
                var batch = WriteBatch()
                batch.append(length: 4 << 20, origin: .other) { _ in }
                _ = try state.write(&batch, policy: .last, now: 0)
            }
        }
        #expect(refused?.code == .valueTooLarge)
        #expect(tier.statistics.evictions == before.evictions)
        #expect(tier.statistics.regionsReclaimed == before.regionsReclaimed)
        for key in inOne { #expect(try tier.value(forKey: keyBytes(key)) == noise(2000, seed: UInt64(key))) }
        // And through the room loop, a record larger than the bucket's share but within the largest
        // storable is stored: the others lend it room.
        let large = noise(tier.bucketBudget + tier.bucketBudget / 2, seed: 5)
        try tier.set(large, forKey: keyBytes(inOne.first!))
        #expect(try tier.value(forKey: keyBytes(inOne.first!)) == large)
        try tier.flush()
        #expect(tier.ledgerTotal == 4 << 20)
        #expect(tier.statistics.bytesOnDisk <= 4 << 20)
        try tier.close()
        #expect(directoryBytes(directory.path) <= 4 << 20)
    }

    @Test(
        "the room loop hands what the others lent to the borrower, gathers by evicting for what evicting here cannot cover, and ends"
    )
    func roomLoop() {
        // Scripted stripe: each attempt records its policy and what it was handed, and answers from a list.
        var seen: [(RoomPolicy, Int)] = []
        var gathers: [(Int, Bool)] = []
        var answers: [RoomOutcome<Int>] = [
            .short(Shortfall(bytes: 100, fitsAlone: true)),  // the others lend 100: tried again with them
            .short(Shortfall(bytes: 300, fitsAlone: true)),  // they lend 40 of 300: evict here
            .short(Shortfall(bytes: 500, fitsAlone: false)),  // `.evict`, lent away meanwhile: they evict to lend
            .done(7),
        ]
        var free = [100, 40, 0]  // the others' free room, lent without evicting, round by round
        let result = withBorrowedRoom { (policy: RoomPolicy, granted: Int) -> RoomOutcome<Int> in
            seen.append((policy, granted))
            return answers.removeFirst()
        } gather: { bytes, evicting in
            gathers.append((bytes, evicting))
            return evicting ? bytes : free.removeFirst()
        }
        #expect(result == 7)
        #expect(seen.map(\.0) == [.borrow, .borrow, .evict, .evict])
        #expect(seen.map(\.1) == [0, 100, 40, 500])
        #expect(gathers.map(\.0) == [100, 300, 500, 500])
        #expect(gathers.map(\.1) == [false, false, false, true])

        // Never enough: the eighth round is `.last`, which ends it.
        var policies: [RoomPolicy] = []
        var handed = 0
        let last = withBorrowedRoom { (policy: RoomPolicy, granted: Int) -> RoomOutcome<Bool> in
            policies.append(policy)
            handed += granted
            return policy == .last ? .done(false) : .short(Shortfall(bytes: 1000, fitsAlone: false))
        } gather: { _, evicting in
            evicting ? 10 : 0
        }
        #expect(last == false)
        #expect(policies.count == 9 && policies.last == .last && policies.dropLast().allSatisfy { $0 == .borrow })
        #expect(
            handed == 70, "every byte gathered reaches the stripe: 7 evicting gathers of 10 before the eighth round")
    }

    @Test("a full tier keeps working: lent room comes back, totals never pass the budget, values stay exact")
    func churn() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 4 << 20
        let tier = try DiskTier(.init(directory: directory.path, budget: budget, bucketCount: 8, compressionLevel: nil, hashSeed: 15))
        var generator = SeededGenerator(seed: 16)
        var last: [Int: UInt64] = [:]
        for step in 0..<4000 {
            let key = Int.random(in: 0..<800, using: &generator)
            let seed = UInt64(step)
            let length = step % 97 == 0 ? Int.random(in: 100_000...900_000, using: &generator) : Int.random(in: 10...6000, using: &generator)
            try tier.set(noise(length, seed: seed), forKey: keyBytes(key))
            last[key] = seed
            if step % 500 == 0 {
                #expect(tier.statistics.bytesOnDisk <= budget)
                #expect(tier.directoryBytes(directory.path) <= budget)
            }
        }
        for (key, seed) in last {
            if let got = try tier.value(forKey: keyBytes(key)) { #expect(got == noise(got.count, seed: seed)) }
        }
        try tier.close()
    }
}
