import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import Magpie

// `cache.async.set` on the caller's task when its disk half is a memtable append that cannot wait
// (Configuration.inlineDiskStores, DiskTier.storeIfImmediate, BucketState.storeIfImmediate).

private let value = [UInt8](repeating: 0x61, count: 3000)
private let other = [UInt8](repeating: 0x62, count: 2000)

/// Whether `condition` holds within `timeout`, checked every 5 ms.
private func eventually(timeout: Duration, _ condition: () -> Bool) async -> Bool {
    let start = ContinuousClock.now
    while ContinuousClock.now - start < timeout {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return condition()
}

/// ``makeCache`` without the once-a-second directory check on writes (a store due to check hops, and a
/// loaded machine can put a second between two stores of a test).
private func inlineCache(_ directory: TemporaryDirectory, diskBudget: Int = 4 << 20, buckets: Int = 8, diskWriteBuffer: Int = 64 << 10)
    throws -> Cache
{
    var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 1 << 20, diskBudget: diskBudget)
    configuration.disk?.bucketCount = buckets
    configuration.disk?.writeBufferSize = diskWriteBuffer
    configuration.disk?.directoryCheckInterval = nil
    configuration.disk?.loadsInBackground = false
    configuration.hashSeed = 42
    configuration.metrics = nil
    return try Cache(configuration)
}

/// The inline store counter itself (not `statistics`, which takes every bucket's lock).
private func inlineStores(_ cache: Cache) -> UInt64 { cache.runtime.value(of: .inlineDiskStores) }

