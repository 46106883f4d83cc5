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
}
