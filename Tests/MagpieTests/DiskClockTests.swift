import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

// The disk tier's clock counts reads (up to three, in the index slot's length; see Disk/Bucket.swift).

private func random(_ length: Int, seed: UInt64) -> [UInt8] {
    var generator = SeededGenerator(seed: seed)
    return (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

/// A tier of one bucket with room for 64 records of key-NNN keys (7–8 bytes) and 200-byte raw values
/// (56 + 8 + 200 bytes each, padded to 8): its share is (budget − 128) / 2.
private func oneBucket(_ directory: TemporaryDirectory) throws -> DiskTier {
    let recordLength = 56 + 8 + 200
    return try DiskTier(.init(directory: directory.path, budget: 2 * 64 * recordLength + 128, bucketCount: 1, compressionLevel: nil))
}

/// Stores key `i` with its 200-byte value.
private func store(_ tier: DiskTier, _ i: Int) throws {
    try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
}

/// Whether `tier` holds key `i`, without counting a read.
private func holds(_ tier: DiskTier, _ i: Int) throws -> Bool {
    try keyBytes(i).withUnsafeBytes { raw throws(MagpieError) in try tier.contains(HashedKey(raw, hasher: tier.hasher)) }
}

@Suite("DiskTier: the clock counts reads")
struct DiskClockTests {
    @Test("a slot's credits saturate at three, never touch its length, and survive the stored form")
    func credits() {
        var slot = DiskSlot(hash: 0xfeed_beef_1234_5678, offset: 4096, length: 264, expiryMilliseconds: 0)
        #expect(slot.credits == 0 && slot.length == 264)
        for expected in [1, 2, 3, 3, 3] {
            slot.credits += 1
            #expect(slot.credits == expected && slot.length == 264 && slot.offset == 4096)
        }
        let stored = DiskSlot(tag: slot.tag, offset8: slot.offset8, rawLength: slot.rawLength, expiry: slot.expiry)
        #expect(stored == slot && stored.credits == 3)
        slot.credits -= 1
        #expect(slot.credits == 2 && slot.length == 264)
        slot.credits = 0
        #expect(slot.rawLength == 264 && !slot.isEmpty)
        // A snapshot of an older build: bit 31 was its reference bit. Ignored, and the length stands.
        let older = DiskSlot(tag: 1, offset8: 8, rawLength: 0x8000_0000 | 264, expiry: 0)
        #expect(older.length == 264 && older.credits == 0 && !older.isEmpty)
    }

    @Test("a snapshot keeps each slot's credits, and one whose slot is shorter than a record header is refused")
    func snapshotCredits() {
        func snapshot(_ slot: DiskSlot) -> IndexSnapshot {
            var slots = [DiskSlot](repeating: .empty, count: 4)
            slots[1] = slot
            return IndexSnapshot(
                bucketIndex: 0, bucketCount: 1, seed: 1, fileSize: 4096, liveBytes: slot.length, maximumSequence: 1,
                slots: slots, liveCount: 1)
        }
        var slot = DiskSlot(hash: 7, offset: 64, length: 264, expiryMilliseconds: 0)
        slot.credits = 2
        #expect(IndexSnapshot.decode(snapshot(slot).encoded())?.slots[1] == slot)
        // An older build's reference bit is cleared on the way in.
        let older = DiskSlot(tag: 7, offset8: 8, rawLength: 0x8000_0000 | 264, expiry: 0)
        #expect(IndexSnapshot.decode(snapshot(older).encoded())?.slots[1].rawLength == 264)
        // Credits alone, no length (say, an older build's reference bit with a zero length): not empty,
        // yet no record; the snapshot is refused and the bucket scanned instead.
        for raw: UInt32 in [3, 0x8000_0000, 48] {
            #expect(IndexSnapshot.decode(snapshot(DiskSlot(tag: 7, offset8: 8, rawLength: raw, expiry: 0)).encoded()) == nil)
        }
    }

    @Test("eviction keeps an entry read three times (then overwritten or not) longer than one read once")
    func readsCounted() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        for i in 0..<50 { try store(tier, i) }
        // Every entry is read, so the clock must choose among read entries (unread ones, the new keys
        // below, may keep only a tenth of the target): keys 0..<20 read three times, 20..<50 once. Once
        // the hand has passed them all, the first twenty keep two credits and the rest none, so all of
        // 20..<50 go before any of 0..<20.
        for _ in 0..<3 { for j in 0..<20 { #expect(try tier.value(forKey: keyBytes(j)) != nil) } }
        for j in 20..<50 { #expect(try tier.value(forKey: keyBytes(j)) != nil) }
        // An overwrite keeps the credits its key earned.
        for j in 0..<5 { try store(tier, j) }
        var i = 50
        while try (20..<50).contains(where: { try holds(tier, $0) }) && i < 2_000 {
            try store(tier, i)
            i += 1
        }
        let left = try (20..<50).filter { try holds(tier, $0) }
        let statistics = tier.statistics
        #expect(i < 2_000, "entries read once never evicted: \(left); \(statistics.evictions) evictions, \(statistics.compactions) compactions")
        #expect(tier.statistics.compactions >= 2)
        let kept = try (0..<20).filter { try holds(tier, $0) }
        #expect(kept.count == 20, "an entry read three times went no later than the entries read once: kept \(kept)")
    }

    @Test("with nothing read, eviction takes the entries the last compaction kept before those stored since")
    func unreadOldestFirst() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        var i = 0
        while tier.statistics.compactions < 5 {
            try store(tier, i)
            i += 1
        }
        // Unread entries go oldest first, and compactions keep the store order: what the bucket holds is
        // exactly the newest keys, as many as fit the target (the compaction just run made room for key
        // i − 1, stored after it), and nothing older.
        let held = try (0..<i).filter { try holds(tier, $0) }
        #expect(held.count >= 40 && held == Array((i - held.count)..<i), "held \(held)")
        #expect(tier.statistics.evictions >= 4 * 16)
    }

    @Test("while read entries take more than the target, the newest unread ones keep a tenth of it")
    func unreadKeepATenth() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        for i in 0..<52 { try store(tier, i) }
        for _ in 0..<3 { for j in 0..<52 { #expect(try tier.value(forKey: keyBytes(j)) != nil) } }
        var i = 52
        while tier.statistics.compactions == 0 && i < 200 {
            try store(tier, i)
            i += 1
        }
        // The compaction ran in the store of key i − 1 (before its record went in). 52 read entries
        // exceed its target (3/4 of 64 records, less one): the unread ones stored since, 52..<(i − 1),
        // keep a tenth of it (4 records), the newest; the clock takes the rest from the read ones.
        let unread = try (52..<(i - 1)).filter { try holds(tier, $0) }
        #expect(unread == Array((i - 5)..<(i - 1)), "unread entries kept: \(unread) of 52..<\(i - 1)")
        #expect(try holds(tier, i - 1))
    }
}
