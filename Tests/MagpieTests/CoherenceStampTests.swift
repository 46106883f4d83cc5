import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

// The coherence stamp of a cache with a remote tier lives beside the value in both local tiers (a
// memory entry's extras, a disk record's flagged field), never in the value's bytes.

private func withKey<R>(_ name: String, _ hasher: KeyHash, _ body: (HashedKey) throws -> R) rethrows -> R {
    let bytes = Array(name.utf8)
    return try bytes.withUnsafeBytes { try body(HashedKey($0, hasher: hasher)) }
}

@Suite("Coherence stamps: kept beside the value in memory and on disk, never in it")
struct CoherenceStampTests {
    @Test("memory: every combination of deadline, group, freshness and stamp reads back exactly")
    func memoryExtras() throws {
        let memory = try MemoryTier(MemoryTier.Configuration(budget: 8 << 20), hasher: KeyHash(seed: 7))
        let now = CacheClock.system.now()
        var number = 0
        for deadline in [Int64(0), now + 60_000] {
            for group in [nil, "team"] {
                for freshness in [Freshness.none, Freshness(freshUntil: now + 5_000, loadedAt: now - 10)] {
                    for stamp in [Int64(0), now - 3] {
                        number += 1
                        let value = (0..<(number * 7)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ number) }
                        try withKey("key \(number)", memory.hasher) { key in
                            let stored = value.withUnsafeBytes {
                                memory.set($0, for: key, deadline: deadline, group: group, freshness: freshness, stamp: stamp)
                            }
                            #expect(try stored.get())
                            let entry = try #require(memory.entry(key))
                            #expect(entry.value == value)
                            #expect(entry.deadline == deadline)
                            #expect(entry.freshness == freshness)
                            #expect(entry.stamp == stamp)
                            #expect(memory.copyValue(key) == value)
                            let read = memory.withStampedValue(key) { stamp, bytes in (stamp, [UInt8](bytes)) }
                            #expect(read?.0 == stamp && read?.1 == value)
                        }
                    }
                }
            }
        }
        // Group removal still finds the grouped entries past the stamp (the group hash's offset).
        #expect(memory.removeAll(inGroup: "team") == 8)
    }

    @Test("disk: a stamped record reads back with its stamp and exactly its value, before and after a reopen (snapshot and scan)")
    func diskRecord() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 64 << 20)
        configuration.bucketCount = 4
        let now = CacheClock.system.now()
        let values = (0..<200).map { index in (0..<(index * 13 % 700)).map { UInt8(truncatingIfNeeded: $0 &+ index) } }
        func check(_ tier: DiskTier) throws {
            for (index, value) in values.enumerated() {
                try withKey("key \(index)", tier.hasher) { key in
                    let entry = try #require(try tier.entry(key))
                    #expect(entry.value == value, "key \(index)")
                    #expect(entry.placement.stamp == (index % 2 == 0 ? now - Int64(index) : 0))
                    #expect(entry.placement.freshness.freshUntil == (index % 3 == 0 ? now + 1_000 : 0))
                    #expect(entry.group == (index % 5 == 0 ? "g" : nil))
                }
            }
        }
        do {
            let tier = try DiskTier(configuration)
            for (index, value) in values.enumerated() {
                let placement = EntryMetadata(
                    memoryPolicy: index % 4 == 0 ? -5_000 : 0,
                    freshness: index % 3 == 0 ? Freshness(freshUntil: now + 1_000, loadedAt: now) : .none,
                    stamp: index % 2 == 0 ? now - Int64(index) : 0)
                try withKey("key \(index)", tier.hasher) { key in
                    try value.withUnsafeBytes {
                        try tier.store($0, for: key, expiry: .never, group: index % 5 == 0 ? "g" : nil, placement: placement)
                    }
                }
            }
            try check(tier)
            try tier.close()  // leaves a snapshot
        }
        do {
            let tier = try DiskTier(configuration)
            try check(tier)
            #expect(tier.statistics.corruptRecords == 0)
            try tier.close()
        }
        // Without the snapshots the reopen scans every record (and validates its flags).
        let snapshots = try FileManager.default.contentsOfDirectory(atPath: directory.path + "/buckets").filter { $0.hasSuffix(".index") }
        #expect(snapshots.count == 4)
        for name in snapshots { try FileManager.default.removeItem(atPath: directory.path + "/buckets/" + name) }
        let tier = try DiskTier(configuration)
        try check(tier)
        #expect(tier.statistics.corruptRecords == 0)
        try tier.close()
    }
}
