import Foundation
@testable import Magpie
import MagpieTestSupport
import Testing

@Suite("DiskTier: corruption")
struct DiskCorruptionTests {
    /// Writes `count` self-describing values (half compressible) into a fresh tier and closes it.
    static func populate(_ path: String, count: Int) throws -> [Int: [UInt8]] {
        let tier = try DiskTier(.init(directory: path, budget: 4 << 20, bucketCount: 4, hashSeed: 77))
        var written: [Int: [UInt8]] = [:]
        for i in 0..<count {
            var value = selfDescribingValue(key: i, version: 1, length: 40 + i * 37 % 3000)
            if i % 2 == 0 { value += [UInt8](repeating: UInt8(i % 7), count: 500) }
            try tier.set(value, forKey: keyBytes(i), group: i % 5 == 0 ? "five" : nil)
            written[i] = value
        }
        try tier.removeAll(inGroup: "five")
        for i in stride(from: 0, to: count, by: 5) { written[i] = nil }
        try tier.close()
        return written
    }

    static func bucketFiles(_ path: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path + "/buckets")) ?? []).sorted().map { path + "/buckets/" + $0 }
    }

    enum Damage: String, CaseIterable { case bitFlips, zeroedRange, truncation, garbageTail, swappedFiles }

    static func damage(_ path: String, _ kind: Damage, using generator: inout SeededGenerator) throws {
        let files = bucketFiles(path).filter { !$0.hasSuffix(".index") }
        switch kind {
        case .swappedFiles:
            try FileManager.default.moveItem(atPath: files[0], toPath: files[0] + ".x")
            try FileManager.default.moveItem(atPath: files[1], toPath: files[0])
            try FileManager.default.moveItem(atPath: files[0] + ".x", toPath: files[1])
            return
        default:
            break
        }
        for file in files {
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
            guard bytes.count > 64 else { continue }
            switch kind {
            case .bitFlips:
                for _ in 0..<8 {
                    let at = Int.random(in: 0..<bytes.count, using: &generator)
                    bytes[at] ^= 1 << UInt8.random(in: 0..<8, using: &generator)
                }
            case .zeroedRange:
                let start = Int.random(in: 32..<bytes.count, using: &generator)
                let end = min(bytes.count, start + Int.random(in: 1...2000, using: &generator))
                for at in start..<end { bytes[at] = 0 }
            case .truncation:
                bytes.removeLast(Int.random(in: 1..<(bytes.count - 32), using: &generator))
            case .garbageTail:
                bytes += (0..<Int.random(in: 1...5000, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            case .swappedFiles:
                break
            }
            try Data(bytes).write(to: URL(fileURLWithPath: file))
        }
    }

    /// Keys 0..<60 written twice (version 1, then 2), then: keys 0..<10 removed, group "g" (keys
    /// 10..<30, version 2) removed, keys 30..<40 updated to version 3. Returns each bucket file's size
    /// just before the removals and the final updates, and the values that must remain.
    static func removalScenario(_ path: String) throws -> (sizes: [String: Int], expected: [Int: [UInt8]]) {
        let tier = try DiskTier(.init(directory: path, budget: 4 << 20, bucketCount: 4, hashSeed: 99))
        var expected: [Int: [UInt8]] = [:]
        for version in 1...2 {
            for i in 0..<60 {
                let value = selfDescribingValue(key: i, version: version, length: 300)
                try tier.set(value, forKey: keyBytes(i), group: (10..<30).contains(i) ? "g" : nil)
                expected[i] = value
            }
        }
        try tier.flush()
        var sizes: [String: Int] = [:]
        for file in bucketFiles(path) where !file.hasSuffix(".index") { sizes[file] = (try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? 0 }
        for i in 0..<10 { try tier.removeValue(forKey: keyBytes(i)); expected[i] = nil }
        try tier.removeAll(inGroup: "g")
        for i in 10..<30 { expected[i] = nil }
        for i in 30..<40 {
            let value = selfDescribingValue(key: i, version: 3, length: 300)
            try tier.set(value, forKey: keyBytes(i))
            expected[i] = value
        }
        try tier.close()
        return (sizes, expected)
    }

    @Test("an index snapshot with a valid checksum but impossible counts is refused, never a trap")
    func hostileSnapshotCounts() {
        let slots = [DiskSlot](repeating: .empty, count: 4)
        let snapshot = IndexSnapshot(
            bucketIndex: 0, bucketCount: 1, seed: 1, fileSize: BucketFileHeader.size + 2 * 4096, liveBytes: 0, maximumSequence: 0,
            regionSize: 4096, slotCount: 2, nextRegionSequence: 2,
            regions: [Region(slot: 1, slots: 1, sequence: 1, firstRecordSequence: 1, end: 64)], slots: slots, liveCount: 0)
        #expect(IndexSnapshot.decode(snapshot.encoded()) != nil)
        // Every count field set to a value `Int(_:)` cannot hold (or that disagrees with the slots), the
        // checksum recomputed so that only the range checks stand in the way.
        for offset in [24, 32, 48, 56, 64, 72, 96, 104] {
            for value in [UInt64.max, UInt64(Int.max) + 1, 1 << 40] {
                var bytes = snapshot.encoded()
                bytes.withUnsafeMutableBytes { raw in
                    raw.storeBytes(of: value.littleEndian, toByteOffset: offset, as: UInt64.self)
                    let end = raw.count - 8
                    let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
                    raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
                }
                #expect(IndexSnapshot.decode(bytes) == nil, "offset \(offset), value \(value)")
            }
        }
        // A full index (every slot live: a probe for a missing key would never end), encoded as a writer
        // would, and a file of 2³² - 1 slots (the free-slot table and the bucket's charge would be sized by
        // it), with a valid sum.
        let regionStart = BucketFileHeader.size + 4096
        var full = snapshot
        full.regions = [Region(slot: 1, slots: 1, sequence: 1, firstRecordSequence: 1, end: 64 + 4 * 64)]
        full.slots = (0..<4).map { n in
            var slot = DiskSlot(hash: UInt64(n + 1) << 40, memtableParity: 0, offset: 0, length: 64, expiryMilliseconds: 0)
            slot.place(at: regionStart + 64 + n * 64, length: 64)
            return slot
        }
        full.liveCount = 4
        full.liveBytes = 4 * 64
        #expect(IndexSnapshot.decode(full.encoded()) == nil, "a full index")
        var three = full
        three.slots[3] = .empty
        three.liveCount = 3
        three.liveBytes = 3 * 64
        #expect(IndexSnapshot.decode(three.encoded()) != nil, "an index with an empty slot")
        var bytes = snapshot.encoded()
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32.max.littleEndian, toByteOffset: 68, as: UInt32.self)
            let end = raw.count - 8
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
        }
        #expect(IndexSnapshot.decode(bytes) == nil, "2^32 - 1 slots")
    }

    @Test("tombstones alone keep removals and updates durable (nothing in a file is changed in place)")
    func tombstonesAlone() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let prefix = directory.path
        FileIOFaults.set(under: prefix) { call, path in call == "mark" ? EIO : nil }
        defer { FileIOFaults.set(under: prefix, nil) }
        let (_, expected) = try Self.removalScenario(directory.path)
        let tier = try DiskTier(.init(directory: directory.path, budget: 4 << 20, bucketCount: 4))
        for i in 0..<60 { #expect(try tier.value(forKey: keyBytes(i)) == expected[i], "key \(i)") }
    }

    @Test("damage that may hide a tombstone drops what was written before it: a removal never comes back")
    func damageHidingTombstones() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (_, expected) = try Self.removalScenario(directory.path)
        // Zero the first bytes of every tombstone and group tombstone (a write the disk lost), and remove
        // the snapshots, so that recovery scans and meets damage it cannot read.
        var zeroed = 0
        for file in Self.bucketFiles(directory.path) where !file.hasSuffix(".index") && !file.hasSuffix("SIZES") {
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
            var at = BucketFileHeader.size
            while at + RecordHeader.size <= bytes.count {
                let kind = bytes.withUnsafeBytes { RecordHeader.decode(UnsafeRawBufferPointer(rebasing: $0[at...]))?.kind }
                if kind == .tombstone || kind == .groupTombstone {
                    for offset in at..<(at + 16) { bytes[offset] = 0 }
                    zeroed += 1
                }
                at += 8
            }
            try Data(bytes).write(to: URL(fileURLWithPath: file))
        }
        for file in Self.bucketFiles(directory.path) where file.hasSuffix(".index") || file.hasSuffix("SIZES") {
            try FileManager.default.removeItem(atPath: file)
        }
        #expect(zeroed >= 10)
        let tier = try DiskTier(.init(directory: directory.path, budget: 4 << 20, bucketCount: 4))
        var kept = 0
        for i in 0..<60 {
            let got = try tier.value(forKey: keyBytes(i))
            if i < 30 { #expect(got == nil, "key \(i): a removed value came back") }
            if let got {
                #expect(got == expected[i], "key \(i): a replaced value came back")
                kept += 1
            }
        }
        let statistics = tier.statistics
        #expect(statistics.corruptRecords > 0 && statistics.droppedForDamage > 0)
        #expect(kept > 0, "the records written after the damage are kept")
    }

    /// The closed length in bucket file `path`'s header, nil if the header does not decode.
    static func closedLength(_ path: String) throws -> Int? {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)).prefix(BucketFileHeader.size))
        return bytes.withUnsafeBytes { BucketFileHeader.decode($0)?.closedLength }
    }

    @Test("a file cut after a clean close (its tombstones with it) is emptied, never scanned; a change after a reopen clears the closed length first")
    func cutAfterClose() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let written = try Self.populate(directory.path, count: 200)
        let files = Self.bucketFiles(directory.path).filter { $0.hasSuffix("/00") || $0.hasSuffix("/01") || $0.hasSuffix("/02") || $0.hasSuffix("/03") }
        #expect(files.count == 4)
        for file in files {
            let length = try #require(try Self.closedLength(file))
            #expect(length == (try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int), "\(file)")
        }
        // Bucket 0 loses its last 8 bytes (the end of its group tombstone), and everything that could tell
        // the tier what the file was goes too.
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: files[0])))
        bytes.removeLast(8)
        try Data(bytes).write(to: URL(fileURLWithPath: files[0]))
        for file in Self.bucketFiles(directory.path) where file.hasSuffix(".index") || file.hasSuffix("SIZES") {
            try FileManager.default.removeItem(atPath: file)
        }
        let hasher = KeyHash(seed: 77)
        let tier = try DiskTier(.init(directory: directory.path, budget: 4 << 20, bucketCount: 4, hashSeed: 77))
        var inZero = 0
        for i in 0..<200 {
            let got = try tier.value(forKey: keyBytes(i))
            if DiskTier.bucket(of: hasher.hash(keyBytes(i)), count: 4) == 0 {
                #expect(got == nil, "key \(i) of the cut file was served")
                inZero += 1
            } else {
                #expect(got == written[i], "key \(i)")
            }
        }
        #expect(inZero > 20)
        #expect(tier.statistics.truncatedTails == 1)
        // Bucket 1's file changes: its header says 0 before it does (a crash now must not find it "cut").
        let keyOfOne = try #require((1000..<2000).first { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 4) == 1 })
        try tier.set([7], forKey: keyBytes(keyOfOne))
        #expect(try Self.closedLength(files[1]) ?? 0 > 0)  // in a memtable: the file has not changed yet
        try tier.flush()
        #expect(try Self.closedLength(files[1]) == 0)
        #expect(try Self.closedLength(files[2]) ?? 0 > 0)  // unchanged files keep theirs
        try tier.close()
        for file in files { #expect(try Self.closedLength(file) ?? 0 > 0) }
    }

    @Test("damaged bucket files never crash, never yield a wrong value, and are counted", arguments: Damage.allCases)
    func damaged(_ kind: Damage) throws {
        let seed = TestSeed.value(default: 4242)
        var generator = SeededGenerator(seed: seed &+ UInt64(kind.rawValue.count))
        var detected: UInt64 = 0
        var lost = 0
        for round in 0..<4 {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            let written = try Self.populate(directory.path, count: 200)
            try Self.damage(directory.path, kind, using: &generator)
            if round % 2 == 1 {
                // Odd rounds: no index snapshots, so recovery scans (and must catch) the damage on open.
                for file in Self.bucketFiles(directory.path) where file.hasSuffix(".index") {
                    try FileManager.default.removeItem(atPath: file)
                }
            }
            let tier = try DiskTier(.init(directory: directory.path, budget: 4 << 20, bucketCount: 4))
            for i in 0..<200 {
                let got = try tier.value(forKey: keyBytes(i))
                if let got {
                    #expect(got == written[i], "\(kind) seed \(seed) round \(round): key \(i) read a value that was never its own")
                } else if written[i] != nil {
                    lost += 1
                }
            }
            let stats = tier.statistics
            detected += stats.corruptRecords + stats.truncatedTails
            // The damaged tier keeps working.
            try tier.set([1, 2, 3], forKey: "after")
            #expect(try tier.value(forKey: "after") == [1, 2, 3])
        }
        if kind == .garbageTail {
            // Bytes after a file's last record lie in space the format leaves unused (a region's bytes past
            // its records are never read): they cost nothing, and there is nothing to detect.
            #expect(lost == 0, "garbage after the last record cost \(lost) values")
        } else {
            #expect(detected > 0, "\(kind): damage was not detected")
            #expect(lost > 0, "\(kind): damage changed nothing, so the test proved nothing")
        }
    }
}
