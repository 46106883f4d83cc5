import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// Opening after a clean close without a system call per bucket (DiskTier.swift, "Reopening"): SIZES
/// gives every bucket file's and snapshot's size, so the open lists and opens nothing in buckets/; a
/// bucket opens its file at its load; SIZES goes before any bucket file changes, and a snapshot a get
/// loaded from goes before its file changes (or on the loader thread). Crash safety and every answer as
/// before, whatever SIZES holds.
@Suite("Disk tier: an open after a clean close opens no bucket file")
struct DiskSizesTests {
    private static let budget = 32 << 20

    private func configuration(_ path: String, buckets: Int = 16, background: Bool = false) -> DiskTier.Configuration {
        var configuration = DiskTier.Configuration(directory: path, budget: Self.budget, bucketCount: buckets, hashSeed: 11)
        configuration.loadsInBackground = background
        configuration.writeBufferSize = 0
        return configuration
    }

    private func value(_ key: Int, _ version: Int) -> [UInt8] { selfDescribingValue(key: key, version: version, length: 200 + key % 300) }

    /// A directory of `count` entries (versions 0), closed cleanly.
    private func filled(_ path: String, buckets: Int = 16, count: Int = 400) throws {
        let tier = try DiskTier(configuration(path, buckets: buckets, background: true))
        for key in 0..<count { try tier.set(value(key, 0), forKey: keyBytes(key)) }
        try tier.close()
    }

    private func names(_ directory: TemporaryDirectory) -> Set<String> {
        Set((try? FileManager.default.contentsOfDirectory(atPath: directory.child("buckets"))) ?? [])
    }

    private func expectAll(_ tier: DiskTier, count: Int = 400, _ expected: (Int) -> [UInt8]?) throws {
        for key in 0..<count { #expect(try tier.value(forKey: keyBytes(key)) == expected(key), "key \(key)") }
    }

    /// The sum of the sizes of every file in the directory (what the budget bounds).
    private func directoryBytes(_ directory: TemporaryDirectory) -> Int {
        var total = 0
        for place in [directory.path, directory.child("buckets")] {
            for name in (try? FileManager.default.contentsOfDirectory(atPath: place)) ?? [] {
                var info = stat()
                if lstat(place + "/" + name, &info) == 0 && info.st_mode & S_IFMT == S_IFREG { total += Int(info.st_size) }
            }
        }
        return total
    }

    @Test("a clean close leaves SIZES; the next open opens no bucket file, a get opens its own, and keeps its snapshot")
    func opensNothing() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        #expect(names(directory).contains("SIZES"))
        let tier = try DiskTier(configuration(directory.path))
        #expect(tier.openBucketFileCount == 0 && tier.loadedBucketCount == 0)
        #expect(try tier.value(forKey: keyBytes(7)) == value(7, 0))
        #expect(tier.openBucketFileCount == 1 && tier.loadedBucketCount == 1)
        // Nothing changed yet: SIZES and every snapshot (the loaded bucket's included) are still there.
        #expect(names(directory).contains("SIZES"))
        #expect(names(directory).filter { $0.hasSuffix(".index") }.count == 16)
        #expect(tier.statistics.bucketsOpenedFromSnapshot == 16)
        #expect(tier.openBucketFileCount == 16)
        try expectAll(tier) { value($0, 0) }
        #expect(tier.ledgerTotal == Self.budget)
        try tier.close()
        // Closed again with nothing changed: the same shape, and the next open uses it again.
        let again = try DiskTier(configuration(directory.path))
        #expect(again.openBucketFileCount == 0)
        try expectAll(again) { value($0, 0) }
        #expect(again.statistics.bucketsOpenedFromSnapshot == 16)
        try again.close()
    }

    /// The first change after an open that read SIZES, and what a crash right after it must find.
    enum FirstChange: CaseIterable, Sendable {
        case set, remove, groupRemoval, removeAll
    }

