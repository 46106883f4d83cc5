import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// "One hash of the key per operation, computed once and passed down": counted, in this (debug) build,
/// by `KeyHashCounter`, which counts every key hash on the calling thread. Each operation below must
/// hash its key exactly once, whichever tiers it reaches (a memory hit, a disk hit with promotion, a
/// store into both tiers, a removal from both, a miss in both).
@Suite("Key hashes per Cache operation")
struct KeyHashCountTests {
    /// Key hashes `body` computes on this thread.
    func hashes(_ body: () throws -> Void) rethrows -> Int {
        let before = KeyHashCounter.count
        try body()
        return KeyHashCounter.count - before
    }

    func open(_ directory: TemporaryDirectory) throws -> Cache {
        var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 8 << 20, diskBudget: 8 << 20)
        configuration.memory.shardCount = 4
        configuration.disk?.bucketCount = 4
        configuration.hashSeed = 5
        configuration.metrics = nil
        configuration.diskBufferWriteInterval = nil
        return try Cache(configuration)
    }

    @Test("every synchronous keyed operation hashes its key exactly once, in either tier")
    func synchronous() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var cache = try open(directory)
        let value = noiseBytes(4096, seed: 1)
        let keys = (0..<8).map { "key-\($0)" }
        for key in keys { try cache.set(value, forKey: key) }  // the indexes have their size
        let disk = EntryOptions(tiers: .diskOnly)
        let memory = EntryOptions(tiers: .memoryOnly)

        #expect(try hashes { try cache.set(value, forKey: "key-0") } == 1, "overwrite, both tiers")
        #expect(try hashes { try cache.set(value, forKey: "new") } == 1, "insert, both tiers")
        #expect(try hashes { try cache.set(value, forKey: Array("key-1".utf8)) } == 1, "byte key")
        #expect(try hashes { try cache.set(value, forKey: "key-2", options: disk) } == 1, "disk only")
        #expect(try hashes { try cache.set(value, forKey: "key-3", options: memory) } == 1, "memory only")
        #expect(try hashes { _ = try cache.value(forKey: "key-0") } == 1, "memory hit")
        #expect(try hashes { _ = try cache.value(forKey: "key-2") } == 1, "disk-only hit")
        #expect(try hashes { _ = try cache.value(forKey: "absent") } == 1, "miss in both tiers")
        #expect(try hashes { _ = try cache.lookup("key-0") } == 1, "lookup")
        #expect(try hashes { _ = try cache.data(forKey: "key-2") } == 1, "data")
        #expect(try hashes { _ = try cache.contains("key-2") } == 1, "contains")
        #expect(hashes { cache["key-4"] = value } == 1, "subscript set")
        #expect(hashes { _ = cache["key-4"] } == 1, "subscript get")
        #expect(try hashes { try cache.removeValue(forKey: "key-5") } == 1, "removal from both tiers")

        // A disk hit that promotes: reopened, memory is empty.
        try cache.close()
        cache = try open(directory)
        var read: [UInt8]? = nil
        #expect(try hashes { read = try cache.value(forKey: "key-6") } == 1, "disk hit with promotion")
        #expect(read == value)
        #expect(cache.statistics.promotions == 1)
        var hit: CacheHit? = nil
        #expect(try hashes { hit = try cache.lookup("key-6") } == 1, "then a memory hit")
        #expect(hit?.tier == .memory)
        try cache.close()
    }

    @Test("an async disk read and a loader hash their key before it leaves the caller: the I/O threads hash nothing")
    func asynchronous() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try open(directory)
        let value = noiseBytes(512, seed: 2)
        try cache.set(value, forKey: "disk", options: EntryOptions(tiers: .diskOnly))
        var mostOnAnIOThread = 0
        for round in 0..<20 {
            #expect(try await cache.async.value(forKey: "disk") == value)
            #expect(try await cache.async.contains("disk"))
            // A loader's miss: its reads and its store (on an I/O thread) take the hash of the call.
            #expect(try await cache.value(forKey: "loaded-\(round)") { value } == value)
            let count = try await cache.composition.local.offload { () throws(MagpieError) in KeyHashCounter.count }
            mostOnAnIOThread = max(mostOnAnIOThread, count)
        }
        #expect(mostOnAnIOThread == 0, "an I/O thread hashed a key")
        try cache.close()
    }
}
