import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// A store that returned is written: the record a memtable holds finds room when it is sealed (by the
/// sealer thread, `flush()`, `close()`, or the store itself with no write buffer), the way any write
/// does — from the pool, from what the other buckets lend, by evicting — and is never refused for a room
/// the tier itself lent away (issue #58).
@Suite("Disk tier: a sealed record finds room")
struct DiskSealRoomTests {
    /// Who writes the second store's record.
    enum Sealing: String, CustomStringConvertible, CaseIterable {
        /// A value longer than the write buffer: its memtable is detached at once, for the sealer thread.
        case sealer
        /// A small value, in the active memtable until `flush()`.
        case flush
        /// A small value, in the active memtable until `close()`.
        case close
        /// No write buffer: the store writes its record before it returns.
        case writeThrough

        var description: String { rawValue }
    }

    /// A compressible value as in the issue: JSON-like lines, every 16th with another id, which zstd (level
    /// 1) shrinks from the largest storable value to about 95 KB: longer than a write buffer, so its record
    /// gets a memtable of its own, which the sealer thread writes.
    static func text(_ count: Int) -> [UInt8] {
        let line = Array(#"{"id":12345,"name":"a cached value","tags":["x","y","z"],"score":0.75}\#n"#.utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count + line.count)
        var n = 0
        while bytes.count < count {
            if n % 16 == 0 {
                bytes += Array(
                    #"{"id":\#(n * 7919 % 1_000_003),"name":"a cached value","tags":["x","y","z"],"score":0.75}\#n"#
                        .utf8)
            } else {
                bytes += line
            }
            n += 1
        }
        return Array(bytes.prefix(count))
    }

    @Test(
        "after the largest value borrowed from every bucket and the tier reopened, a store into another bucket is written, not refused",
        arguments: Sealing.allCases, [UInt64(58), 59])
    func storeAfterReopenedLoan(sealing: Sealing, seed: UInt64) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 64 << 20
        var configuration = DiskTier.Configuration(directory: directory.path, budget: budget, hashSeed: seed)
        if sealing == .writeThrough { configuration.writeBufferSize = 0 }
        let large = Array("large".utf8)
        let tier = try DiskTier(configuration)
        #expect(tier.bucketCount == 16)
        let largest = tier.largestStorableValue
        // Kept: its bucket borrows about half of every other bucket's share.
        let noise = noiseBytes(largest - large.count, seed: seed)
        try tier.set(noise, forKey: large)
        #expect(try tier.value(forKey: large) == noise)
        try tier.close()

        let again = try DiskTier(configuration)
        // The second key lies in another bucket, empty since the tier was created.
        let hasher = KeyHash(seed: seed)
        let largeBucket = DiskTier.bucket(of: hasher.hash(large), count: again.bucketCount)
        let number = (0..<1000).first {
            DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: again.bucketCount) != largeBucket
        }!
        let key = keyBytes(number)
        let value = sealing == .sealer ? Self.text(largest + 4096) : noiseBytes(1000, seed: seed + 1)
        try again.set(value, forKey: key)
        #expect(try again.value(forKey: key) == value)
        switch sealing {
        case .sealer:
            try again.flush()
            #expect(again.statistics.storedValueBytes > 64 << 10, "compressed, still longer than a write buffer")
        case .writeThrough:
            try again.flush()
        case .flush:
            #expect(again.statistics.bufferedBytes > 0, "the record waits in its memtable for the flush")
            try again.flush()
        case .close:
            break
        }
        if sealing != .close {
            #expect(try again.value(forKey: key) == value)
            #expect(again.statistics.lostBufferedStores == 0)
            // The files hold about half the budget: the room came from buckets with room, not by evicting.
            #expect(again.statistics.evictions == 0)
            #expect(again.ledgerTotal == budget)
        }
        try again.close()  // it seals what is left, and throws a failure of the sealer's
        #expect(directoryBytes(directory.path) <= budget)

        let third = try DiskTier(configuration)
        #expect(try third.value(forKey: key) == value, "the store that returned was written")
        #expect(try third.value(forKey: large) == noise, "nothing had to be evicted")
        try third.close()
    }

    @Test(
        "a tier reopened with a smaller budget than its files hold makes room for a store into an empty bucket by evicting, and ends within that budget",
        arguments: [Sealing.flush, .writeThrough])
    func storeAfterSmallerBudget(sealing: Sealing) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let seed: UInt64 = 61
        var configuration = DiskTier.Configuration(
            directory: directory.path, budget: 64 << 20, compressionLevel: nil, hashSeed: seed)
        let hasher = KeyHash(seed: seed)
        // Every bucket but bucket 0 holds about 3 MiB.
        let keys = (0..<2000).filter { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 16) != 0 }.prefix(450)
        let tier = try DiskTier(configuration)
        for key in keys { try tier.set(noiseBytes(100_000, seed: UInt64(key)), forKey: keyBytes(key)) }
        try tier.close()

        configuration.budget = 32 << 20
        if sealing == .writeThrough { configuration.writeBufferSize = 0 }
        let smaller = try DiskTier(configuration)
        let key = (0..<2000).first { DiskTier.bucket(of: hasher.hash(keyBytes($0)), count: 16) == 0 }!
        let value = noiseBytes(1000, seed: 1)
        try smaller.set(value, forKey: keyBytes(key))
        try smaller.flush()
        #expect(try smaller.value(forKey: keyBytes(key)) == value)
        #expect(smaller.statistics.evictions > 0, "the files held more than the budget: room came from evicting")
        #expect(smaller.statistics.bytesOnDisk <= 32 << 20)
        #expect(smaller.ledgerTotal == 32 << 20)
        for other in keys {
            let got = try smaller.value(forKey: keyBytes(other))
            #expect(got == nil || got == noiseBytes(100_000, seed: UInt64(other)))
        }
        try smaller.close()
        #expect(directoryBytes(directory.path) <= 32 << 20)
        let again = try DiskTier(configuration)
        #expect(try again.value(forKey: keyBytes(key)) == value)
        try again.close()
    }
}
