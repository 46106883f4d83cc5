import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

// The disk tier's regions (Disk/Bucket+Regions.swift): FIFO reclaim, size-aware reinsertion, tombstones'
// covers, emptying regions out of turn.

private func random(_ length: Int, seed: UInt64) -> [UInt8] {
    var generator = SeededGenerator(seed: seed)
    return (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

/// A tier of one bucket of 16 regions of 2 KiB, values stored raw, every store written before it returns
/// (so that reclaims happen one at a time, at a known store).
private func oneBucket(_ directory: TemporaryDirectory, threshold: Int = 5) throws -> DiskTier {
    var configuration = DiskTier.Configuration(directory: directory.path, budget: 16 * 2048 + 64 + 128, bucketCount: 1, compressionLevel: nil)
    configuration.writeBufferSize = 0
    configuration.reinsertionThreshold = threshold
    return try DiskTier(configuration)
}

/// A tier of two buckets, 64 KiB, values stored raw, every store written before it returns; with the
/// keys (`keyBytes(i)`) of each bucket among the first 10,000.
private func twoBuckets(_ directory: TemporaryDirectory) -> (DiskTier.Configuration, first: [Int], second: [Int]) {
    var configuration = DiskTier.Configuration(directory: directory.path, budget: 64 << 10, bucketCount: 2, compressionLevel: nil, hashSeed: 3)
    configuration.writeBufferSize = 0
    let hasher = KeyHash(seed: 3)
    let first = (0..<10_000).filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 2) == 0 }
    let second = (0..<10_000).filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 2) == 1 }
    return (configuration, first, second)
}

/// Whether `tier` holds key `i`, without counting a read.
private func holds(_ tier: DiskTier, _ i: Int) throws -> Bool {
    try keyBytes(i).withUnsafeBytes { raw throws(MagpieError) in try tier.contains(HashedKey(raw, hasher: tier.hasher)) }
}

@Suite("DiskTier: regions")
struct DiskRegionTests {
    @Test("a slot's credits saturate at seven, never touch its length, and survive the stored form; a pending slot says where its record waits")
    func slots() {
        var slot = DiskSlot(hash: 0xfeed_beef_1234_5678, offset: 4096, length: 264, expiryMilliseconds: 0)
        #expect(slot.credits == 0 && slot.length == 264 && !slot.isPending)
        for expected in [1, 2, 3, 4, 5, 6, 7, 7, 7] {
            slot.credits += 1
            #expect(slot.credits == expected && slot.length == 264 && slot.offset == 4096)
        }
        let stored = DiskSlot(tag: slot.tag, offset8: slot.offset8, rawLength: slot.rawLength, expiry: slot.expiry)
        #expect(stored == slot && stored.credits == 7)
        var pending = DiskSlot(hash: 7, memtableParity: 1, offset: 4088, length: 1048, expiryMilliseconds: 1001)
        #expect(pending.isPending && pending.memtableParity == 1 && pending.memtableOffset == 4088 && pending.length == 1048)
        #expect(pending.expiry == 2)  // whole seconds, rounded up
        pending.credits = 3
        pending.place(at: 8192, length: 640)
        #expect(!pending.isPending && pending.offset == 8192 && pending.length == 640 && pending.credits == 3)
    }

    @Test("a snapshot keeps each slot's credits; one holding a pending slot, or a slot outside every region, is refused")
    func snapshotSlots() {
        func snapshot(_ slot: DiskSlot) -> IndexSnapshot {
            var slots = [DiskSlot](repeating: .empty, count: 4)
            slots[1] = slot
            return IndexSnapshot(
                bucketIndex: 0, bucketCount: 1, seed: 1, fileSize: BucketFileHeader.size + 2 * 1024, liveBytes: slot.length,
                maximumSequence: 1, regionSize: 1024, slotCount: 2, nextRegionSequence: 2,
                regions: [Region(slot: 1, slots: 1, sequence: 1, firstRecordSequence: 1, end: 64 + 264)], slots: slots, liveCount: 1)
        }
        var slot = DiskSlot(hash: 7, offset: BucketFileHeader.size + 1024 + 64, length: 264, expiryMilliseconds: 0)
        slot.credits = 6
        #expect(IndexSnapshot.decode(snapshot(slot).encoded())?.slots[1] == slot)
        // In slot 0, which no region holds; past the region's used bytes; pending; shorter than a header.
        for bad in [
            DiskSlot(hash: 7, offset: BucketFileHeader.size + 64, length: 264, expiryMilliseconds: 0),
            DiskSlot(hash: 7, offset: BucketFileHeader.size + 1024 + 72, length: 264, expiryMilliseconds: 0),
            DiskSlot(hash: 7, memtableParity: 0, offset: 64, length: 264, expiryMilliseconds: 0),
            DiskSlot(tag: 7, offset8: UInt32((BucketFileHeader.size + 1024 + 64) / 8), rawLength: 48, expiry: 0),
        ] {
            #expect(IndexSnapshot.decode(snapshot(bad).encoded()) == nil, "\(bad)")
        }
    }