    @Test("SIZES and the changed buckets' snapshots are gone before a file changes; a crash then measures and scans",
          arguments: FirstChange.allCases)
    func goneBeforeTheFirstChange(change: FirstChange) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        do {
            let tier = try DiskTier(configuration(directory.path))
            #expect(try tier.value(forKey: keyBytes(3)) == value(3, 0))  // loads its bucket from the snapshot
            let snapshots = names(directory).filter { $0.hasSuffix(".index") }
            #expect(snapshots.count == 16 && names(directory).contains("SIZES"))
            #expect(tier.ledgerTotal == Self.budget)
            switch change {
            case .set: try tier.set(value(3, 1), forKey: keyBytes(3))
            case .remove: #expect(try tier.removeValue(forKey: keyBytes(3)))
            case .groupRemoval: #expect(try tier.removeAll(inGroup: "nobody's") == 0)  // no member: nothing written
            case .removeAll: try tier.removeAll()
            }
            #expect(names(directory).contains("SIZES") == (change == .groupRemoval))
            let kept = names(directory).filter { $0.hasSuffix(".index") }.count
            #expect(kept == (change == .set || change == .remove ? 15 : change == .groupRemoval ? 16 : 0), "\(change)")  // the changed buckets' only
            #expect(tier.ledgerTotal == Self.budget)
            // Dropped without close: as a crash.
        }
        let reopened = try DiskTier(configuration(directory.path))
        // No SIZES: every file measured at the open (after a group removal that wrote nothing, SIZES is true).
        #expect(reopened.openBucketFileCount == (change == .groupRemoval ? 0 : 16))
        try expectAll(reopened) { key in
            switch change {
            case .set: key == 3 ? value(3, 1) : value(key, 0)
            case .remove: key == 3 ? nil : value(key, 0)
            case .groupRemoval: value(key, 0)
            case .removeAll: nil
            }
        }
        #expect(reopened.statistics.bucketsOpenedFromSnapshot == (change == .set || change == .remove ? 15 : change == .groupRemoval ? 16 : 0))
        #expect(reopened.ledgerTotal == Self.budget)
        try reopened.close()
    }

    @Test("a close with buckets never loaded carries their sizes into the new SIZES; the next open uses them")
    func closeWithUnloadedBuckets() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        let first = try Data(contentsOf: URL(fileURLWithPath: directory.child("buckets/SIZES")))
        do {
            let tier = try DiskTier(configuration(directory.path))
            #expect(try tier.value(forKey: keyBytes(9)) == value(9, 0))  // one bucket loaded, fifteen never opened
            #expect(tier.ledgerTotal == Self.budget)
            try tier.close()
        }
        // Nothing changed, so the new SIZES says what the old one said.
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory.child("buckets/SIZES"))) == first)
        let tier = try DiskTier(configuration(directory.path))
        #expect(tier.openBucketFileCount == 0)
        try expectAll(tier) { value($0, 0) }
        #expect(tier.statistics.bucketsOpenedFromSnapshot == 16)
        #expect(tier.ledgerTotal == Self.budget)
        try tier.close()
        #expect(directoryBytes(directory) <= Self.budget)
    }

    @Test("closes and reopens racing the loader thread: every answer exact, the ledger whole, the snapshots used")
    func closeRacesLoader() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path, buckets: 64, count: 640)
        for round in 0..<20 {
            let tier = try DiskTier(configuration(directory.path, buckets: 64, background: true))
            #expect(try tier.value(forKey: keyBytes(round)) == value(round, 0))
            if round % 4 == 3 { _ = tier.statistics }
            try tier.close()  // mostly while the loader thread is still loading and deleting snapshots
        }
        let tier = try DiskTier(configuration(directory.path, buckets: 64))
        try expectAll(tier, count: 640) { value($0, 0) }
        let statistics = tier.statistics
        #expect(statistics.corruptRecords == 0 && statistics.entries == 640)
        #expect(statistics.bucketsOpenedFromSnapshot == 64)
        #expect(tier.ledgerTotal == Self.budget)
        try tier.close()
    }

    @Test("a crash after gets only finds SIZES and the snapshots still true, and uses them")
    func crashAfterReadsOnly() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        do {
            let tier = try DiskTier(configuration(directory.path))
            try expectAll(tier) { value($0, 0) }  // every bucket loaded by a get, no file changed
            #expect(tier.loadedBucketCount == 16)
        }
        #expect(names(directory).contains("SIZES"))
        let reopened = try DiskTier(configuration(directory.path))
        #expect(reopened.openBucketFileCount == 0)
        try expectAll(reopened) { value($0, 0) }
        let statistics = reopened.statistics
        #expect(statistics.bucketsOpenedFromSnapshot == 16 && statistics.corruptRecords == 0 && statistics.entries == 400)
        try reopened.close()
    }

    @Test("the loader thread deletes the snapshots gets loaded from, and frees their charge")
    func loaderRetiresSnapshots() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        let tier = try DiskTier(configuration(directory.path, background: true))
        #expect(try tier.value(forKey: keyBytes(5)) == value(5, 0))
        _ = tier.statistics  // waits for the loader thread
        #expect(names(directory).filter { $0.hasSuffix(".index") }.isEmpty)
        #expect(tier.ledgerTotal == Self.budget)  // their charges freed, once each
        #expect(names(directory).contains("SIZES"))  // no bucket file changed
        try expectAll(tier) { value($0, 0) }
        try tier.close()
    }

    @Test("a SIZES that is no longer true (put back after a crash) costs no answer and no byte over the budget")
    func staleSizes() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path, count: 200)
        let saved = try Data(contentsOf: URL(fileURLWithPath: directory.child("buckets/SIZES")))
        // Keys of bucket 0 only, 7.8 MB of them: its file grows to four times its share (it borrows).
        let hasher = KeyHash(seed: 11)
        let heavy = (1000..<100_000).filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 16) == 0 }.prefix(130)
        func big(_ key: Int) -> [UInt8] { selfDescribingValue(key: key, version: 1, length: 60_000) }
        do {
            let tier = try DiskTier(configuration(directory.path))
            for key in heavy { try tier.set(big(key), forKey: keyBytes(key)) }
            for key in 0..<50 { _ = try tier.removeValue(forKey: keyBytes(key)) }
            // A crash; then the old SIZES comes back (a backup restored, a power loss).
        }
        try saved.write(to: URL(fileURLWithPath: directory.child("buckets/SIZES")))
        let tier = try DiskTier(configuration(directory.path))
        #expect(tier.openBucketFileCount == 0)  // it is believed at the open…
        for key in heavy { #expect(try tier.value(forKey: keyBytes(key)) == big(key), "key \(key)") }
        try expectAll(tier, count: 200) { $0 < 50 ? nil : value($0, 0) }
        // …but no snapshot of a written bucket (bucket 0, and those of the removals) fits its file any more.
        #expect(tier.statistics.bucketsOpenedFromSnapshot <= 15)
        #expect(tier.ledgerTotal == Self.budget)
        // The ledger took bucket 0's real size at its load: filling the other buckets twice over stays
        // within the budget.
        let others = (100_000..<200_000).lazy.filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 16) != 0 }
        for key in others.prefix(2 * Self.budget / 60_000) {
            try tier.set(selfDescribingValue(key: key, version: 0, length: 60_000), forKey: keyBytes(key))
            #expect(tier.holdingEveryBucket { directoryBytes(directory) } <= Self.budget, "after key \(key)")
        }
        try tier.close()
        #expect(directoryBytes(directory) <= Self.budget)
    }

    @Test("a damaged, foreign or linked SIZES is never used: removed, and every file measured", arguments: 0..<6)
    func damagedSizes(kind: Int) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        let path = directory.child("buckets/SIZES")
        var bytes = try Array(Data(contentsOf: URL(fileURLWithPath: path)))
        let outside = directory.child("outside")
        switch kind {
        case 0: bytes[40] ^= 0x01  // a size, the checksum left as it was
        case 1: bytes.removeLast(16)  // truncated
        case 2: bytes = Array(bytes.prefix(24)) + [UInt8](repeating: 0xFF, count: bytes.count - 24)  // garbage sizes
        case 3:
            // Huge sizes with a valid checksum (a hostile SIZES): refused, not trapped on.
            var sizes = BucketSizes.decode(bytes, bucketCount: 16, seed: 11)!
            sizes.files[0] = DiskTier.maximumBucketBudget
            bytes = sizes.encoded()
            bytes.withUnsafeMutableBytes { $0.storeBytes(of: UInt64.max.littleEndian, toByteOffset: 24, as: UInt64.self) }
            let end = bytes.count - 8
            let sum = bytes.withUnsafeBytes { KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: $0[0..<end])) }
            bytes.withUnsafeMutableBytes { $0.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self) }
        case 4:
            // Another seed's (another directory's) SIZES.
            var sizes = BucketSizes.decode(bytes, bucketCount: 16, seed: 11)!
            sizes.seed = 12
            bytes = sizes.encoded()
        default:
            // A link in its place, to a copy outside: never read through, removed (the link, not its target).
            try Data(bytes).write(to: URL(fileURLWithPath: outside))
            try FileManager.default.removeItem(atPath: path)
            #expect(symlink(outside, path) == 0)
        }
        if kind < 5 { try Data(bytes).write(to: URL(fileURLWithPath: path)) }
        #expect(BucketSizes.decode(bytes, bucketCount: 16, seed: 11) == nil || kind == 5)
        let tier = try DiskTier(configuration(directory.path))
        #expect(tier.openBucketFileCount == 16, "kind \(kind)")
        #expect(!names(directory).contains("SIZES"))
        try expectAll(tier) { value($0, 0) }
        #expect(tier.statistics.bucketsOpenedFromSnapshot == 16)
        try tier.close()
        if kind == 5 { #expect(try Array(Data(contentsOf: URL(fileURLWithPath: outside))) == bytes) }
    }

    @Test("strays planted after a clean close are removed: by the loader thread, or at the open without one")
    func strays() throws {
        for background in [true, false] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            try filled(directory.path)
            for name in ["notes.txt", "07.compact", "03.index.tmp", "SIZES.tmp"] {
                #expect(FileManager.default.createFile(atPath: directory.child("buckets/" + name), contents: Data([1, 2, 3])))
            }
            let tier = try DiskTier(configuration(directory.path, background: background))
            _ = tier.statistics
            #expect(names(directory).subtracting(["SIZES"]).allSatisfy { $0.count == 2 || $0.hasSuffix(".index") }, "\(names(directory))")
            try expectAll(tier) { value($0, 0) }
            try tier.close()
        }
    }

    @Test("a bucket file deleted after a clean close is recreated at its load, counted, and its keys miss")
    func missingFile() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try filled(directory.path)
        try FileManager.default.removeItem(atPath: directory.child("buckets/05"))
        let tier = try DiskTier(configuration(directory.path))
        let statistics = tier.statistics
        #expect(statistics.missingBucketFiles == 1)
        #expect(statistics.entries < 400 && statistics.entries > 300)
        var missed = 0
        for key in 0..<400 {
            if let got = try tier.value(forKey: keyBytes(key)) { #expect(got == value(key, 0)) } else { missed += 1 }
        }
        #expect(missed == 400 - statistics.entries)
        try tier.set(value(1, 1), forKey: keyBytes(1))
        #expect(try tier.value(forKey: keyBytes(1)) == value(1, 1))
        try tier.close()
    }
}
