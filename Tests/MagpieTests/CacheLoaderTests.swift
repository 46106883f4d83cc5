import Dispatch
import Foundation
import MagpieTestSupport
import MetricsTestKit
import Synchronization
import Testing

@testable import Magpie

private struct OriginDown: Error, Equatable {}

/// A count that closures can share.
private final class Count: Sendable {
    private let storage = Atomic<Int>(0)
    func add() { storage.add(1, ordering: .relaxed) }
    var value: Int { storage.load(ordering: .relaxed) }
}

private func makeCache(_ directory: TemporaryDirectory?, clock: ManualClock, loader: LoaderOptions = LoaderOptions()) throws -> Cache {
    var configuration = Cache.Configuration(directory: directory?.path, memoryBudget: 4 << 20, diskBudget: 16 << 20)
    configuration.clock = clock.cacheClock
    configuration.defaultLoaderOptions = loader
    configuration.metrics = nil
    configuration.diskBufferWriteInterval = nil
    return try Cache(configuration)
}

/// Fresh 10 s, stale until 60 s.
private let swr = EntryOptions.fresh(for: .seconds(10), staleUntil: .after(.seconds(60)))

@Suite("Cache: loaders with freshness (stale-while-revalidate, fail-safe, timeouts, negative caching)", .timeLimit(.minutes(1)))
struct CacheLoaderTests {
    @Test("fresh → stale → expired, in memory and on disk, and across a reopen", arguments: [false, true])
    func transitions(onDisk: Bool) async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        var cache = try makeCache(directory, clock: clock)
        try cache.set([1, 2, 3], forKey: "k", options: swr)
        let stored = clock.now
        func reopenIfOnDisk() throws {
            guard onDisk else { return }
            try cache.close()
            cache = try makeCache(directory, clock: clock)  // memory empty: the disk record answers
        }
        try reopenIfOnDisk()
        var hit = try #require(try cache.lookup("k"))
        #expect(!hit.isStale && hit.freshUntil == stored + 10_000 && hit.loadedAt == stored)
        #expect(hit.tier == (onDisk ? .disk : .memory))

        clock.advance(milliseconds: 9_999)
        try reopenIfOnDisk()
        #expect(try cache.lookup("k")?.isStale == false)
        clock.advance(milliseconds: 1)  // fresh-until is exclusive
        try reopenIfOnDisk()
        hit = try #require(try cache.lookup("k"))
        #expect(hit.isStale && hit.value == [1, 2, 3])
        #expect(try cache.value(forKey: "k") == [1, 2, 3])  // the plain read serves stale values

        // The loader API serves the stale value at once (stale-while-revalidate) and refreshes it.
        let gate = Gate()
        let value = try await cache.value(forKey: "k", options: swr) {
            await gate.wait()
            return [9]
        }
        #expect(value == [1, 2, 3])
        gate.open()
        #expect(await eventually { (try? cache.lookup("k"))?.value == [9] })
        #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 })
        let refreshed = clock.now
        try reopenIfOnDisk()
        #expect(try cache.lookup("k")?.isStale == false)
        #expect(try cache.lookup("k")?.freshUntil == refreshed + 10_000)

