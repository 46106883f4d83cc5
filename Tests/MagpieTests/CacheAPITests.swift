import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

// The façade's rough edges a new user met (issue: "What a new user trips over"): the key-length limit on
// every keyed call of a memory-only cache, the synchronous API inside async functions, byte keys for every
// keyed call, the empty group, calls after close, and failed subscript stores.

private func memoryOnly() throws -> Cache {
    var configuration = Cache.Configuration(memoryBudget: 1 << 20)
    configuration.metrics = nil
    return try Cache(configuration)
}

/// Records an issue unless `call` throws an error with `code`.
private func expectThrows(_ code: MagpieError.Code, _ what: String, _ call: () throws(MagpieError) -> Void) {
    do {
        try call()
        Issue.record("\(what): did not throw")
    } catch {
        #expect(error.code == code, "\(what): \(error)")
    }
}

@Suite("Cache: API edges")
struct CacheAPITests {
    private static let tooLong = [UInt8](repeating: 0x61, count: 65_536)

    @Test("every keyed call of a memory-only cache throws keyTooLong for a 65,536-byte key, as a two-tier one does")
    func keyTooLongEverywhere() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        for cache in [try memoryOnly(), try makeCache(directory)] {
            let key = Self.tooLong
            let text = String(decoding: key, as: UTF8.self)
            func expectTooLong(_ name: String, _ call: () throws(MagpieError) -> Void) {
                expectThrows(.keyTooLong, "\(name), disk tier: \(cache.disk != nil)", call)
            }
            expectTooLong("value(String)") { () throws(MagpieError) in _ = try cache.value(forKey: text) }
            expectTooLong("value(bytes)") { () throws(MagpieError) in _ = try cache.value(forKey: key) }
            expectTooLong("lookup(String)") { () throws(MagpieError) in _ = try cache.lookup(text) }
            expectTooLong("lookup(bytes)") { () throws(MagpieError) in _ = try cache.lookup(key) }
            expectTooLong("data(String)") { () throws(MagpieError) in _ = try cache.data(forKey: text) }
            expectTooLong("data(bytes)") { () throws(MagpieError) in _ = try cache.data(forKey: key) }
            expectTooLong("contains(String)") { () throws(MagpieError) in _ = try cache.contains(text) }
            expectTooLong("contains(bytes)") { () throws(MagpieError) in _ = try cache.contains(key) }
            expectTooLong("removeValue(String)") { () throws(MagpieError) in _ = try cache.removeValue(forKey: text) }
            expectTooLong("removeValue(bytes)") { () throws(MagpieError) in _ = try cache.removeValue(forKey: key) }
            expectTooLong("set(String)") { () throws(MagpieError) in try cache.set([1], forKey: text) }
            expectTooLong("set(bytes)") { () throws(MagpieError) in try cache.set([1], forKey: key) }
            try cache.close()
        }
    }

    @Test("the README's synchronous calls compile and run inside an async function; the async view awaits")
    func syncInsideAsync() async throws {
        struct Profile: Codable, Sendable, Equatable { var name: String }
        let cache = try memoryOnly()
        // Exactly the README's synchronous calls, in an async context, without `await`.
        try cache.set(Array("hello".utf8), forKey: "greeting")
        let greeting = try cache.value(forKey: "greeting")
        #expect(greeting == Array("hello".utf8))
        let profiles = cache.typed(Profile.self)
        try profiles.set(Profile(name: "Ada"), forKey: "profile:1")
        #expect(try profiles.value(forKey: "profile:1") == Profile(name: "Ada"))
        #expect(try cache.contains("greeting"))
        #expect(try cache.removeValue(forKey: "greeting"))
        // The async forms, through `async`.
        try await cache.async.set(Array("later".utf8), forKey: "greeting")
        #expect(try await cache.async.value(forKey: "greeting") == Array("later".utf8))
        #expect(try await cache.async.data(forKey: "greeting") == Data("later".utf8))
        #expect(try await cache.async.contains("greeting"))
        try await profiles.async.set(Profile(name: "Grace"), forKey: "profile:2")
        #expect(try await profiles.async.value(forKey: "profile:2") == Profile(name: "Grace"))
        #expect(try await cache.async.removeValue(forKey: "greeting"))
        try cache.close()
    }

    @Test("contains, data, lookup, the subscripts and TypedCache take byte keys too, sync and async")
    func byteKeys() async throws {
        struct Point: Codable, Sendable, Equatable { var x: Int }
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        let key: [UInt8] = [0xff, 0x00, 0x2f]  // not UTF-8
        try cache.set([1, 2, 3], forKey: key)
        #expect(try cache.contains(key))
        #expect(try cache.data(forKey: key) == Data([1, 2, 3]))
        #expect(try cache.lookup(key)?.value == [1, 2, 3])
        #expect(cache[key] == [1, 2, 3])
        cache[Data([9, 9])] = [4]
        #expect(try cache.value(forKey: Data([9, 9])) == [4])
        #expect(try await cache.async.contains(key))
        #expect(try await cache.async.data(forKey: key) == Data([1, 2, 3]))
        #expect(try await cache.async.value(forKey: key) == [1, 2, 3])
        try await cache.async.set([5], forKey: key)
        #expect(try await cache.async.removeValue(forKey: key))
        let points = cache.typed(Point.self)
        try points.set(Point(x: 7), forKey: key)
        #expect(try points.value(forKey: key) == Point(x: 7))
        #expect(points[key] == Point(x: 7))
        #expect(try cache.value(forKey: key, as: Point.self) == Point(x: 7))
        try await points.async.set(Point(x: 8), forKey: key)
        #expect(try await points.async.value(forKey: key) == Point(x: 8))
        #expect(try points.removeValue(forKey: key))
        #expect(try await points.async.value(forKey: key) == nil)
        try cache.close()
    }

    @Test("removeAll(inGroup: \"\") removes nothing and does not throw: no entry can be in the empty group")
    func emptyGroup() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        for cache in [try memoryOnly(), try makeCache(directory)] {
            try cache.set([1], forKey: "a", options: EntryOptions(group: ""))
            try cache.set([2], forKey: "b")
            #expect(try cache.removeAll(inGroup: "") == RemovedEntries())
            #expect(try cache.value(forKey: "a") == [1])
            #expect(try cache.value(forKey: "b") == [2])
            try cache.close()
        }
        let disk = try DiskTier(.init(directory: directory.child("tier"), budget: 1 << 20, bucketCount: 2))
        #expect(try disk.removeAll(inGroup: "") == 0)
        try disk.close()
    }

    @Test("after close, every call of a memory-only or two-tier cache throws closed; the subscript reads nil")
    func afterClose() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        for cache in [try memoryOnly(), try makeCache(directory)] {
            try cache.set([1], forKey: "a")
            try cache.close()
            func expectClosed(_ name: String, _ call: () throws(MagpieError) -> Void) {
                expectThrows(.closed, "\(name) after close, disk tier: \(cache.disk != nil)", call)
            }
            expectClosed("value") { () throws(MagpieError) in _ = try cache.value(forKey: "a") }
            expectClosed("value(bytes)") { () throws(MagpieError) in _ = try cache.value(forKey: [0x61]) }
            expectClosed("lookup") { () throws(MagpieError) in _ = try cache.lookup("a") }
            expectClosed("data") { () throws(MagpieError) in _ = try cache.data(forKey: "a") }
            expectClosed("contains") { () throws(MagpieError) in _ = try cache.contains("a") }
            expectClosed("set") { () throws(MagpieError) in try cache.set([2], forKey: "a") }
            expectClosed("removeValue") { () throws(MagpieError) in _ = try cache.removeValue(forKey: "a") }
            expectClosed("removeAll") { () throws(MagpieError) in try cache.removeAll() }
            expectClosed("removeAll(inGroup:)") { () throws(MagpieError) in _ = try cache.removeAll(inGroup: "g") }
            expectClosed("removeExpired") { () throws(MagpieError) in _ = try cache.removeExpired() }
            expectClosed("flush") { () throws(MagpieError) in try cache.flush() }
            #expect(cache["a"] == nil)
            let error = await #expect(throws: MagpieError.self) { try await cache.async.value(forKey: "a") }
            #expect(error?.code == .closed)
            #expect(cache.statistics.subscriptFailures == 1)  // the subscript's read
        }
    }

    @Test("a subscript store that fails is counted (and logged), not silent; so is a typed one")
    func subscriptFailuresCounted() throws {
        let cache = try memoryOnly()
        cache[String(decoding: Self.tooLong, as: UTF8.self)] = [1]
        #expect(cache.statistics.subscriptFailures == 1)
        cache[Self.tooLong] = nil
        #expect(cache.statistics.subscriptFailures == 2)
        let numbers = cache.typed(Int.self)
        numbers[Self.tooLong] = 3
        #expect(cache.statistics.subscriptFailures == 3)
        cache["fine"] = [1]
        #expect(cache.statistics.subscriptFailures == 3)
        try cache.close()
    }

    @Test("the settings both tiers share exist once: a tier left at its default takes the cache's, another value is refused")
    func sharedSettingsExistOnce() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = CacheClock(now: { 1_000_000 })
        var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 1 << 20, diskBudget: 16 << 20)
        configuration.metrics = nil
        configuration.clock = clock
        configuration.hashSeed = 7
        configuration.logInterval = .seconds(60)
        let cache = try Cache(configuration)
        #expect(cache.configuration.memory.clock == clock && cache.configuration.disk?.clock == clock)
        #expect(cache.configuration.memory.hashSeed == 7 && cache.configuration.disk?.hashSeed == 7)
        #expect(cache.configuration.disk?.logInterval == .seconds(60))
        try cache.close()
        let conflicting: [(String, (inout Cache.Configuration) -> Void)] = [
            ("memory clock", { $0.memory.clock = CacheClock(now: { 2 }) }),
            ("disk clock", { $0.disk?.clock = CacheClock(now: { 2 }) }),
            ("memory seed", { $0.memory.hashSeed = 8 }),
            ("disk seed", { $0.disk?.hashSeed = 8 }),
            ("disk log interval", { $0.disk?.logInterval = .seconds(1) }),
        ]
        for (what, change) in conflicting {
            var refused = configuration
            change(&refused)
            do {
                let opened = try Cache(refused)
                try opened.close()
                Issue.record("\(what): opened")
            } catch {
                #expect(error.code == .invalidConfiguration, "\(what): \(error)")
            }
        }
        var same = configuration
        same.memory.clock = clock  // the cache's own value: no conflict
        same.disk?.hashSeed = 7
        try Cache(same).close()
    }
}
