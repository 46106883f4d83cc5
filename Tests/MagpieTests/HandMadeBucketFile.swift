import Foundation
import MagpieTestSupport

@testable import Magpie

/// A bucket file written by hand (bucket 0 of a one-bucket tier, 4 KiB slots), for recovery tests: records
/// and regions laid out as the tier lays them out, with whatever damage a test puts in.
struct HandMadeBucketFile {
    static let regionSize = 4096
    let hasher: KeyHash
    private(set) var bytes: [UInt8]

    init(seed: UInt64) {
        hasher = KeyHash(seed: seed)
        bytes = BucketFileHeader(bucketIndex: 0, bucketCount: 1, seed: seed, regionSize: Self.regionSize).encoded()
    }

    /// A sealed record (`cover`: a tombstone's; a group tombstone has no key).
    func record(_ kind: RecordKind, key: String, value: [UInt8] = [], sequence: UInt64, cover: Int64 = 0, group: String = "") -> [UInt8] {
        let keyBytes = kind == .groupTombstone ? [] : Array(key.utf8)
        let groupBytes = Array(group.utf8)
        let header = RecordHeader(
            kind: kind, codec: .raw, keyLength: keyBytes.count, groupLength: groupBytes.count, storedLength: value.count,
            originalLength: value.count, expiry: cover, sequence: sequence, keyHash: kind == .groupTombstone ? 0 : hasher.hash(keyBytes))
        return keyBytes.withUnsafeBytes { k in
            groupBytes.withUnsafeBytes { g in value.withUnsafeBytes { v in RecordHeader.makeRecord(header, key: k, group: g, payload: v) } }
        }
    }

    /// Appends a region of `slots` slots holding `records` (`header` may change its 64 header bytes first,
    /// to damage or zero them); returns its bytes.
    @discardableResult
    mutating func appendRegion(
        _ sequence: UInt64, first: UInt64, slots: Int = 1, _ records: [[UInt8]], header: (inout [UInt8]) -> Void = { _ in }
    ) -> [UInt8] {
        var region = RegionHeader(bucketIndex: 0, slots: slots, sequence: sequence, firstRecordSequence: first).encoded(hasher: hasher)
        header(&region)
        for record in records { region += record }
        region += [UInt8](repeating: 0, count: slots * Self.regionSize - region.count)
        bytes += region
        return region
    }

    /// A tier's directory at `directory` (made by a tier with this file's seed, then closed) with this file
    /// as its bucket, and neither its snapshot nor SIZES, so that the next open scans it. Returns the
    /// bucket file's path.
    @discardableResult
    func install(in directory: String) throws -> String {
        let bucket = directory + "/buckets/" + DiskTier.bucketName(0, count: 1)
        if !FileManager.default.fileExists(atPath: bucket) {
            _ = try DiskTier(.init(directory: directory, budget: 1 << 20, bucketCount: 1, hashSeed: hasher.seed)).close()
        }
        try Self.install(bytes, at: bucket)
        return bucket
    }

    /// Writes `bytes` as the bucket file at `bucket` and removes its snapshot and SIZES.
    static func install(_ bytes: [UInt8], at bucket: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: bucket))
        let buckets = (bucket as NSString).deletingLastPathComponent
        for name in [bucket + ".index", buckets + "/SIZES"] { try? FileManager.default.removeItem(atPath: name) }
    }
}
