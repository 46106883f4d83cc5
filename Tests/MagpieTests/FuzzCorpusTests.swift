import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie
@testable import MagpieFuzzTargets

/// The libFuzzer targets' seed corpus and saved reproducers, replayed on every test run, and checks that
/// the targets reach what they are meant to reach (a target that never validates a record finds nothing).
@Suite("Fuzz targets: corpus replay")
struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus").path

    func run(_ input: [UInt8], directory: String) -> String? {
        input.withUnsafeBytes { FuzzTargets.run($0, directory: directory) }
    }

    @Test("the committed corpus (seeds and reproducers of fixed faults) breaks no invariant")
    func committedCorpus() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let names = try FileManager.default.contentsOfDirectory(atPath: Self.corpus).sorted()
        #expect(names.count >= FuzzTargets.seeds().count)
        for name in names {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: Self.corpus + "/" + name)))
            #expect(run(bytes, directory: directory.path) == nil, "\(name)")
        }
    }

    @Test("record seeds validate, so the re-encoding check is reached; a flipped byte fails validation")
    func recordSeedsValidate() {
        let records = FuzzTargets.seeds().filter { $0.first == 0 }
        #expect(records.count >= 7)
        for seed in records {
            var record = Array(seed.dropFirst())
            #expect(record.withUnsafeBytes { RecordHeader.validate($0) } != nil)
            #expect(record.withUnsafeBytes { FuzzTargets.decodeRecord($0) } == nil)
            record[40] ^= 1  // the key hash, under the checksum
            #expect(record.withUnsafeBytes { RecordHeader.validate($0) } == nil)
        }
    }

    @Test("snapshot seeds decode (regions, a jumbo region, live slots), so the structural checks are reached; a flipped byte fails")
    func snapshotSeedsDecode() throws {
        let snapshots = FuzzTargets.seeds().filter { $0.first == 2 }.map { Array($0.dropFirst()) }
        #expect(snapshots.count == 1)
        for bytes in snapshots {
            let snapshot = try #require(IndexSnapshot.decode(bytes))
            #expect(snapshot.regionSpans.count >= 2 && snapshot.regionSpans.contains { $0.slots > 1 })
            #expect(snapshot.liveRecords.count == 12)
            #expect(bytes.withUnsafeBytes { FuzzTargets.decodeSnapshot($0) } == nil)
            var flipped = bytes
            flipped[100] ^= 1  // the first region's slot count, under the checksum
            #expect(IndexSnapshot.decode(flipped) == nil)
        }
    }

    @Test("a bucket image's oracle knows every valid value, and recovery serves the newest of them")
    func bucketImageOracle() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let seed = FuzzTargets.seeds().first { $0.first == 1 }!
        let image = seed.withUnsafeBytes { BucketImage(UnsafeRawBufferPointer(rebasing: $0.dropFirst()), seed: 0x5EED) }
        let values = try #require(image.values[Array("aa".utf8)])
        #expect(values.count == 2)
        #expect(seed.withUnsafeBytes { FuzzTargets.recoverBucket(UnsafeRawBufferPointer(rebasing: $0.dropFirst()), directory: directory.path) } == nil)
        // Recover the image alone: newest of the two values wins.
        let fresh = TemporaryDirectory()
        defer { fresh.cleanup() }
        _ = try DiskTier(DiskTier.Configuration(directory: fresh.path, budget: 1 << 20, bucketCount: 1, hashSeed: 0x5EED)).close()
        let bucket = fresh.path + "/buckets/" + DiskTier.bucketName(0, count: 1)
        try Data(image.bytes).write(to: URL(fileURLWithPath: bucket))
        try? FileManager.default.removeItem(atPath: bucket + ".index")
        let recovered = try DiskTier(DiskTier.Configuration(directory: fresh.path, budget: 1 << 20, bucketCount: 1, hashSeed: 0x5EED))
        #expect(try recovered.value(forKey: "aa") == values[1])
    }
}
