import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

@Suite("Cache: tiers and promotion")
struct CacheTierTests {
    @Test("subscript, value, data, contains, remove, removeAll: dictionary behaviour over both tiers")
    func dictionary() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        cache["a"] = Array("alpha".utf8)
        try cache.set(Data("beta".utf8), forKey: "b")
        try cache.set([1, 2, 3], forKey: [0xff, 0x00, 0x2f])  // a key that is not UTF-8
        #expect(cache["a"] == Array("alpha".utf8))
        #expect(try cache.data(forKey: "b") == Data("beta".utf8))
        #expect(try cache.value(forKey: [0xff, 0x00, 0x2f]) == [1, 2, 3])
        #expect(try cache.contains("a"))
        #expect(cache["missing"] == nil)
        cache["a"] = nil
        #expect(cache["a"] == nil)
        #expect(try !cache.contains("a"))
        #expect(try cache.disk!.value(forKey: "a") == nil)  // removed from disk too
        try cache.set([], forKey: "")  // empty key and value
        #expect(try cache.value(forKey: "") == [])
        try cache.removeAll()
        #expect(cache["b"] == nil)
        #expect(cache.statistics.memory.entries == 0 && cache.statistics.disk?.entries == 0)
    }

    @Test("a disk hit is promoted into memory without being written to disk again")
    func promotionWithoutRewrite() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        let value = Array(repeating: UInt8(7), count: 3000)
        try cache.set(value, forKey: "k")
        cache.memory.removeAll()  // as if evicted from memory
        let writesBefore = cache.statistics.disk!.writes
        let bytesBefore = directoryBytes(directory.path + "/buckets")
        #expect(try cache.value(forKey: "k") == value)  // disk hit
        #expect(cache.memory.contains("k"))  // now in memory
        #expect(try cache.value(forKey: "k") == value)  // memory hit
        let stats = cache.statistics
        #expect(stats.disk!.writes == writesBefore)
        #expect(directoryBytes(directory.path + "/buckets") == bytesBefore)
        #expect(stats.promotions == 1)
        #expect(stats.disk!.hits == 1)
        #expect(stats.memory.hits == 1)
    }

    @Test("tier-only entries: memory-only never touches disk and clears an older disk value; disk-only is never promoted")
    func tierOnlyEntries() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        try cache.set([1], forKey: "m")  // both tiers
        try cache.set([2], forKey: "m", options: EntryOptions(tiers: .memoryOnly))
        #expect(try cache.disk!.value(forKey: "m") == nil)
        #expect(try cache.value(forKey: "m") == [2])
        cache.memory.removeAll()
        #expect(try cache.value(forKey: "m") == nil)  // never the older [1]

        try cache.set([3], forKey: "d")
        try cache.set([4], forKey: "d", options: EntryOptions(tiers: .diskOnly))
        #expect(cache.memory.value(forKey: "d") == nil)
        #expect(try cache.value(forKey: "d") == [4])
        #expect(try cache.value(forKey: "d") == [4])
        #expect(cache.memory.value(forKey: "d") == nil)  // still not promoted
        #expect(cache.statistics.promotions == 0)
    }

    @Test("memory-only cache: no directory, every operation works, close then throws")
    func memoryOnly() throws {
        let cache = try makeCache(nil)
        cache["x"] = [1, 2]
        try cache.set([3], forKey: "g1", options: EntryOptions(group: "g"))
        try cache.set([4], forKey: "g2", options: EntryOptions(group: "g"))
        #expect(cache["x"] == [1, 2])
        #expect(try cache.removeAll(inGroup: "g") == RemovedEntries(memory: 2, disk: 0))
        #expect(cache["g1"] == nil)
        #expect(cache.statistics.disk == nil)
        try cache.flush()
        try cache.close()
        #expect(throws: MagpieError.self) { try cache.set([1], forKey: "x") }
        #expect(throws: MagpieError.self) { try cache.value(forKey: "x") }
    }

    @Test("a value too large for memory is kept on disk only; one larger than the disk tier's largest throws and changes nothing")
    func oversizedValues() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory, memoryBudget: 16 << 10, diskBudget: 1 << 20)
        let big = Array(repeating: UInt8(1), count: 20 << 10)  // > the 16 KiB memory budget
        try cache.set(big, forKey: "big")
        #expect(try cache.value(forKey: "big") == big)
        #expect(cache.memory.value(forKey: "big") == nil)
        try cache.set([9], forKey: "huge")
        var generator = SeededGenerator(seed: 5)
        // Larger than one bucket's share (about 116 KiB here): buckets lend each other room.
        let large = (0..<(300 << 10)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try cache.set(large, forKey: "large")
        #expect(try cache.value(forKey: "large") == large)
        let huge = (0..<(cache.disk!.largestStorableValue + 1)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        #expect(throws: MagpieError.self) { try cache.set(huge, forKey: "huge") }
        #expect(try cache.value(forKey: "huge") == [9])
    }

    @Test("a failed disk write throws and leaves both tiers as they were")
    func failedDiskWrite() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory, diskWriteBuffer: 0)  // every disk store meets its own failure
        try cache.set([1], forKey: "k")
        FileIOFaults.set(under: directory.path) { call, _ in call == "pwrite" ? EIO : nil }
        #expect(throws: MagpieError.self) { try cache.set([2], forKey: "k") }
        #expect(throws: MagpieError.self) { try cache.removeValue(forKey: "k") }
        FileIOFaults.set(under: directory.path, nil)
        #expect(try cache.value(forKey: "k") == [1])
        cache.memory.removeAll()
        #expect(try cache.value(forKey: "k") == [1])
        #expect(cache.statistics.diskErrors == 2)
    }

    @Test("close leaves a snapshot; reopen serves every value, newest wins")
    func persistence() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        do {
            let cache = try makeCache(directory)
            for i in 0..<200 { try cache.set(selfDescribingValue(key: i, version: 1, length: 100), forKey: "k\(i)") }
            for i in 0..<100 { try cache.set(selfDescribingValue(key: i, version: 2, length: 100), forKey: "k\(i)") }
            try cache.close()
            #expect(throws: MagpieError.self) { try cache.set([1], forKey: "k0") }
        }
        let cache = try makeCache(directory)
        #expect(cache.statistics.disk!.bucketsOpenedFromSnapshot == 8)
        for i in 0..<200 {
            #expect(try cache.value(forKey: "k\(i)") == selfDescribingValue(key: i, version: i < 100 ? 2 : 1, length: 100))
        }
    }
}