@Suite("Cache: async stores on the caller's task")
struct CacheInlineStoreTests {
    @Test("a new key and an overwrite of one still in a memtable are stored on the task: in both tiers at once, counted, and in the file after a flush and a reopen")
    func newAndPendingKeysInline() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        do {
            let cache = try inlineCache(directory)
            _ = cache.statistics  // every bucket loaded
            let threads = Locked<[String]>([])
            FileIOFaults.set(under: directory.path) { call, _ in
                threads.withLock { $0.append("\(call)@\(IOThreadPool.currentThreadName ?? "caller")") }
                return nil
            }
            let base = inlineStores(cache)
            try await cache.async.set(value, forKey: "k")
            #expect(inlineStores(cache) == base + 1)
            #expect(try cache.lookup("k")?.tier == .memory)
            #expect(try cache.lookup("k")?.value == value)
            let disk = try #require(cache.disk)
            #expect(try disk.value(forKey: "k") == value)  // served from its memtable
            try await cache.async.set(other, forKey: "k")
            #expect(inlineStores(cache) == base + 2)
            #expect(try await cache.async.value(forKey: "k") == other)
            #expect(try disk.value(forKey: "k") == other)
            // Disk-only: the disk holds it, memory drops its copy.
            try await cache.async.set(value, forKey: "d", options: EntryOptions(tiers: .diskOnly))
            #expect(inlineStores(cache) == base + 3)
            #expect(try disk.value(forKey: "d") == value)
        #expect(cache.memory.value(forKey: "d") == nil)
            FileIOFaults.set(under: directory.path, nil)
            // No file call was made by the caller's task (a memtable append only).
            #expect(threads.withLock { $0 }.allSatisfy { !$0.hasSuffix("@caller") }, "\(threads.withLock { $0 })")
            try cache.close()
        }
        let reopened = try makeCache(directory)
        #expect(try reopened.value(forKey: "k") == other)
        #expect(try reopened.value(forKey: "d") == value)
        try reopened.close()
    }

    @Test("an overwrite of a value in the file hops (its tombstone is written on an I/O thread), and a crash image never brings the old value back")
    func fileRecordHops() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try inlineCache(directory, buckets: 1)
        try cache.set(value, forKey: "k")
        try cache.flush()  // its record is in the file
        let before = inlineStores(cache)
        try await cache.async.set(other, forKey: "k")
        #expect(inlineStores(cache) == before, "an overwrite of a record in the file ran on the task")
        #expect(try await cache.async.value(forKey: "k") == other)
        // The new value is still in its memtable: a crash loses it, and the tombstone keeps the old one out.
        let image = TemporaryDirectory()
        defer { image.cleanup() }
        try DiskMemtableTests.crashImage(of: directory.path, to: image.path, holding: cache.disk)
        try cache.close()
        let recovered = try makeCache(image, buckets: 1)
        let read = try recovered.value(forKey: "k")
        #expect(read == nil || read == other, "the replaced value came back after the crash")
        try recovered.close()
    }

    @Test("a held stripe or bucket lock, a cancelled task, a memory-only store, an expiry already past, a value longer than a memtable, no write buffer, and the option off: each hops, and the store is done")
    func hops() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try inlineCache(directory)
        _ = cache.statistics
        let disk = try #require(cache.disk)
        try await cache.async.set(value, forKey: "first")
        let base = inlineStores(cache)
        #expect(base >= 1, "no store ran inline: the refusals below would prove nothing")

        // The bucket's lock, held by another thread until the store has had time to try.
        let bucket = DiskTier.bucket(of: disk.hasher.hash("b"), count: disk.bucketCount)
        let release = holdOnAnotherThread { wait in disk.buckets[bucket].withLock { _ in wait() } }
        let store = Task { try await cache.async.set(value, forKey: "b") }
        try await Task.sleep(for: .milliseconds(100))
        #expect(inlineStores(cache) == base)
        release()
        try await store.value
        #expect(inlineStores(cache) == base)
        #expect(try cache.value(forKey: "b") == value)

        // The key's stripe, likewise.
        let hash = disk.hasher.hash("s")
        let stripeRelease = holdOnAnotherThread { wait in cache.composition.local.stripes.withLock(for: hash) { wait() } }
        let striped = Task { try await cache.async.set(value, forKey: "s") }
        try await Task.sleep(for: .milliseconds(100))
        stripeRelease()
        try await striped.value
        #expect(inlineStores(cache) == base)
        #expect(try cache.value(forKey: "s") == value)

        // A load of the key landing now (its flight's lock held across the landing's store): the store hops
        // and waits for it, and the load, superseded, does not land over it.
        let gate = Gate()
        let load = Task { try await cache.value(forKey: "f") { await gate.wait(); return other } }
        let flightHash = disk.hasher.hash("f")
        var flight: Flight? = nil
        for _ in 0..<2000 where flight == nil {
            flight = cache.loads.flights.withLock { $0[flightHash] }
            if flight == nil { try await Task.sleep(for: .milliseconds(1)) }
        }
        let running = try #require(flight)
        let landing = holdOnAnotherThread { wait in running.superseded.withLock { _ in wait() } }
        let superseding = Task { try await cache.async.set(value, forKey: "f") }
        try await Task.sleep(for: .milliseconds(100))
        #expect(inlineStores(cache) == base)
        landing()
        try await superseding.value
        gate.open()
        _ = try await load.value
        #expect(inlineStores(cache) == base)
        #expect(try cache.value(forKey: "f") == value)

        // A cancelled task: the store throws, as the hop does, and stores nothing.
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await cache.async.set(value, forKey: "c")
        }
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(try cache.value(forKey: "c") == nil)

        // Memory-only (removes the disk's record), expired on arrival (a removal), longer than a memtable.
        try await cache.async.set(value, forKey: "m", options: EntryOptions(tiers: .memoryOnly))
        try await cache.async.set(value, forKey: "e", options: .expiring(.at(millisecondsSince1970: 1)))
        let long = [UInt8](repeating: 0x63, count: 100 << 10)
        try await cache.async.set(long, forKey: "l")
        #expect(inlineStores(cache) == base)
        #expect(try cache.value(forKey: "m") == value)
        #expect(try cache.value(forKey: "e") == nil)
        #expect(try cache.value(forKey: "l") == long)
        try cache.close()

        // No write buffer (every store written before it returns), and the option off.
        let unbuffered = TemporaryDirectory()
        defer { unbuffered.cleanup() }
        let writeThrough = try inlineCache(unbuffered, diskWriteBuffer: 0)
        try await writeThrough.async.set(value, forKey: "w")
        #expect(inlineStores(writeThrough) == 0)
        #expect(try writeThrough.value(forKey: "w") == value)
        try writeThrough.close()
        let offDirectory = TemporaryDirectory()
        defer { offDirectory.cleanup() }
        var configuration = Cache.Configuration(directory: offDirectory.path, memoryBudget: 1 << 20, diskBudget: 4 << 20)
        configuration.metrics = nil
        configuration.inlineDiskStores = false
        configuration.disk?.directoryCheckInterval = nil
        let off = try Cache(configuration)
        try await off.async.set(value, forKey: "o")
        #expect(inlineStores(off) == 0)
        #expect(try off.value(forKey: "o") == value)
        try off.close()
    }

    @Test("stores from 64 tasks filling memtables: memtables detached on the task reach the sealer, every value reads back, most stores ran inline")
    func manyTasks() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try inlineCache(directory, diskBudget: 64 << 20, buckets: 4)
        _ = cache.statistics
        let count = 4000
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<64 {
                group.addTask {
                    for i in stride(from: task, to: count, by: 64) {
                        try? await cache.async.set(selfDescribingValue(key: i, version: 1, length: 1500), forKey: "t\(i)")
                    }
                }
            }
        }
        // Memtables the tasks detached were handed to the sealer: it writes them all, leaving at most each
        // bucket's active one (without a hand-over, the last one detached would wait for a flush).
        let drained = await eventually(timeout: .seconds(10)) { (cache.statistics.disk?.bufferedBytes ?? .max) <= 4 * (64 << 10) }
        #expect(drained, "\(cache.statistics.disk?.bufferedBytes ?? -1) bytes still buffered")
        for i in 0..<count { #expect(try cache.disk?.value(forKey: "t\(i)") == selfDescribingValue(key: i, version: 1, length: 1500)) }
        let statistics = cache.statistics
        #expect(statistics.inlineDiskStores > UInt64(count / 2), "\(statistics.inlineDiskStores) of \(count) inline")
        try cache.close()
    }
}
