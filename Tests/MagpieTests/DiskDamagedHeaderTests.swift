import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import Magpie

// Damage behind a region header: where the covering tombstones go, and records at the start of a later slot
// (from an independent review's probes).
@Suite("DiskTier: a damaged region header")
struct DiskDamagedHeaderTests {
    /// Region 1: a, b. Region 2, its header damaged: b's tombstone. Region 3: h, filling it (`fullNewest`,
    /// so that the covering tombstone needs a new region: the damaged slot is the only free one) or not.
    static func file(fullNewest: Bool) -> HandMadeBucketFile {
        var file = HandMadeBucketFile(seed: 0x5EED)
        file.appendRegion(1, first: 1, [file.record(.value, key: "a", value: [1], sequence: 1), file.record(.value, key: "b", value: [2], sequence: 2)])
        file.appendRegion(2, first: 3, [file.record(.tombstone, key: "b", sequence: 3)]) { $0[44] ^= 1 }
        let big = fullNewest ? HandMadeBucketFile.regionSize - 64 - 8 - 65 : 10
        file.appendRegion(3, first: 4, [file.record(.value, key: "h", value: [UInt8](repeating: 7, count: big), sequence: 4)])
        return file
    }

    /// `file` installed in `directory`; the configuration to open it with (its buckets loaded on first use
    /// only) and the bucket file's path.
    static func install(_ file: HandMadeBucketFile, in directory: TemporaryDirectory) throws -> (DiskTier.Configuration, bucket: String) {
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 1 << 20, bucketCount: 1, hashSeed: file.hasher.seed)
        configuration.loadsInBackground = false
        return (configuration, try file.install(in: directory.path))
    }

    @Test("covering tombstones whose write fails leave what the damaged header hid to be found again: the retry drops it too")
    func coveringWriteFails() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (configuration, bucket) = try Self.install(Self.file(fullNewest: true), in: directory)
        let tier = try DiskTier(configuration)
        let count = Atomic<Int>(0)
        FileIOFaults.set(under: directory.path) { call, path in
            guard call == "pwrite", path == bucket else { return nil }
            let n = count.add(1, ordering: .relaxed).newValue
            return n == 2 ? EIO : nil
        }
        _ = Result { try tier.value(forKey: "b") }  // the load fails at the covering write
        FileIOFaults.set(under: directory.path, nil)
        let second = try tier.value(forKey: "b")
        #expect(second == nil, "a removed value came back")
        try tier.close()
    }

    @Test("covering tombstones never go into the slot whose records they replace: a crash after the new region's header brings nothing back")
    func coveringWriteCrash() throws {
        // Crash after the new region's header is written into the hidden slot, before its records.
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (configuration, bucket) = try Self.install(Self.file(fullNewest: true), in: directory)
        let tier = try DiskTier(configuration)
        let count = Atomic<Int>(0)
        // Record the file after the first pwrite (the region header) as the crash image.
        let image = Mutex<[UInt8]?>(nil)
        FileIOFaults.set(under: directory.path) { call, path in
            guard call == "pwrite", path == bucket else { return nil }
            let n = count.add(1, ordering: .relaxed).newValue
            if n == 2 { image.withLock { $0 = [UInt8](try! Data(contentsOf: URL(fileURLWithPath: bucket))) } }
            return nil
        }
        #expect(try tier.value(forKey: "b") == nil)
        FileIOFaults.set(under: directory.path, nil)
        try tier.close()
        try HandMadeBucketFile.install(image.withLock { $0 }!, at: bucket)
        let again = try DiskTier(configuration)
        let b = try again.value(forKey: "b")
        #expect(b == nil, "a removed value came back")
        try again.close()
    }

    @Test("covering tombstones with room in the newest region")
    func coveringWriteInNewest() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (configuration, _) = try Self.install(Self.file(fullNewest: false), in: directory)
        let tier = try DiskTier(configuration)
        let b = try tier.value(forKey: "b")
        #expect(b == nil)
        try tier.close()
    }

    @Test("a record in the first bytes of a damaged multi-slot region's later slot is checked too")
    func damagedJumboSecondSlot() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var file = HandMadeBucketFile(seed: 0x5EED)
        file.appendRegion(1, first: 1, [file.record(.value, key: "a", value: [1], sequence: 1), file.record(.value, key: "b", value: [2], sequence: 2)])
        let big = file.record(.value, key: "x", value: [UInt8](repeating: 9, count: 3983), sequence: 3)
        #expect(big.count == 4048)
        file.appendRegion(2, first: 3, slots: 2, [big, file.record(.tombstone, key: "b", sequence: 4)]) { $0[44] ^= 1 }
        file.appendRegion(3, first: 5, [file.record(.value, key: "h", value: [5], sequence: 5)])
        let (configuration, _) = try Self.install(file, in: directory)
        let tier = try DiskTier(configuration)
        let b = try tier.value(forKey: "b")
        #expect(b == nil, "a removed value came back")
        try tier.close()
    }

    /// Free slots the tier itself left never drop anything: churn (stores of small and multi-slot values,
    /// reads that earn reinsertion, removals, group removals, buckets lending to each other) with a crash
    /// image every 150 operations, each recovered with nothing counted corrupt or dropped, and never a
    /// value other than the key's latest (or, where a store failed, one it tried). 40 seeds were run by
    /// the review; 12 here.
    @Test("churn with crash images: recovery of free slots the tier left drops nothing, counts nothing", arguments: Array(1...12))
    func churnCrashImagesNoFalseDrops(seed: Int) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 64 << 10, bucketCount: 2, compressionLevel: nil, hashSeed: 3)
        configuration.writeBufferSize = seed % 2 == 0 ? 0 : 4096
        let tier = try DiskTier(configuration)
        var generator = SeededGenerator(seed: UInt64(seed) &* 7919)
        var allowed: [Int: [[UInt8]?]] = [:]  // what a read may return besides nil
        var images = 0
        var problems: [String] = []
        for step in 0..<3000 {
            let key = Int.random(in: 0..<120, using: &generator)
            let op = Int.random(in: 0..<20, using: &generator)
            switch op {
            case 0..<9:
                let length = Int.random(in: 0..<10, using: &generator) == 0 ? Int.random(in: 2000...9000, using: &generator) : Int.random(in: 0...600, using: &generator)
                let value = selfDescribingValue(key: key, version: step, length: length)
                do {
                    try tier.set(value, forKey: keyBytes(key), group: key % 5 == 0 ? "five" : nil)
                    allowed[key] = [value]
                } catch {
                    allowed[key, default: []].append(value)
                }
            case 9..<15:
                _ = try? tier.value(forKey: keyBytes(key))
            case 15..<18:
                do {
                    _ = try tier.removeValue(forKey: keyBytes(key))
                    allowed[key] = []
                } catch {}
            case 18:
                if step % 7 == 0 {
                    if (try? tier.removeAll(inGroup: "five")) != nil {
                        for k in allowed.keys where k % 5 == 0 && k < 1000 { allowed[k] = [] }
                    }
                }
            default:
                // a large value in the other key space: buckets lend to each other
                let length = Int.random(in: 10_000...24_000, using: &generator)
                let k = 1000 + Int.random(in: 0..<4, using: &generator)
                let value = selfDescribingValue(key: k, version: step, length: length)
                do {
                    try tier.set(value, forKey: keyBytes(k))
                    allowed[k] = [value]
                } catch {
                    allowed[k, default: []].append(value)
                }
            }
            if step % 150 == 149 {
                images += 1
                let image = directory.child("crash\(images)")
                try DiskMemtableTests.crashImage(of: directory.path, to: image, holding: tier)
                var c = configuration
                c.directory = image
                let recovered = try DiskTier(c)
                for (k, values) in allowed {
                    let got = try recovered.value(forKey: keyBytes(k))
                    if let got, !values.contains(where: { $0 == got }) {
                        problems.append("step \(step): key \(k) returned \(String(decoding: got.prefix(12), as: UTF8.self)) len \(got.count); allowed \(values.map { $0.map { String(decoding: $0.prefix(12), as: UTF8.self) + " len \($0.count)" } ?? "nil" })")
                    }
                }
                let s = recovered.statistics
                if s.corruptRecords != 0 || s.droppedForDamage != 0 {
                    problems.append("step \(step): corrupt \(s.corruptRecords) dropped \(s.droppedForDamage) truncated \(s.truncatedTails)")
                }
                try recovered.close()
            }
        }
        #expect(problems.isEmpty, "\(problems.prefix(10))")
        try tier.close()
    }
}
