import Synchronization
import Testing

@testable import Magpie

@Suite("Remote records: the fence, tombstones, the hybrid clock")
struct RemoteRecordTests {
    @Test("a record round-trips with its version in the fence, and is refused under another key or with a byte changed")
    func roundTrip() throws {
        var record = RemoteRecord(value: Array("hello".utf8), expiresAt: 1_900_000_000_000, memoryPolicy: -5,
                                  freshness: Freshness(freshUntil: 7, loadedAt: 3, negative: false), tiers: .memoryOnly, group: "team")
        record.namespaceToken = 11
        record.groupToken = 12
        record.version = 0x0123_4567_89AB_CDEF
        let key = Array("kname".utf8)
        let bytes = record.encoded(key: key)
        #expect(Array(bytes.prefix(2)) == Array("MV".utf8))
        #expect(RemoteRecord.fenceVersion(bytes) == 0x0123_4567_89AB_CDEF)
        #expect(Array(bytes[2..<10]) == [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF])  // big endian: the script compares it
        #expect(RemoteRecord.decode(bytes, key: key) == .record(record))
        #expect(RemoteRecord.decode(bytes, key: Array("kother".utf8)) == nil)
        for index in bytes.indices {
            var damaged = bytes
            damaged[index] ^= 0x20
            #expect(RemoteRecord.decode(damaged, key: key) != .record(record), "byte \(index)")
        }
        #expect(RemoteRecord.decode(Array(bytes.dropLast()), key: key) == nil)
        #expect(RemoteRecord.decode([], key: key) == nil)
    }

    @Test("the remote record and the disk record carry an entry's metadata in the same bytes (one encoding)")
    func sharedMetadataEncoding() throws {
        let now: Int64 = 1_900_000_000_000
        let cases: [EntryMetadata] = [
            EntryMetadata(),
            EntryMetadata(memoryPolicy: -5_000),
            EntryMetadata(tiers: .diskOnly, freshness: Freshness(freshUntil: now + 7, loadedAt: now)),
            EntryMetadata(memoryPolicy: now + 60_000, freshness: Freshness(freshUntil: now, loadedAt: now - 1, negative: true)),
            EntryMetadata(memoryPolicy: Int64.min, tiers: .diskOnly, freshness: Freshness(negative: true)),
        ]
        let key = Array("kname".utf8)
        for metadata in cases {
            var remote = RemoteRecord(value: metadata.freshness.negative ? [] : Array("value".utf8), expiresAt: now, group: "g")
            remote.metadata = metadata
            let remoteBytes = remote.encoded(key: key)
            #expect(RemoteRecord.decode(remoteBytes, key: key) == .record(remote), "\(metadata)")
            let header = RecordHeader(
                kind: .value, codec: .raw, keyLength: key.count, groupLength: 1, storedLength: remote.value.count,
                originalLength: remote.value.count, expiry: now, sequence: 1, keyHash: 9, flags: metadata.flags)
            let diskBytes = key.withUnsafeBytes { k in
                Array("g".utf8).withUnsafeBytes { g in
                    remote.value.withUnsafeBytes { v in RecordHeader.makeRecord(header, key: k, group: g, payload: v, metadata: metadata) }
                }
            }
            let parsed = try #require(diskBytes.withUnsafeBytes { RecordHeader.validate($0) })
            #expect(diskBytes.withUnsafeBytes { RecordHeader.metadata(of: $0, parsed) } == metadata)
            // The flags byte, then the blocks after the group: byte for byte the same in both records.
            let length = EntryMetadata.blocksLength(metadata.flags)
            #expect(diskBytes[7] == remoteBytes[13])
            let remoteBlocks = Array(remoteBytes[(RemoteRecord.headerSize + 1)..<(RemoteRecord.headerSize + 1 + length)])
            let diskBlocks = Array(diskBytes[parsed.metadataOffset..<(parsed.metadataOffset + length)])
            #expect(remoteBlocks == diskBlocks, "\(metadata)")
        }
        // Each format refuses the flag it never writes: a stamp in a remote record, memory-only on disk.
        var stamped = RemoteRecord(value: [1])
        stamped.metadata.stamp = now
        #expect(RemoteRecord.decode(stamped.encoded(key: key), key: key) == .record(RemoteRecord(value: [1])))  // not written
        let memoryOnly = RecordHeader(
            kind: .value, codec: .raw, keyLength: 1, groupLength: 0, storedLength: 1, originalLength: 1, expiry: 0,
            sequence: 1, keyHash: 9, flags: .memoryOnly)
        let record = [UInt8]([7]).withUnsafeBytes { b in RecordHeader.makeRecord(memoryOnly, key: b, group: UnsafeRawBufferPointer(start: nil, count: 0), payload: b, metadata: EntryMetadata()) }
        #expect(record.withUnsafeBytes { RecordHeader.validate($0) } == nil)
    }