@Suite("Cache: expiry and groups")
struct CacheExpiryTests {
    @Test("memory and disk expire independently; a promoted copy gets its memory lifetime again, capped by disk")
    func perTierExpiry() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        let cache = try makeCache(directory, clock: clock)
        let options = EntryOptions(memoryExpiry: .after(.seconds(10)), diskExpiry: .after(.seconds(100)))
        try cache.set([1], forKey: "k", options: options)
        clock.advance(seconds: 9)
        #expect(cache.memory.value(forKey: "k") == [1])
        clock.advance(seconds: 2)  // t = 11: memory copy expired, disk copy live
        #expect(cache.memory.value(forKey: "k") == nil)
        #expect(try cache.value(forKey: "k") == [1])  // from disk, promoted until t = 21
        #expect(cache.statistics.promotions == 1)
        clock.advance(seconds: 9)  // t = 20
        #expect(cache.memory.value(forKey: "k") == [1])
        clock.advance(seconds: 2)  // t = 22
        #expect(cache.memory.value(forKey: "k") == nil)
        clock.advance(seconds: 74)  // t = 96: promoted again, but only until the disk deadline t = 100
        #expect(try cache.value(forKey: "k") == [1])
        clock.advance(seconds: 5)  // t = 101
        #expect(cache.memory.value(forKey: "k") == nil)
        #expect(try cache.value(forKey: "k") == nil)