    @Test("with nothing read, reclaims take the oldest entries first: the bucket holds exactly the newest keys")
    func fifo() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        var i = 0
        while tier.statistics.regionsReclaimed < 5 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        let held = try (0..<i).filter { try holds(tier, $0) }
        #expect(held == Array((i - held.count)..<i), "held \(held)")
        #expect(held.count >= 15 * 7 - 7, "the bucket should hold nearly 16 regions of 7 records, held \(held.count)")
        let statistics = tier.statistics
        #expect(statistics.reinsertions == 0 && statistics.evictions == 5 * 7)
        #expect(statistics.bytesOnDisk <= 16 * 2048 + 64 && statistics.regions == 16)
    }

    @Test("a removal whose tombstone's write reclaims the region of the key's read-often value evicts it: a crash never brings it back")
    func removalDuringReclaim() throws {
        var reached = 0
        for filler in 0..<60 {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            var target = -1
            do {
                let tier = try oneBucket(directory)
                var i = 0
                while tier.statistics.regionsReclaimed < 1 {
                    try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
                    i += 1
                }
                // The oldest region's first key, read often enough to be copied forward by its reclaim.
                target = try #require(try (0..<i).first { try holds(tier, $0) })
                for _ in 0..<7 { _ = try tier.value(forKey: keyBytes(target)) }
                for _ in 0..<filler {
                    try tier.set(random(40, seed: UInt64(i)), forKey: keyBytes(i))
                    i += 1
                }
                guard tier.statistics.regionsReclaimed == 1 else { continue }  // the fillers reclaimed it already
                #expect(try tier.removeValue(forKey: keyBytes(target)))
                guard tier.statistics.regionsReclaimed == 2 else { continue }  // the tombstone fitted: no reclaim
                reached += 1
                // Dropped without a close: as a crash.
            }
            let reopened = try oneBucket(directory)
            #expect(try reopened.value(forKey: keyBytes(target)) == nil, "filler \(filler): the removed value came back")
        }
        #expect(reached >= 1, "no filler count made the tombstone's write reclaim the region")
    }

    @Test("a snapshot put back after its file changed in place (regions reclaimed, the same length) is never trusted")
    func staleSnapshotSameLength() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let bucket = directory.path + "/buckets/" + DiskTier.bucketName(0, count: 1)
        var tier = try oneBucket(directory)
        var i = 0
        while tier.statistics.regionsReclaimed < 2 {  // the file is as long as it gets: 16 slots
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        // A full tier's close has no room for a snapshot: one is written here, as a close with room would.
        try tier.flush()
        #expect(tier.buckets[0].withLock { $0.writeSnapshot() } > 0)
        let stale = try Data(contentsOf: URL(fileURLWithPath: bucket + ".index"))
        try tier.close()
        let length = try FileManager.default.attributesOfItem(atPath: bucket)[.size] as? Int
        // Reopened: more stores reclaim regions in place, and one key still in an old region is removed.
        tier = try oneBucket(directory)
        let removed = i - 60
        #expect(try tier.removeValue(forKey: keyBytes(removed)))
        let first = i
        for _ in 0..<40 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        try tier.close()
        #expect(try FileManager.default.attributesOfItem(atPath: bucket)[.size] as? Int == length)
        // The old snapshot comes back (a backup restored): same file length, other regions.
        try stale.write(to: URL(fileURLWithPath: bucket + ".index"))
        tier = try oneBucket(directory)
        #expect(try tier.value(forKey: keyBytes(removed)) == nil, "a removed value came back")
        for k in first..<i { #expect(try tier.value(forKey: keyBytes(k)) == random(200, seed: UInt64(k)), "key \(k)") }
        #expect(tier.statistics.bucketsOpenedFromSnapshot == 0)
    }

    @Test("a reclaim reinserts by reads per byte: a small entry needs fewer reads than one of the mean length, a large one more")
    func sizeAware() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory, threshold: 4)
        // The oldest region: four small entries (key-1000…) and two large ones (key-2000…), then
        // medium ones fill the rest of the bucket, so the mean record stays near the medium length.
        for k in 0..<4 { try tier.set(random(56, seed: UInt64(1000 + k)), forKey: keyBytes(1000 + k)) }  // 128-byte records
        for k in 0..<2 { try tier.set(random(600, seed: UInt64(2000 + k)), forKey: keyBytes(2000 + k)) }  // 672-byte records
        for j in 0..<3 {
            _ = try tier.value(forKey: keyBytes(1000))  // small, read 3 times: 3 × ~270 ≥ 4 × 128
            _ = try tier.value(forKey: keyBytes(2000))  // large, read 3 times: 3 × ~270 < 4 × 672
            if j == 0 { _ = try tier.value(forKey: keyBytes(1001)) }  // small, read once: 270 < 512
        }
        var i = 0
        while tier.statistics.regionsReclaimed == 0 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        #expect(try holds(tier, 1000), "a small entry read often enough for its size was evicted")
        #expect(try !holds(tier, 1001) && !holds(tier, 1002) && !holds(tier, 1003))
        #expect(try !holds(tier, 2000), "a large entry read as often as the small one was reinserted")
        #expect(try !holds(tier, 2001))
        #expect(tier.statistics.reinsertions == 1)
    }

    @Test("a reinserted entry starts again from no reads: unread since, it goes at the next reclaim of its region")
    func reinsertedStartsOver() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        try tier.set(random(200, seed: 1), forKey: keyBytes(0))
        for _ in 0..<5 { _ = try tier.value(forKey: keyBytes(0)) }
        var i = 1
        // The first reclaim reinserts key 0; a full turn of the bucket later, its copy's region is the
        // oldest, and key 0, unread since, is evicted.
        while tier.statistics.reinsertions == 0 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        #expect(try holds(tier, 0))
        let reclaimed = tier.statistics.regionsReclaimed
        while tier.statistics.regionsReclaimed < reclaimed + 17 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        #expect(try !holds(tier, 0))
        #expect(tier.statistics.reinsertions == 1)
    }

    @Test("a reclaim reinserts at most three quarters of a region, so every reclaim makes room")
    func reinsertionCap() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try oneBucket(directory)
        for i in 0..<7 { try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i)) }
        for _ in 0..<5 { for i in 0..<7 { _ = try tier.value(forKey: keyBytes(i)) } }  // the whole oldest region is hot
        var i = 7
        while tier.statistics.regionsReclaimed == 0 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            i += 1
        }
        // 7 records of 272 bytes: 5 fit in three quarters of 2 KiB (1536 bytes).
        #expect(tier.statistics.reinsertions == 5 && tier.statistics.evictions == 2)
        #expect(try (0..<7).filter { try holds(tier, $0) }.count == 5)
    }

    @Test("recovery applies a tombstone's cover: it removes older records of its key, never a newer one")
    func tombstoneCovers() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let seed: UInt64 = 0x5EED
        var file = HandMadeBucketFile(seed: seed)
        // Region 1: a@1, b@2. Region 2: a@5 (newer), then a tombstone carried forward from an older region,
        // covering sequences below 3 (so not a@5), then b's tombstone covering below 7 (so b@2 goes).
        file.appendRegion(1, first: 1, [file.record(.value, key: "a", value: [1], sequence: 1), file.record(.value, key: "b", value: [2], sequence: 2)])
        file.appendRegion(2, first: 5, [
            file.record(.value, key: "a", value: [5], sequence: 5), file.record(.tombstone, key: "a", sequence: 6, cover: 3),
            file.record(.tombstone, key: "b", sequence: 7),
        ])
        try file.install(in: directory.path)
        let tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 1, hashSeed: seed))
        #expect(try tier.value(forKey: "a") == [5], "a carried tombstone removed a value written after the one it covers")
        #expect(try tier.value(forKey: "b") == nil, "a tombstone did not remove the value it covers")
        #expect(tier.statistics.corruptRecords == 0)
        try tier.close()
    }

    @Test("a region whose header is damaged loses its records, never their effect: its tombstones' keys and its values' older records are dropped, counted once")
    func damagedRegionHeader() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let seed: UInt64 = 0x5EED
        let regionSize = HandMadeBucketFile.regionSize
        // Region 1: a, b, c, d (g's member), e (g's member). Region 2, its header damaged: b's tombstone, a
        // newer c, the group tombstone of g, f. Region 3, intact: h.
        var file = HandMadeBucketFile(seed: seed)
        file.appendRegion(1, first: 1, [
            file.record(.value, key: "a", value: [1], sequence: 1), file.record(.value, key: "b", value: [2], sequence: 2),
            file.record(.value, key: "c", value: [3], sequence: 3), file.record(.value, key: "d", value: [4], sequence: 4, group: "g"),
            file.record(.value, key: "e", value: [5], sequence: 5, group: "g"),
        ])
        let damaged = file.appendRegion(2, first: 6, [
            file.record(.tombstone, key: "b", sequence: 6), file.record(.value, key: "c", value: [7], sequence: 7),
            file.record(.groupTombstone, key: "", sequence: 8, group: "g"), file.record(.value, key: "f", value: [9], sequence: 9),
        ]) { $0[44] ^= 1 }  // a reserved byte: the header's checksum fails
        file.appendRegion(3, first: 10, [file.record(.value, key: "h", value: [10], sequence: 10)])
        let bucket = try file.install(in: directory.path)
        func reopen(_ check: (DiskTier) throws -> Void) throws {
            let tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 1, hashSeed: seed))
            try check(tier)
            try tier.close()
        }
        try reopen { (tier: DiskTier) throws in
            #expect(try tier.value(forKey: "a") == [1])
            #expect(try tier.value(forKey: "b") == nil, "a removed value came back: its tombstone's region header was damaged")
            #expect(try tier.value(forKey: "c") == nil, "a replaced value came back")
            #expect(try tier.value(forKey: "d") == nil, "a removed group came back")
            #expect(try tier.value(forKey: "e") == nil, "a removed group came back")
            #expect(try tier.value(forKey: "f") == nil)
            #expect(try tier.value(forKey: "h") == [10])
            #expect(tier.statistics.corruptRecords == 1 && tier.statistics.droppedForDamage == 4)
            try tier.set([11], forKey: "c")  // a value stored after the damage was found is kept
        }
        // The free slot reused, its records gone (as they will be): what was dropped stays dropped (the
        // tombstones written at the first load), nothing is counted again, and the new c is kept.
        var image = [UInt8](try Data(contentsOf: URL(fileURLWithPath: bucket)))
        let hiddenSlot = BucketFileHeader.size + regionSize
        #expect(image[hiddenSlot + 64..<hiddenSlot + 128] == damaged[64..<128][...], "the test's layout changed")
        image.replaceSubrange(hiddenSlot..<(hiddenSlot + regionSize), with: [UInt8](repeating: 0, count: regionSize))
        try HandMadeBucketFile.install(image, at: bucket)
        try reopen { (tier: DiskTier) throws in
            #expect(try tier.value(forKey: "a") == [1])
            #expect(try tier.value(forKey: "b") == nil)
            #expect(try tier.value(forKey: "c") == [11])
            #expect(try tier.value(forKey: "d") == nil)
            #expect(try tier.value(forKey: "e") == nil)
            #expect(tier.statistics.corruptRecords == 0)
        }

        // The same records in a slot the tier freed (its header zeroed), carried forward as an evacuation does:
        // nothing is dropped, nothing counted.
        var freed = HandMadeBucketFile(seed: seed)
        freed.appendRegion(1, first: 1, [
            freed.record(.value, key: "a", value: [1], sequence: 1), freed.record(.value, key: "b", value: [2], sequence: 2),
            freed.record(.value, key: "c", value: [3], sequence: 3),
        ])
        freed.appendRegion(2, first: 6, [freed.record(.tombstone, key: "b", sequence: 6), freed.record(.value, key: "c", value: [7], sequence: 7)]) {
            for i in 0..<64 { $0[i] = 0 }
        }
        freed.appendRegion(3, first: 10, [
            freed.record(.tombstone, key: "b", sequence: 10, cover: 6), freed.record(.value, key: "c", value: [7], sequence: 11),
        ])
        try freed.install(in: directory.path)
        try reopen { (tier: DiskTier) throws in
            #expect(try tier.value(forKey: "a") == [1])
            #expect(try tier.value(forKey: "b") == nil)
            #expect(try tier.value(forKey: "c") == [7])
            #expect(tier.statistics.corruptRecords == 0 && tier.statistics.droppedForDamage == 0)
        }
    }

    @Test("a bucket that gives room back empties its last regions out of turn: their tombstones go forward, and a crash brings nothing back")
    func lendCarriesTombstones() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (configuration, first, second) = twoBuckets(directory)
        let tier = try DiskTier(configuration)
        // Bucket 0 fills its share, then removes half its keys: the tombstones land in its newest regions.
        var stored: [Int] = []
        for key in first.prefix(400) {
            try tier.set(random(300, seed: UInt64(key)), forKey: keyBytes(key))
            stored.append(key)
            if tier.statistics.regionsReclaimed > 0 { break }
        }
        let removed = try stored.filter { try $0 % 2 == 0 && holds(tier, $0) }
        #expect(removed.count > 20)
        for key in removed { #expect(try tier.removeValue(forKey: keyBytes(key))) }
        // A value larger than bucket 1 can hold alone: bucket 0 gives up its last slots to lend room.
        let large = random(tier.largestStorableValue - 64, seed: 99)
        try tier.set(large, forKey: keyBytes(second[0]))
        #expect(tier.statistics.regionsEvacuated > 0, "bucket 0 lent nothing out of turn: the test proved nothing")
        #expect(try tier.value(forKey: keyBytes(second[0])) == large)
        // A crash: what the files hold now.
        let image = directory.child("crash")
        try DiskMemtableTests.crashImage(of: directory.path, to: image, holding: tier)
        var reopenedConfiguration = configuration
        reopenedConfiguration.directory = image
        let recovered = try DiskTier(reopenedConfiguration)
        for key in removed { #expect(try recovered.value(forKey: keyBytes(key)) == nil, "removed key \(key) came back") }
        for key in stored where key % 2 == 1 {
            let got = try recovered.value(forKey: keyBytes(key))
            #expect(got == nil || got == random(300, seed: UInt64(key)))
        }
        #expect(recovered.statistics.corruptRecords == 0)
        try recovered.close()
        try tier.close()
    }

    @Test("a bucket that could not zero a freed region's header (a scan would find its records, which no slot points at) writes no snapshot at its close")
    func noSnapshotOverUnindexedRecords() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (configuration, first, second) = twoBuckets(directory)
        let tier = try DiskTier(configuration)
        // Bucket 0 holds about 27 KiB (its share is 32), so that the tier has room for snapshots at the close.
        for key in first.prefix(90) { try tier.set(random(300, seed: UInt64(key)), forKey: keyBytes(key)) }
        try tier.set(random(300, seed: 1), forKey: keyBytes(second[1]))
        // Bucket 0's writes fail while bucket 1's large store makes it give room back: the header of the
        // region it empties out of turn is not zeroed, so the file holds a region the index does not.
        let bucket0 = directory.path + "/buckets/" + DiskTier.bucketName(0, count: 2)
        FileIOFaults.set(under: directory.path) { call, path in call == "pwrite" && path == bucket0 ? EIO : nil }
        _ = try? tier.set(random(tier.largestStorableValue - 64, seed: 99), forKey: keyBytes(second[0]))
        FileIOFaults.set(under: directory.path, nil)
        try tier.close()
        #expect(!FileManager.default.fileExists(atPath: bucket0 + ".index"), "a snapshot that cannot say what the file holds")
        #expect(FileManager.default.fileExists(atPath: directory.path + "/buckets/" + DiskTier.bucketName(1, count: 2) + ".index"))
    }

    @Test("a value whose payload is damaged is dropped and counted once: its region is emptied into the newest one")
    func healKnownDamage() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 1 << 20, bucketCount: 1, compressionLevel: nil, hashSeed: 5)
        configuration.writeBufferSize = 0
        do {
            let tier = try DiskTier(configuration)
            for i in 0..<50 { try tier.set(selfDescribingValue(key: i, version: 1, length: 500), forKey: keyBytes(i)) }
            try tier.close()
        }
        // Flip a byte of key 7's payload in the file.
        let bucket = directory.path + "/buckets/" + DiskTier.bucketName(0, count: 1)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: bucket)))
        let needle = Array(selfDescribingValue(key: 7, version: 1, length: 500).prefix(16))  // "k7v1l500;…": its own
        let at = try #require((0..<(bytes.count - 16)).first { Array(bytes[$0..<($0 + 16)]) == needle })
        bytes[at + 10] ^= 0x40
        try Data(bytes).write(to: URL(fileURLWithPath: bucket))
        do {
            let tier = try DiskTier(configuration)  // from the snapshot: the damage is found by the read
            #expect(try tier.value(forKey: keyBytes(7)) == nil)
            let statistics = tier.statistics
            #expect(statistics.corruptRecords == 1 && statistics.regionsEvacuated == 1)
            for i in 0..<50 where i != 7 {
                #expect(try tier.value(forKey: keyBytes(i)) == selfDescribingValue(key: i, version: 1, length: 500), "key \(i)")
            }
            try tier.close()
        }
        try? FileManager.default.removeItem(atPath: bucket + ".index")
        let rescanned = try DiskTier(configuration)
        #expect(rescanned.statistics.corruptRecords == 0, "the damage was still in the file")
        #expect(rescanned.statistics.entries == 49)
        try rescanned.close()
    }
}