    @Test("a tombstone is the fence and MT; anything else of its length is foreign")
    func tombstones() {
        let tombstone = RemoteRecord.tombstone(version: 42)
        #expect(tombstone.count == 12)
        #expect(RemoteRecord.decode(tombstone, key: [0x6B]) == .tombstone(42))
        #expect(RemoteRecord.fenceVersion(tombstone) == 42)
        var other = tombstone
        other[11] = 0x58
        #expect(RemoteRecord.decode(other, key: [0x6B]) == nil)
        #expect(RemoteRecord.fenceVersion(Array("not versioned".utf8)) == nil)
    }

    @Test("the hybrid clock never moves backwards, follows the wall clock, and stays above what it observed")
    func hybridClock() {
        let wall = Atomic<Int64>(1_000)
        let clock = HybridClock(clock: CacheClock(now: { wall.load(ordering: .relaxed) }))
        let first = clock.next()
        #expect(first == 1_000 << 16)
        #expect(clock.next() == first + 1)  // same millisecond: the counter
        wall.store(900, ordering: .relaxed)  // the wall clock stepped back
        #expect(clock.next() == first + 2)
        wall.store(2_000, ordering: .relaxed)
        #expect(clock.next() == 2_000 << 16)
        clock.observe(5_000 << 16 + 7)  // another instance wrote ahead of this clock
        #expect(clock.next() == 5_000 << 16 + 8)
        clock.observe(1)  // an older version changes nothing
        #expect(clock.next() == 5_000 << 16 + 9)
    }

    @Test("with microseconds, a write made later in the same millisecond gets the higher version, whatever each instance gave before")
    func hybridClockMicroseconds() {
        let micro = Atomic<Int64>(7_000_100)  // 7,000 ms and 100 µs
        let clock = CacheClock(now: { micro.load(ordering: .relaxed) / 1000 }, microseconds: { micro.load(ordering: .relaxed) })
        let busy = HybridClock(clock: clock)  // an instance that gave many versions in this microsecond
        let quiet = HybridClock(clock: clock)
        let first = busy.next()
        #expect(first == UInt64(7_000 << 16 | 100 << 6))
        for _ in 0..<40 { _ = busy.next() }
        let busyLast = busy.next()
        #expect(busyLast == first + 41)
        micro.store(7_000_101, ordering: .relaxed)  // one microsecond later, same millisecond
        let later = quiet.next()
        #expect(later > busyLast)  // with milliseconds only, the quiet instance's 0 would be below the busy one's 41
        #expect(later >> 16 == 7_000)  // the top 48 bits stay milliseconds: the store's comparison is unchanged
        // More than 64 versions in one microsecond run on into the next slot, never backwards.
        var previous = later
        for _ in 0..<200 {
            let version = quiet.next()
            #expect(version == previous + 1)
            previous = version
        }
        micro.store(7_000_999, ordering: .relaxed)
        #expect(quiet.next() == UInt64(7_000 << 16 | 999 << 6))
        micro.store(7_001_000, ordering: .relaxed)
        #expect(quiet.next() == UInt64(7_001 << 16))
    }
}