        // Disk mirrors memory when no disk expiry is given; absolute instants are kept as instants.
        try cache.set([2], forKey: "m", options: .expiring(.after(.seconds(5))))
        try cache.set([3], forKey: "at", options: EntryOptions(memoryExpiry: .at(millisecondsSince1970: clock.now + 3000), diskExpiry: .never))
        clock.advance(seconds: 4)
        cache.memory.removeAll()
        #expect(try cache.value(forKey: "at") == [3])  // promoted until the instant
        #expect(try cache.value(forKey: "m") == [2])
        clock.advance(seconds: 2)
        #expect(try cache.value(forKey: "m") == nil)
        #expect(cache.memory.value(forKey: "at") == nil)
        #expect(try cache.value(forKey: "at") == [3])  // disk never expires; memory instant passed: not promoted
        #expect(cache.memory.value(forKey: "at") == nil)
    }

    @Test("memory expiry survives a restart: a promoted copy after reopen still expires in memory")
    func expiryAcrossReopen() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        do {
            let cache = try makeCache(directory, clock: clock)
            try cache.set([1], forKey: "k", options: EntryOptions(memoryExpiry: .after(.seconds(10)), diskExpiry: .after(.seconds(60))))
            try cache.close()
        }
        clock.advance(seconds: 30)
        let cache = try makeCache(directory, clock: clock)
        #expect(try cache.value(forKey: "k") == [1])
        clock.advance(seconds: 11)
        #expect(cache.memory.value(forKey: "k") == nil)
        #expect(try cache.value(forKey: "k") == [1])
        clock.advance(seconds: 20)
        #expect(try cache.value(forKey: "k") == nil)
        try cache.removeExpired()
        #expect(cache.statistics.disk!.entries == 0)
    }

    @Test("far-future and extreme expiries on both tiers: stored, promoted after reopen, never a trap")
    func extremeExpiries() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let options: [EntryOptions] = [
            EntryOptions(memoryExpiry: .after(.seconds(Int64.max)), diskExpiry: .at(millisecondsSince1970: .max)),
            EntryOptions(memoryExpiry: .at(millisecondsSince1970: .max), diskExpiry: .after(.seconds(Int64.max))),
            EntryOptions(memoryExpiry: .after(.seconds(Int64.max / 1000)), diskExpiry: nil),
            EntryOptions(memoryExpiry: .after(.nanoseconds(1)), diskExpiry: .at(millisecondsSince1970: .max - 1)),
        ]
        do {
            let cache = try makeCache(directory)
            for (i, option) in options.enumerated() { try cache.set([UInt8(i)], forKey: "far-\(i)", options: option) }
            for i in options.indices { #expect(try cache.value(forKey: "far-\(i)") == [UInt8(i)]) }
            try cache.close()
        }
        let cache = try makeCache(directory)
        for i in options.indices { #expect(try cache.value(forKey: "far-\(i)") == [UInt8(i)]) }  // promoted
        for i in options.indices.dropLast() { #expect(cache.memory.value(forKey: "far-\(i)") == [UInt8(i)]) }
        try cache.removeExpired()
        #expect(cache.statistics.disk!.entries == options.count)
    }

    @Test("a group is removed from both tiers, durably: nothing comes back after reopen")
    func groups() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        do {
            let cache = try makeCache(directory)
            for i in 0..<20 {
                try cache.set([UInt8(i)], forKey: "u\(i)", options: EntryOptions(group: i % 2 == 0 ? "alice" : "bob"))
            }
            try cache.set([99], forKey: "disk-only", options: EntryOptions(group: "alice", tiers: .diskOnly))
            _ = try cache.value(forKey: "u0")
            let removed = try cache.removeAll(inGroup: "alice")
            #expect(removed == RemovedEntries(memory: 10, disk: 11))
            for i in 0..<20 { #expect(try cache.value(forKey: "u\(i)") == (i % 2 == 0 ? nil : [UInt8(i)])) }
            #expect(try cache.value(forKey: "disk-only") == nil)
            // A promoted copy keeps its group.
            cache.memory.removeAll()
            _ = try cache.value(forKey: "u1")
            #expect(cache.memory.removeAll(inGroup: "bob") == 1)
        }  // no close: as after a crash, recovery replays the group tombstone
        let cache = try makeCache(directory)
        for i in 0..<20 { #expect(try cache.value(forKey: "u\(i)") == (i % 2 == 0 ? nil : [UInt8(i)])) }
    }
}

@Suite("Cache: Codable")
struct CacheCodableTests {
    struct Profile: Codable, Sendable, Equatable {
        var name: String
        var age: Int
    }

    @Test("typed values round-trip through both tiers; a type mismatch is a clear error")
    func typed() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        let profiles = cache.typed(Profile.self)
        try profiles.set(Profile(name: "Ada", age: 36), forKey: "p")
        profiles["q"] = Profile(name: "Grace", age: 45)
        cache.memory.removeAll()
        #expect(try profiles.value(forKey: "p") == Profile(name: "Ada", age: 36))
        #expect(profiles["q"] == Profile(name: "Grace", age: 45))
        #expect(try cache.value(forKey: "p", as: Profile.self)?.age == 36)
        let error = #expect(throws: MagpieError.self) { try cache.value(forKey: "p", as: [Int].self) }
        #expect(error?.code == .decodingFailed)
        #expect(error?.message.contains("Array<Int>") == true)
        cache["raw"] = Array("not json".utf8)
        #expect(profiles["raw"] == nil)
        profiles["p"] = nil
        #expect(try profiles.value(forKey: "p") == nil)
    }
}
