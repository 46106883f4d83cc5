import Foundation
import MetricsTestKit
import Synchronization
import MagpieTestSupport
import Testing

@testable import Magpie

private struct LoadFailed: Error, Equatable {}

/// An atomic counter or flag that closures can share (an `Atomic` local cannot be captured).
private final class Shared: Sendable {
    private let storage = Atomic<Int>(0)
    func add(_ amount: Int = 1) { storage.add(amount, ordering: .relaxed) }
    func set() { storage.store(1, ordering: .relaxed) }
    var value: Int { storage.load(ordering: .relaxed) }
}

@Suite("Cache: async API and single flight", .timeLimit(.minutes(1)))
struct CacheAsyncTests {
    @Test("1,000 concurrent callers on one missing key: the loader runs exactly once, all get its value")
    func singleFlight() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory)
        let runs = Shared()
        try await withThrowingTaskGroup(of: [UInt8].self) { group in
            for _ in 0..<1000 {
                group.addTask {
                    try await cache.value(forKey: "k") {
                        runs.add()
                        try await Task.sleep(for: .milliseconds(300))
                        return [42]
                    }
                }
            }
            for try await value in group { #expect(value == [42]) }
        }
        #expect(runs.value == 1)
        let stats = cache.statistics
        #expect(stats.loaderRuns == 1)
        #expect(stats.loaderCoalesced <= 999)
        #expect(try cache.disk!.value(forKey: "k") == [42])  // stored in both tiers
        #expect(cache.memory.contains("k"))
    }

    @Test("a loader's error reaches every waiter and is not cached; the next call loads again")
    func loaderErrors() async throws {
        let cache = try makeCache(nil)
        let runs = Shared()
        let failures = Shared()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<50 {
                group.addTask {
                    do {
                        _ = try await cache.value(forKey: "k") {
                            runs.add()
                            try await Task.sleep(for: .milliseconds(200))
                            throw LoadFailed()
                        }
                    } catch is LoadFailed {
                        failures.add()
                    } catch {}
                }
            }
        }
        #expect(runs.value == 1)
        #expect(failures.value == 50)
        #expect(cache["k"] == nil)
        #expect(cache.statistics.loaderFailures == 1)
        let value = try await cache.value(forKey: "k") { [7] }
        #expect(value == [7])
        #expect(cache.statistics.loaderRuns == 2)
    }

    @Test("cancelling one waiter resumes it at once and leaves the load running for the others")
    func cancellation() async throws {
        let cache = try makeCache(nil)
        let loaderCancelled = Shared()
        let runs = Shared()
        let gate = Gate()
        // The load cannot end before the test opens the gate, so a cancelled caller that returns before
        // that did not wait for the load (no timing involved: a caller that waited would hang, and the
        // suite's time limit would fail it).
        let load: @Sendable () async throws -> [UInt8] = {
            runs.add()
            await gate.wait()
            if Task.isCancelled { loaderCancelled.set() }
            return [1]
        }
        let first = Task { try await cache.value(forKey: "k", load: load) }
        #expect(await eventually { gate.arrivals == 1 })
        let second = Task { try await cache.value(forKey: "k", load: load) }
        let third = Task { try await cache.value(forKey: "k", load: load) }
        #expect(await eventually { cache.statistics.loaderCoalesced == 2 })
        first.cancel()
        await #expect(throws: CancellationError.self) { try await first.value }
        #expect(gate.arrivals == 1)  // the load is still at the gate: the cancelled caller did not wait for it
        gate.open()
        #expect(try await second.value == [1])
        #expect(try await third.value == [1])
        #expect(runs.value == 1)
        #expect(loaderCancelled.value == 0)

        // When every waiter is cancelled, the load itself is cancelled and nothing is left behind.
        let slow: @Sendable () async throws -> [UInt8] = {
            try? await Task.sleep(for: .seconds(30))
            if Task.isCancelled { loaderCancelled.set() }
            return [1]
        }
        let lone = Task { try await cache.value(forKey: "j", load: slow) }
        #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 1 })
        lone.cancel()
        await #expect(throws: CancellationError.self) { try await lone.value }
        #expect(await eventually { loaderCancelled.value == 1 })
        #expect(try await cache.value(forKey: "j") { [2] } == [2] || cache["j"] == [1])
    }

    @Test("async reads and writes from many tasks on overlapping keys: every read belongs to its key")
    func asyncConcurrency() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // A memory budget far below the working set: most reads go to disk and promote.
        let cache = try makeCache(directory, memoryBudget: 16 << 10, diskBudget: 2 << 20)
        let seed = TestSeed.value(default: 11)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    var generator = SeededGenerator(seed: seed &+ UInt64(task))
                    for step in 0..<400 {
                        let key = Int.random(in: 0..<64, using: &generator)
                        switch Int.random(in: 0..<10, using: &generator) {
                        case 0..<4:
                            try await cache.async.set(selfDescribingValue(key: key, version: step, length: 700), forKey: "k\(key)")
                        case 4:
                            try await cache.async.removeValue(forKey: "k\(key)")
                        default:
                            if let value = try await cache.async.value(forKey: "k\(key)") {
                                #expect(value.starts(with: Array("k\(key)v".utf8)), "seed \(seed)")
                            }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        let stats = cache.statistics
        #expect(stats.hits + stats.misses == stats.memory.hits + stats.memory.misses)
        #expect(stats.promotions <= stats.disk!.hits)
        #expect(stats.promotions > 0)
    }

    @Test("the I/O pool runs work on its own threads and drops work whose task was cancelled before it started")
    func ioPool() async throws {
        let pool = IOThreadPool(threadCount: 1, name: "test-io")
        defer { pool.shutdown() }
        let name = try await pool.run { () throws(MagpieError) -> String? in IOThreadPool.currentThreadName }
        #expect(name == "test-io-0")
        let gate = DispatchSemaphore(value: 0)
        let ran = Shared()
        let blocker = Task { try await pool.run { () throws(MagpieError) in gate.wait() } }
        try await Task.sleep(for: .milliseconds(50))
        let queued = Task { try await pool.run { () throws(MagpieError) in ran.set() } }
        try await Task.sleep(for: .milliseconds(50))
        queued.cancel()
        await #expect(throws: CancellationError.self) { try await queued.value }
        gate.signal()
        try await blocker.value
        _ = try await pool.run { () throws(MagpieError) in 0 }  // the queue has drained past the dropped job
        #expect(ran.value == 0)
    }

    @Test("without inline reads, async operations do all their disk I/O on the cache's I/O threads; a memory hit does none")
    func diskIOOnPoolThreads() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // The store's write is a pwrite, its read a pread (or a mapped copy, counted as one).
        let cache = try makeCache(directory, diskWriteBuffer: 0, inlineDiskReads: false)
        let threads = Locked<[String]>([])
        _ = cache.statistics  // every bucket loaded (the loader thread's reads are not this test's)
        FileIOFaults.set(under: directory.path) { call, _ in
            if call == "pread" || call == "pwrite" { threads.withLock { $0.append(IOThreadPool.currentThreadName ?? "caller") } }
            return nil
        }
        defer { FileIOFaults.set(under: directory.path, nil) }
        try await cache.async.set([1, 2, 3], forKey: "k")
        cache.memory.removeAll()
        #expect(try await cache.async.value(forKey: "k") == [1, 2, 3])  // disk read, promoted
        let diskCalls = threads.withLock { $0 }
        #expect(diskCalls.count >= 2)
        #expect(diskCalls.allSatisfy { $0.hasPrefix("magpie-io-") }, "\(diskCalls)")
        #expect(try await cache.async.value(forKey: "k") == [1, 2, 3])  // memory hit: no I/O at all
        #expect(threads.withLock { $0.count } == diskCalls.count)
        #expect(cache.statistics.inlineDiskReads == 0)
    }

    @Test("typed async API and typed loader")
    func typedAsync() async throws {
        let cache = try makeCache(nil)
        let numbers = cache.typed([Int].self)
        try await numbers.async.set([1, 2, 3], forKey: "n")
        #expect(try await numbers.async.value(forKey: "n") == [1, 2, 3])
        #expect(try await numbers.value(forKey: "m") { [4] } == [4])
        #expect(try await numbers.value(forKey: "m") { [5] } == [4])  // cached: the loader does not run
    }
}

