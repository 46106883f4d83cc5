import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

@Suite("DiskTier: read hints (a read's first misses prefetched before the bucket's lock)")
struct DiskReadHintTests {
    static func slotsAddress(_ index: borrowing BucketIndex) -> (UInt, Int) {
        index.slots.withUnsafeBufferPointer { (UInt(bitPattern: $0.baseAddress), $0.count) }
    }

    @Test("reads keep each bucket's index hint on the index's storage as it grows and is rebuilt")
    func hintFollowsTheIndex() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(DiskTier.Configuration(directory: directory.path, budget: 32 << 20, bucketCount: 2, hashSeed: 3))
        var grew = 0
        var last: (UInt, Int) = (0, 0)
        for key in 0..<3000 {
            try tier.set([UInt8](repeating: UInt8(key & 0xff), count: 100), forKey: keyBytes(key))
            #expect(try tier.value(forKey: keyBytes(key)) == [UInt8](repeating: UInt8(key & 0xff), count: 100))
            for bucket in 0..<tier.bucketCount {
                let current = tier.buckets[bucket].withLock { Self.slotsAddress($0.index) }
                let hint = tier.readHints.indexHint(bucket: bucket)
                // Only the bucket just read is refreshed; the other may lag (a store grew it since).
                if bucket == DiskTier.bucket(of: tier.hasher.hash(keyBytes(key)), count: tier.bucketCount) {
                    #expect(hint.slots == current.0 && hint.capacity == current.1)
                }
                if bucket == 0, current.1 != last.1 {
                    grew += 1
                    last = current
                }
            }
        }
        #expect(grew >= 3)  // the index grew (moved) several times under the reads
        try tier.removeAll()  // rebuilds the indexes
        _ = try tier.value(forKey: keyBytes(1))
        _ = try tier.value(forKey: keyBytes(2))
        for bucket in 0..<tier.bucketCount {
            let current = tier.buckets[bucket].withLock { Self.slotsAddress($0.index) }
            let hint = tier.readHints.indexHint(bucket: bucket)
            #expect(hint.capacity == current.1)
        }
        try tier.close()
    }

    @Test("a stale hint costs nothing: prefetching an index whose storage was freed and unmapped neither faults nor reads")
    func staleHintsAreHarmless() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(DiskTier.Configuration(directory: directory.path, budget: 8 << 20, bucketCount: 4, hashSeed: 3))
        // An index of 16 MiB (malloc maps it apart, and unmaps it when freed), noted, then dropped.
        do {
            let large = BucketIndex(capacity: 1 << 20)
            tier.readHints.noteIndex(bucket: 1, large)
        }
        #expect(tier.readHints.indexHint(bucket: 1).capacity == 1 << 20)
        for tag in stride(from: UInt32(0), to: UInt32.max - (1 << 24), by: 1 << 24) {
            tier.readHints.prefetch(bucket: 1, tag: tag)
        }
        // Out of range: nothing.
        tier.readHints.prefetch(bucket: -1, tag: 7)
        tier.readHints.prefetch(bucket: tier.bucketCount, tag: 7)
        // The tier still reads right, and the next read of that bucket puts the hint back on its index.
        for key in 0..<200 { try tier.set(Array("value \(key)".utf8), forKey: keyBytes(key)) }
        for key in 0..<200 { #expect(try tier.value(forKey: keyBytes(key)) == Array("value \(key)".utf8)) }
        let current = tier.buckets[1].withLock { Self.slotsAddress($0.index) }
        #expect(tier.readHints.indexHint(bucket: 1).slots == current.0)
        try tier.close()
    }
}