        clock.advance(milliseconds: 59_999)
        try reopenIfOnDisk()
        #expect(try cache.lookup("k")?.isStale == true)
        clock.advance(milliseconds: 1)
        try reopenIfOnDisk()
        #expect(try cache.lookup("k") == nil)
        #expect(try cache.value(forKey: "k") == nil)
        let runs = Count()
        let loaded = try await cache.value(forKey: "k", options: swr) {
            runs.add()
            return [7]
        }
        #expect(loaded == [7] && runs.value == 1)  // expired: the caller waits for the load
        try cache.close()
    }

    @Test("1,000 stale hits start exactly one background refresh; every caller gets the stale value at once")
    func oneRefreshPerKey() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock)
        try cache.set([1], forKey: "k", options: swr)
        clock.advance(seconds: 11)
        let gate = Gate()
        let runs = Count()
        try await withThrowingTaskGroup(of: [UInt8].self) { group in
            for _ in 0..<1000 {
                group.addTask {
                    try await cache.value(forKey: "k", options: swr) {
                        runs.add()
                        await gate.wait()
                        return [2]
                    }
                }
            }
            for try await value in group { #expect(value == [1]) }
        }
        #expect(await eventually { gate.arrivals == 1 })
        gate.open()
        #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 })
        #expect(runs.value == 1)
        let statistics = cache.statistics
        #expect(statistics.staleHits == 1000 && statistics.backgroundRefreshes == 1 && statistics.loaderRuns == 1)
        #expect(try cache.value(forKey: "k") == [2])
        let value = try await cache.value(forKey: "k", options: swr) { [3] }
        #expect(value == [2] && cache.statistics.freshHits == 1)
    }

    @Test("eager refresh: a hit past the fraction of the fresh lifetime refreshes before the value goes stale")
    func eagerRefresh() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock, loader: LoaderOptions(eagerRefresh: 0.8))
        try cache.set([1], forKey: "k", options: swr)
        let runs = Count()
        clock.advance(milliseconds: 7_999)
        _ = try await cache.value(forKey: "k", options: swr) { runs.add(); return [2] }
        #expect(cache.statistics.backgroundRefreshes == 0)
        clock.advance(milliseconds: 1)
        let value = try await cache.value(forKey: "k", options: swr) { runs.add(); return [2] }
        #expect(value == [1])  // still fresh: served, and refreshed behind the caller
        #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 })
        #expect(runs.value == 1 && cache.statistics.backgroundRefreshes == 1)
        #expect(try cache.lookup("k")?.freshUntil == clock.now + 10_000)
        #expect(cache.statistics.staleHits == 0)
    }

    @Test("fail-safe: a failed load serves the stale value within its maximum age, then throttles the origin")
    func failSafe() async throws {
        let clock = ManualClock()
        let loader = LoaderOptions(
            staleWhileRevalidate: false, failSafeMaxAge: .seconds(30), failSafeThrottle: .seconds(5))
        let cache = try makeCache(nil, clock: clock, loader: loader)
        try cache.set([1], forKey: "k", options: swr)
        let calls = Count()
        let failing: @Sendable () async throws -> [UInt8] = {
            calls.add()
            throw OriginDown()
        }
        clock.advance(seconds: 11)  // stale, 11 s old
        #expect(try await cache.value(forKey: "k", options: swr, load: failing) == [1])
        #expect(calls.value == 1)
        let statistics = cache.statistics
        #expect(statistics.failSafeActivations == 1 && statistics.loaderFailures == 1 && statistics.staleHits == 1)
        // Throttled: served without calling the origin, for 5 s.
        for _ in 0..<10 { #expect(try await cache.value(forKey: "k", options: swr, load: failing) == [1]) }
        #expect(calls.value == 1)
        clock.advance(milliseconds: 4_999)
        #expect(try await cache.value(forKey: "k", options: swr, load: failing) == [1])
        #expect(calls.value == 1)
        clock.advance(milliseconds: 1)  // the throttle ends: one more try, fail-safe again
        #expect(try await cache.value(forKey: "k", options: swr, load: failing) == [1])
        #expect(calls.value == 2)
        // 30 s after the load, the value is too old for fail-safe: the throttle stops there too, and the
        // caller gets the error.
        clock.advance(milliseconds: 13_999)  // 29.999 s old
        #expect(try await cache.value(forKey: "k", options: swr, load: failing) == [1])
        clock.advance(milliseconds: 1)
        await #expect(throws: OriginDown.self) { try await cache.value(forKey: "k", options: swr, load: failing) }
        // Without a stale value, the error always reaches the caller.
        await #expect(throws: OriginDown.self) { try await cache.value(forKey: "absent", options: swr, load: failing) }
    }

    @Test("a failed background refresh keeps the stale value and throttles the key (no hammering)")
    func failedBackgroundRefresh() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock, loader: LoaderOptions(failSafeMaxAge: .seconds(60)))
        try cache.set([1], forKey: "k", options: swr)
        clock.advance(seconds: 11)
        let calls = Count()
        for _ in 0..<20 {
            let value = try await cache.value(forKey: "k", options: swr) {
                calls.add()
                throw OriginDown()
            }
            #expect(value == [1])
            _ = await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 }
        }
        #expect(calls.value == 1)
        #expect(cache.statistics.failSafeActivations == 1)
    }

    @Test("soft timeout: the caller gets the stale value; the load goes on and lands")
    func softTimeout() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        let loader = LoaderOptions(staleWhileRevalidate: false, softTimeout: .milliseconds(50), hardTimeout: .seconds(2))
        let cache = try makeCache(directory, clock: clock, loader: loader)
        try cache.set([1], forKey: "k", options: swr)
        clock.advance(seconds: 11)
        let gate = Gate()
        let caller = Task {
            try await cache.value(forKey: "k", options: swr) {
                await gate.wait()
                return [2]
            }
        }
        #expect(await clock.waitForSleepers(1))
        clock.advance(milliseconds: 50)
        #expect(try await caller.value == [1])
        #expect(cache.statistics.softTimeouts == 1)
        #expect(try cache.value(forKey: "k") == [1])  // not landed yet
        gate.open()
        #expect(await eventually { (try? cache.value(forKey: "k")) == [2] })
        #expect(try cache.disk?.value(forKey: "k") == [2])
        #expect(try cache.lookup("k")?.isStale == false)
    }

    @Test("hard timeout: a typed error, the load goes on and lands; with fail-safe, the stale value instead")
    func hardTimeout() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock, loader: LoaderOptions(hardTimeout: .seconds(1)))
        let gate = Gate()
        let caller = Task {
            try await cache.value(forKey: "k", options: swr) {
                await gate.wait()
                return [2]
            }
        }
        #expect(await clock.waitForSleepers(1))
        clock.advance(seconds: 1)
        do {
            _ = try await caller.value
            Issue.record("no error")
        } catch let error as MagpieError {
            #expect(error.code == .loadTimedOut)
        }
        #expect(cache.statistics.hardTimeouts == 1)
        gate.open()
        #expect(await eventually { (try? cache.value(forKey: "k")) == [2] })

        // Stale, no stale-while-revalidate, hard timeout only: fail-safe serves the stale value.
        clock.advance(seconds: 11)
        let strict = LoaderOptions(staleWhileRevalidate: false, failSafeMaxAge: .seconds(60), hardTimeout: .seconds(1))
        let stuck = Gate()
        let second = Task {
            try await cache.value(forKey: "k", options: swr, loader: strict) {
                await stuck.wait()
                return [3]
            }
        }
        #expect(await clock.waitForSleepers(1))
        clock.advance(seconds: 1)
        #expect(try await second.value == [2])
        stuck.open()
        #expect(await eventually { (try? cache.value(forKey: "k")) == [3] })
    }

    @Test("negative caching: an absence is remembered for its lifetime, invisible to plain reads, in both tiers")
    func negativeCaching() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        var cache = try makeCache(directory, clock: clock, loader: LoaderOptions(negativeLifetime: .seconds(5)))
        let calls = Count()
        let origin: @Sendable () async throws -> [UInt8]? = {
            calls.add()
            return nil
        }
        #expect(try await cache.valueIfPresent(forKey: "gone", load: origin) == nil)
        #expect(try await cache.valueIfPresent(forKey: "gone", load: origin) == nil)
        #expect(calls.value == 1)
        #expect(cache.statistics.negativeHits == 1)
        #expect(try cache.value(forKey: "gone") == nil && !(try cache.contains("gone")) && cache["gone"] == nil)
        #expect(try cache.lookup("gone") == nil && (try cache.disk?.value(forKey: "gone")) == nil)
        try cache.close()
        cache = try makeCache(directory, clock: clock, loader: LoaderOptions(negativeLifetime: .seconds(5)))
        #expect(try await cache.valueIfPresent(forKey: "gone", load: origin) == nil)
        #expect(calls.value == 1)  // remembered on disk across the reopen
        let promotions = cache.statistics.promotions
        for _ in 0..<3 { #expect(try cache.value(forKey: "gone") == nil) }
        #expect(cache.statistics.promotions == promotions)  // a plain read does not store the absence again
        // A caller that needs a value does not take the absence for one.
        let needed = try await cache.value(forKey: "gone") { [5] }
        #expect(needed == [5])
        #expect(try cache.value(forKey: "gone") == [5])
        try cache.removeValue(forKey: "gone")
        _ = try await cache.valueIfPresent(forKey: "gone", load: origin)
        #expect(calls.value == 2)
        clock.advance(seconds: 5)  // expired: asked again
        _ = try await cache.valueIfPresent(forKey: "gone", load: origin)
        #expect(calls.value == 3)
        // Without a negative lifetime, an absence is not remembered and removes the stale value.
        try cache.set([1], forKey: "was", options: swr)
        clock.advance(seconds: 11)
        let strict = LoaderOptions(staleWhileRevalidate: false)
        #expect(try await cache.valueIfPresent(forKey: "was", options: swr, loader: strict, load: origin) == nil)
        #expect(try cache.value(forKey: "was") == nil)
        try cache.close()
    }

    @Test("a removal or group removal during a background refresh is not undone when the refresh lands")
    func noResurrection() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        let cache = try makeCache(directory, clock: clock)
        let grouped = EntryOptions(memoryExpiry: .after(.seconds(60)), group: "g", freshFor: .seconds(10))
        for (key, options) in [("single", swr), ("grouped", grouped), ("stored", swr), ("all", swr)] {
            try cache.set([1], forKey: key, options: options)
        }
        clock.advance(seconds: 11)
        for (key, options) in [("single", swr), ("grouped", grouped), ("stored", swr), ("all", swr)] {
            let gate = Gate()
            let value = try await cache.value(forKey: key, options: options) {
                await gate.wait()
                return [2]
            }
            #expect(value == [1])  // stale, served; the refresh waits at the gate
            switch key {
            case "single": try cache.removeValue(forKey: key)
            case "grouped": try cache.removeAll(inGroup: "g")
            case "all": try cache.removeAll()
            default: try cache.set([3], forKey: key)
            }
            gate.open()
            #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 })
            #expect(try cache.value(forKey: key) == (key == "stored" ? [3] : nil), "\(key)")
            #expect(try cache.disk?.value(forKey: key) == (key == "stored" ? [3] : nil), "\(key)")
        }
        #expect(cache.statistics.loadsSuperseded == 4)
    }

    @Test("cancelling one waiter leaves the shared load running for the others")
    func cancelOneWaiter() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock)
        let gate = Gate()
        let load: @Sendable () async throws -> [UInt8] = {
            await gate.wait()
            return [4]
        }
        let first = Task { try await cache.value(forKey: "k", load: load) }
        let second = Task { try await cache.value(forKey: "k", load: load) }
        #expect(await eventually { gate.arrivals == 1 && cache.statistics.loaderCoalesced == 1 })
        first.cancel()
        await #expect(throws: CancellationError.self) { try await first.value }
        gate.open()
        #expect(try await second.value == [4])
        #expect(try cache.value(forKey: "k") == [4])
    }

    @Test("the synchronous loader API: single flight on threads, stale-while-revalidate on loader threads, timeouts")
    func blockingForms() async throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock)
        let runs = Count()
        let gate = Gate()
        let results = Locked<[[UInt8]]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { index in
            if index == 0 {
                while runs.value == 0 { usleep(100) }
                usleep(20_000)
                gate.open()
                return
            }
            let value = try? cache.loadValue(forKey: "k", options: swr) {
                runs.add()
                gate.waitBlocking()
                return [1]
            }
            results.withLock { $0.append(value ?? []) }
        }
        #expect(runs.value == 1 && results.withLock { $0 } == Array(repeating: [1], count: 7))
        clock.advance(seconds: 11)
        let refreshed = Gate()
        #expect(try cache.loadValue(forKey: "k", options: swr) { refreshed.waitBlocking(); return [2] } == [1])
        refreshed.open()
        #expect(await eventually { (try? cache.value(forKey: "k")) == [2] })
        #expect(try cache.loadValueIfPresent(forKey: "none") { nil } == nil)
        // A hard timeout fires on the cache's clock while the caller blocks.
        let stuck = Gate()
        let timedOut = Task.detached {
            do {
                _ = try cache.loadValue(forKey: "slow", loader: LoaderOptions(hardTimeout: .seconds(1))) {
                    stuck.waitBlocking()
                    return [9]
                }
                return false
            } catch let error as MagpieError {
                return error.code == .loadTimedOut
            } catch {
                return false
            }
        }
        #expect(await clock.waitForSleepers(1))
        clock.advance(seconds: 1)
        #expect(await timedOut.value)
        stuck.open()
        #expect(await eventually { (try? cache.value(forKey: "slow")) == [9] })
    }

    @Test("jitter spreads the lifetimes of entries written together; fixed instants are never moved")
    func jitter() throws {
        let clock = ManualClock()
        let cache = try makeCache(nil, clock: clock)
        let options = EntryOptions(memoryExpiry: .after(.seconds(60)), freshFor: .seconds(10), jitter: .seconds(5))
        var freshUntil: Set<Int64> = []
        for n in 0..<200 {
            try cache.set([1], forKey: "k\(n)", options: options)
            let hit = try #require(try cache.lookup("k\(n)"))
            let until = try #require(hit.freshUntil)
            #expect(until >= clock.now + 10_000 && until <= clock.now + 15_000)
            freshUntil.insert(until)
        }
        #expect(freshUntil.count > 100)
        // The expiry moves with the same offset: every entry outlives its fresh lifetime by 50 s.
        clock.advance(milliseconds: 59_999)
        #expect((0..<200).allSatisfy { (try? cache.value(forKey: "k\($0)")) != nil })
        clock.advance(milliseconds: 5_001)
        #expect((0..<200).allSatisfy { (try? cache.value(forKey: "k\($0)")) == nil })
        let fixed = EntryOptions(memoryExpiry: .at(millisecondsSince1970: clock.now + 1_000), jitter: .seconds(5))
        try cache.set([1], forKey: "fixed", options: fixed)
        clock.advance(seconds: 1)
        #expect(try cache.value(forKey: "fixed") == nil)
    }

    @Test("the loader's statistics reach swift-metrics")
    func metrics() async throws {
        let clock = ManualClock()
        let metrics = TestMetrics()
        var configuration = Cache.Configuration(memoryBudget: 1 << 20)
        configuration.clock = clock.cacheClock
        configuration.metrics = Cache.MetricsOptions(interval: nil, factory: metrics)
        configuration.defaultLoaderOptions = LoaderOptions(negativeLifetime: .seconds(5))
        let cache = try Cache(configuration)
        try cache.set([1], forKey: "k", options: swr)
        _ = try await cache.value(forKey: "k", options: swr) { [2] }  // fresh
        clock.advance(seconds: 11)
        _ = try await cache.value(forKey: "k", options: swr) { [2] }  // stale: refreshed in the background
        #expect(await eventually { cache.loads.flightCount.load(ordering: .relaxed) == 0 })
        _ = try await cache.valueIfPresent(forKey: "none") { nil }
        _ = try await cache.valueIfPresent(forKey: "none") { nil }  // negative hit
        let statistics = cache.statistics
        #expect(statistics.freshHits == 1 && statistics.staleHits == 1 && statistics.negativeHits == 1)
        #expect(statistics.backgroundRefreshes == 1 && statistics.loaderRuns == 2)
        cache.reportMetrics()
        #expect(metrics.counterTotal(label: "magpie_loader_fresh_hits") == 1)
        #expect(metrics.counterTotal(label: "magpie_loader_stale_hits") == 1)
        #expect(metrics.counterTotal(label: "magpie_loader_negative_hits") == 1)
        #expect(metrics.counterTotal(label: "magpie_loader_background_refreshes") == 1)
    }
}