@Suite("Cache: concurrency, statistics and metrics")
struct CacheConsistencyTests {
    @Test("writers, readers and group removals on shared keys under eviction: reads belong to their key, tiers agree at the end")
    func tiersStayConsistent() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory, memoryBudget: 8 << 10, diskBudget: 2 << 20)
        let seed = TestSeed.value(default: 5)
        let threads = 4
        let keys = 48
        let finals = Locked<[Int: [UInt8]?]>([:])
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            var generator = SeededGenerator(seed: seed &+ UInt64(thread))
            var mine: [Int: [UInt8]?] = [:]
            for step in 0..<1500 {
                let key = Int.random(in: 0..<keys, using: &generator)
                let owned = key % threads == thread  // only the owner writes a key: its last write is known
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<3 where owned:
                    let value = selfDescribingValue(key: key, version: step, length: 300)
                    let tiers: Tiers = step % 7 == 0 ? .memoryOnly : (step % 11 == 0 ? .diskOnly : .memoryAndDisk)
                    try? cache.set(value, forKey: "k\(key)", options: EntryOptions(tiers: tiers))
                    mine[key] = value
                case 3 where owned:
                    _ = try? cache.removeValue(forKey: "k\(key)")
                    mine[key] = .some(nil)
                default:
                    if let value = try? cache.value(forKey: "k\(key)") {
                        #expect(value.starts(with: Array("k\(key)v".utf8)), "seed \(seed)")
                    }
                }
            }
            finals.withLock { $0.merge(mine) { $1 } }
        }
        let expected = finals.withLock { $0 }
        for (key, value) in expected {
            #expect(try cache.value(forKey: "k\(key)") == value || (try cache.value(forKey: "k\(key)")) == nil, "key \(key), seed \(seed)")
            // Memory never holds anything but the latest value; disk the latest or, for a memory-only
            // store, nothing.
            if let inMemory = cache.memory.value(forKey: "k\(key)") { #expect(inMemory == value, "key \(key), seed \(seed)") }
            if let onDisk = try cache.disk!.value(forKey: "k\(key)") { #expect(onDisk == value, "key \(key), seed \(seed)") }
        }
    }

    @Test("statistics add up, and swift-metrics receives them")
    func statisticsAndMetrics() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let metrics = TestMetrics()
        var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 4 << 10, diskBudget: 1 << 20)
        configuration.metrics = Cache.MetricsOptions(dimensions: [("cache", "test")], interval: nil, factory: metrics)
        configuration.disk?.bucketCount = 4
        configuration.memory.shardCount = 1
        let cache = try Cache(configuration)
        for i in 0..<100 { try cache.set(Array(repeating: UInt8(i), count: 200), forKey: "k\(i)") }
        var reads = 0
        for i in stride(from: 0, to: 150, by: 3) {
            _ = try cache.value(forKey: "k\(i)")
            _ = try cache.value(forKey: "k\(i)")
            reads += 2
        }
        let stats = cache.statistics
        #expect(stats.hits + stats.misses == UInt64(reads))
        #expect(stats.memory.hits + stats.memory.misses == UInt64(reads))
        #expect(stats.disk!.hits + stats.disk!.misses == stats.memory.misses)
        #expect(stats.misses == 32)  // k102, k105 … k147 (16 keys) were never stored; each is read twice
        #expect(stats.promotions == stats.disk!.hits)
        cache.reportMetrics()
        #expect(metrics.counterTotal(label: "magpie_hits", dimensions: [("cache", "test"), ("tier", "memory")]) == Int64(stats.memory.hits))
        #expect(metrics.counterTotal(label: "magpie_hits", dimensions: [("cache", "test"), ("tier", "disk")]) == Int64(stats.disk!.hits))
        #expect(metrics.counterTotal(label: "magpie_promotions") == Int64(stats.promotions))
        #expect(try metrics.expectGauge("magpie_entries", [("cache", "test"), ("tier", "disk")]).lastValue == 100)
        _ = try cache.value(forKey: "k0")
        cache.reportMetrics()  // deltas: the counter grows by the new reads only
        #expect(metrics.counterTotal(label: "magpie_hits", dimensions: [("cache", "test"), ("tier", "memory")]) == Int64(cache.statistics.memory.hits))
    }
}
