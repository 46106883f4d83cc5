import Glibc
import Logging
@testable import Magpie
import MagpieTestSupport
import MetricsTestKit
import NIOCore
import ServiceLifecycle
import Synchronization
import Testing

@testable import MagpieRedis

/// A cache instance of a fleet: memory (and, with `directory`, disk) in front of `server`'s namespace.
///
/// `bound` (the staleness bound) is 5 s unless a test of the bound sets its own: with the whole suite
/// running in parallel on 2 cores, heartbeats can lag past a 1 s bound, and reads then rightly become
/// misses (seen: a remote hit, then a miss of the same key at once, in the async API test), which is not
/// what the tests of hits and values are about.
func fleetCache(
    port: Int, namespace: String = "fleet:", directory: String? = nil, bound: Duration = .seconds(5),
    heartbeat: Duration = .milliseconds(20), lease: Duration = .seconds(10), writeWait: Duration? = nil, foreignWrites: Bool = false,
    adjust: (inout RedisConfiguration) -> Void = { _ in }
) throws -> (Cache, RedisRemoteStore) {
    let redis = testConfiguration(port: port) {
        // Long enough that a loaded CI machine does not turn a slow reply into a miss, short enough
        // that the outage tests (a paused server) stay short.
        $0.commandTimeout = .seconds(2)
        $0.reconnect.maximum = .milliseconds(200)
        adjust(&$0)
    }
    var storeConfiguration = RedisRemoteStore.Configuration(redis: redis, namespace: namespace, heartbeatInterval: heartbeat)
    storeConfiguration.reportsForeignWrites = foreignWrites
    let store = try RedisRemoteStore(storeConfiguration)
    var configuration = Cache.Configuration(directory: directory, memoryBudget: 8 << 20, diskBudget: 64 << 20)
    configuration.metrics = nil
    configuration.remote = RemoteTierOptions(store: store, maxDisconnectedStaleness: bound, loadLease: lease)
    configuration.remote?.writeWait = writeWait
    return (try Cache(configuration), store)
}

/// Polls `condition` every 5 ms until it holds or `timeout` passes; returns whether it held and when.
func pollUntil(timeout: Duration = .seconds(5), _ condition: () throws -> Bool) rethrows -> Duration? {
    let start = ContinuousClock.now
    while ContinuousClock.now - start < timeout {
        if try condition() { return ContinuousClock.now - start }
        usleep(5_000)
    }
    return nil
}

/// Waits until `cache`'s change feed is confirmed (its local copies are then kept).
func waitConfirmed(_ cache: Cache) throws {
    let confirmed = pollUntil(timeout: .seconds(20)) { (cache.statistics.remote?.confirmations ?? 0) > 0 }
    try #require(confirmed != nil, "the change feed was never confirmed")
}

/// Waits until every change `cache` was told of before this call has been applied: a heartbeat sent
/// after it is confirmed only once everything reported before it is (Redis reports in order).
func settle(_ cache: Cache) throws {
    let before = cache.statistics.remote?.confirmations ?? 0
    let settled = pollUntil(timeout: .seconds(20)) { (cache.statistics.remote?.confirmations ?? 0) >= before + 2 }
    try #require(settled != nil, "no confirmation after the change")
}

/// Stores `value` and checks that it is this instance's local copy (the writer keeps what it wrote).
func storeAndKeep(_ cache: Cache, _ key: String, _ value: String, options: EntryOptions? = nil) throws {
    try cache.set(Array(value.utf8), forKey: key, options: options)
    try settle(cache)
    #expect(text(try cache.value(forKey: key)) == value)
    try #require(try pollUntil { try cache.lookup(key)?.tier == .memory } != nil)
}

/// Two instances on `port`'s namespace, each with its change feed confirmed.
func confirmedPair(port: Int) throws -> (Cache, Cache) {
    let (a, _) = try fleetCache(port: port)
    let (b, _) = try fleetCache(port: port)
    try waitConfirmed(a)
    try waitConfirmed(b)
    return (a, b)
}

/// Whether `key` holds no record in `server`: absent, or a removal's tombstone ("MV", the 8-byte
/// version, "MT").
func removedInStore(_ server: RedisServerProcess, _ key: String) throws -> Bool {
    let length = try server.cli("STRLEN", key)
    if length == "0" { return true }
    guard length == "12" else { return false }
    return try server.cli("GETRANGE", key, "10", "11") == "MT"
}

func text(_ bytes: [UInt8]?) -> String? { bytes.map { String(decoding: $0, as: UTF8.self) } }

@Suite("Fleet: test helpers")
struct FleetHelperTests {
    @Test("pollUntil waits out its timeout for a condition that never holds, and returns at once for one that does")
    func polling() {
        let start = ContinuousClock.now
        #expect(pollUntil(timeout: .milliseconds(60)) { false } == nil)
        #expect(ContinuousClock.now - start >= .milliseconds(60))
        var calls = 0
        let held = pollUntil(timeout: .seconds(5)) {
            calls += 1
            return calls == 3
        }
        #expect(held != nil && calls == 3)
    }
}

@Suite("Fleet: caches sharing a Redis namespace", .serialized, .timeLimit(.minutes(2)))
struct FleetTests {
    @Test("a store on one instance reaches the others; a change drops their copies within milliseconds")
    func coherence() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                try a.set(Array("v1".utf8), forKey: "user:1")
                #expect(text(try b.value(forKey: "user:1")) == "v1")  // a remote hit
                // Kept locally, unless the change's own invalidation arrived during the fetch (then the
                // next read keeps it).
                #expect(try pollUntil { try b.lookup("user:1")?.tier == .memory } != nil)
                try a.set(Array("v2".utf8), forKey: "user:1")
                let lag = try pollUntil { text(try b.value(forKey: "user:1")) == "v2" }
                #expect(lag != nil && lag! < .seconds(3))  // milliseconds when the machine is not loaded (BENCHMARKS.md)
                try a.removeValue(forKey: "user:1")
                #expect(try pollUntil { try b.value(forKey: "user:1") == nil } != nil)
                let stats = try #require(b.statistics.remote)
                // v1 fetched; v2 pushed in its change message (or fetched, if b's copy had gone by then).
                #expect(stats.hits >= 1 && stats.hits + stats.pushesApplied >= 2)
                #expect(stats.invalidations >= 2)
                #expect(stats.errors == 0)
                #expect(stats.confirmations > 0 && stats.unconfirmedMilliseconds < 1000)
            }
        }
    }

    @Test("every change message lost: an instance joining a namespace with history is still confirmed, and a change is found by the heartbeat's total")
    func totalFindsLostMessages() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, _) = try fleetCache(port: server.port)
                defer { try? a.close() }
                try waitConfirmed(a)
                for index in 0..<200 { try a.set(Array("old \(index)".utf8), forKey: "h:\(index)") }
                // b hears no change message at all: only heartbeats, whose totals fall short of what it saw.
                let redis = testConfiguration(port: server.port) { $0.commandTimeout = .seconds(2) }
                var storeConfiguration = RedisRemoteStore.Configuration(redis: redis, namespace: "fleet:", heartbeatInterval: .milliseconds(20))
                storeConfiguration.dropChangeMessages = 1
                var configuration = Cache.Configuration(memoryBudget: 8 << 20)
                configuration.metrics = nil
                configuration.remote = RemoteTierOptions(store: try RedisRemoteStore(storeConfiguration), maxDisconnectedStaleness: .seconds(5))
                let b = try Cache(configuration)
                defer { try? b.close() }
                // Confirmed only once the check of the slots' numbers has been reported.
                try waitConfirmed(b)
                #expect(text(try b.value(forKey: "h:7")) == "old 7")
                #expect(try pollUntil { try b.lookup("h:7")?.tier == .memory } != nil)
                try a.set(Array("new".utf8), forKey: "h:7")
                let lag = try pollUntil { text(try b.value(forKey: "h:7")) == "new" }
                #expect(lag != nil && lag! < .seconds(3))  // within the bound (5 s): the slot's copies dropped
                let stats = try #require(b.statistics.remote)
                #expect(stats.shortPartitions > 0)
                // Confirmations go on: each shortfall is checked and settled.
                let confirmations = stats.confirmations
                #expect(pollUntil { (b.statistics.remote?.confirmations ?? 0) > confirmations + 3 } != nil)
            }
        }
    }

    @Test("a remote hit fetched while this instance writes the key is served, not kept, and counted as unkept; later ones are kept")
    func unkeptRemoteHit() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                try a.set(Array("v1".utf8), forKey: "k")
                usleep(200_000)  // the write's report reaches b first (b holds no copy: nothing to drop)
                let remote = try #require(b.composition.coherent?.remote)
                let hash = Array("k".utf8).withUnsafeBytes { HashedKey($0, hasher: b.hasher).hash }
                let began = b.runtime.clock.now()
                remote.coherence.beginWrite(hash, now: began)  // as if b were writing the key itself
                #expect(text(try b.value(forKey: "k")) == "v1")  // served
                #expect(try b.lookup("k")?.tier == .remote)  // not kept: the store is asked again
                #expect((b.statistics.remote?.unkept ?? 0) >= 2)
                remote.coherence.endWrite(hash, began: began)
                #expect(try pollUntil { try b.lookup("k")?.tier == .memory } != nil)  // kept again
            }
        }
    }

    @Test("with foreign writes reported, a write by another program (redis-cli) drops every instance's copy; a cache's own write drops none")
    func foreignWrites() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, _) = try fleetCache(port: server.port, foreignWrites: true)
                let (b, _) = try fleetCache(port: server.port, foreignWrites: true)
                defer { try? a.close(); try? b.close() }
                try waitConfirmed(a)
                try waitConfirmed(b)
                try a.set(Array("value".utf8), forKey: "k")
                #expect(text(try b.value(forKey: "k")) == "value")
                #expect(try pollUntil { try b.lookup("k")?.tier == .memory } != nil)
                // The writes' echoes (tracking reports a script's writes to its writer too) changed nothing.
                try settle(a)
                try settle(b)
                #expect(try a.lookup("k")?.tier == .memory)
                #expect(try b.lookup("k")?.tier == .memory)
                #expect((a.statistics.remote?.ownWritesFetched ?? 1) == 0)
                _ = try server.cli("SET", "fleet:kk", "not a record")
                #expect(try pollUntil { try a.value(forKey: "k") == nil } != nil)
                #expect(try pollUntil { try b.value(forKey: "k") == nil } != nil)
                #expect((a.statistics.remote?.corrupt ?? 0) >= 1)
                // A record copied under another key, and a truncated one: foreign, both counted misses.
                try a.set(Array("other".utf8), forKey: "src")
                _ = try server.cli("COPY", "fleet:ksrc", "fleet:kdst")
                #expect(try a.value(forKey: "dst") == nil)
                #expect(text(try a.value(forKey: "src")) == "other")
                let corruptBefore = a.statistics.remote?.corrupt ?? 0
                // (Its version changed too, as any other program's write changes it: a change that kept the
                // version would look like the cache's own write's echo.)
                _ = try server.cli("SETRANGE", "fleet:ksrc", "2", "\u{7f}x")
                #expect(try pollUntil { try a.value(forKey: "src") == nil } != nil)
                #expect((a.statistics.remote?.corrupt ?? 0) > corruptBefore)
            }
        }
    }

    @Test("removeAll(inGroup:) on one instance removes the group everywhere, in the store too")
    func groups() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                for i in 0..<20 {
                    try a.set(Array("g\(i)".utf8), forKey: "member:\(i)", options: EntryOptions(group: "tenant-7"))
                }
                try a.set(Array("stays".utf8), forKey: "other")
                for i in 0..<20 { #expect(text(try b.value(forKey: "member:\(i)")) == "g\(i)") }
                try a.removeAll(inGroup: "tenant-7")
                #expect(try pollUntil { try (0..<20).allSatisfy { try b.value(forKey: "member:\($0)") == nil } } != nil)
                #expect(text(try b.value(forKey: "other")) == "stays")
                // A new instance finds the records outdated.
                let (c, _) = try fleetCache(port: server.port)
                defer { try? c.close() }
                try waitConfirmed(c)
                for i in 0..<20 { #expect(try c.value(forKey: "member:\(i)") == nil) }
                #expect((c.statistics.remote?.outdated ?? 0) == 20)
                #expect(text(try c.value(forKey: "other")) == "stays")
                // removeAll() likewise, for everything.
                try a.removeAll()
                #expect(try pollUntil { try b.value(forKey: "other") == nil } != nil)
                // c applies the same report on its own feed, not necessarily by the time b has.
                #expect(try pollUntil { try c.value(forKey: "other") == nil } != nil)
            }
        }
    }

    @Test("Redis paused: local copies served (no errors) until the bound, then misses; back after resume")
    func pausedServer() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, _) = try fleetCache(port: server.port, bound: .seconds(2))
                defer { try? a.close() }
                try waitConfirmed(a)
                try storeAndKeep(a, "p", "local")
                server.pause()
                let paused = ContinuousClock.now
                #expect(text(try a.value(forKey: "p")) == "local")  // within the bound
                var lapsed: Duration? = nil
                while ContinuousClock.now - paused < .seconds(8) {
                    if try a.value(forKey: "p") == nil {
                        lapsed = ContinuousClock.now - paused
                        break
                    }
                    usleep(5_000)
                }
                server.resume()
                let after = try #require(lapsed)
                #expect(after >= .seconds(1))  // not dropped at once (bound 2 s after the last confirmation)
                #expect(ContinuousClock.now - paused < .seconds(8))
                // Back: the store answers again and the feed is confirmed again.
                #expect(try pollUntil { text(try a.value(forKey: "p")) == "local" } != nil)
            }
        }
    }

    @Test("Redis paused past the bound and the origin failing: fail-safe still serves the stale value, nothing else does")
    func failSafeWhileRedisIsDown() async throws {
        try await withRedisServer { server in
            let (a, _) = try fleetCache(port: server.port, bound: .milliseconds(400))
            defer { try? a.close() }
            try await offloaded { try waitConfirmed(a) }
            let failSafe = LoaderOptions(failSafeMaxAge: .seconds(60))
            // Fail-safe measures a value's age from its load: values with a fresh lifetime have one.
            let fresh = EntryOptions.fresh(for: .seconds(30), staleUntil: .never)
            for key in ["f", "g"] {
                #expect(text(try await a.value(forKey: key, options: fresh, loader: failSafe) { Array("loaded".utf8) }) == "loaded")
                // Kept locally once the write's own report has been applied (a stored copy carries the
                // load's instant for fail-safe's age).
                try await offloaded {
                    try settle(a)
                    try #require(try pollUntil { try a.lookup(key)?.tier == .memory } != nil)
                }
            }
            server.pause()
            defer { server.resume() }
            try await Task.sleep(for: .milliseconds(700))  // past the bound: a plain read misses
            #expect(try await offloaded { try a.value(forKey: "f") } == nil)
            struct OriginDown: Error {}
            let served = try await a.value(forKey: "f", options: fresh, loader: failSafe) { throw OriginDown() }
            #expect(text(served) == "loaded")
            #expect(a.statistics.failSafeActivations == 1)
            // Without fail-safe the failure is the caller's (another key: "f" is throttled now).
            await #expect(throws: OriginDown.self) {
                _ = try await a.value(forKey: "g", options: fresh, loader: LoaderOptions()) { throw OriginDown() }
            }
        }
    }

    @Test("removals made while Redis is down are replayed when it is back: no resurrection")
    func removalsReplayed() async throws {
        try await withRedisServer(.init(extraConfig: ["appendonly yes", "appendfsync always"])) { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                for key in ["r1", "r2", "kept"] { try a.set(Array(key.utf8), forKey: key) }
                try a.set(Array("g".utf8), forKey: "grouped", options: EntryOptions(group: "gone"))
                server.kill()
                try a.removeValue(forKey: "r1")
                try a.set(Array("new".utf8), forKey: "r2")  // a failed store owes a removal too
                try a.removeAll(inGroup: "gone")
                #expect((a.statistics.remote?.owedRemovals ?? 0) >= 3)
                #expect(try a.value(forKey: "r1") == nil)
                try server.restart()
                #expect(pollUntil { a.statistics.remote?.owedRemovals == 0 } != nil)
                // b lost its feed: everything it held is re-read from the store, once b reaches it again.
                #expect(try pollUntil(timeout: .seconds(20)) { text(try b.value(forKey: "kept")) == "kept" } != nil)
                let errors = b.statistics.remote?.errors
                #expect(try b.value(forKey: "r1") == nil)
                #expect(try b.value(forKey: "r2") == nil)
                #expect(try b.value(forKey: "grouped") == nil)
                #expect(b.statistics.remote?.errors == errors)  // misses, not failures to reach Redis
                #expect(try removedInStore(server, "fleet:kr1"))
                #expect(try removedInStore(server, "fleet:kr2"))
            }
        }
    }

    @Test("more removals owed than the queue holds: everything is owed, and replaced in one write when Redis is back")
    func overflowingRemovals() async throws {
        try await withRedisServer(.init(extraConfig: ["appendonly yes", "appendfsync always"])) { server in
            try await offloaded {
                let store = try RedisRemoteStore(.init(redis: testConfiguration(port: server.port) {
                    $0.commandTimeout = .seconds(2)
                    $0.reconnect.maximum = .milliseconds(200)
                }, namespace: "fleet:", heartbeatInterval: .milliseconds(20)))
                var configuration = Cache.Configuration(memoryBudget: 8 << 20)
                configuration.metrics = nil
                configuration.remote = RemoteTierOptions(store: store, maxPendingRemovals: 2)
                let a = try Cache(configuration)
                let (b, _) = try fleetCache(port: server.port)
                defer { try? a.close(); try? b.close() }
                try waitConfirmed(a)
                try waitConfirmed(b)
                for i in 0..<5 { try a.set(Array("v\(i)".utf8), forKey: "o\(i)") }
                server.kill()
                for i in 0..<3 { try a.removeValue(forKey: "o\(i)") }
                let owed = try #require(a.statistics.remote)
                #expect(owed.pendingOverflows == 1 && owed.owedRemovals == 1)  // everything
                try server.restart()
                #expect(pollUntil(timeout: .seconds(20)) { a.statistics.remote?.owedRemovals == 0 } != nil)
                // Every record of the namespace is outdated now, the ones never removed included.
                #expect(try pollUntil(timeout: .seconds(20)) { (try b.value(forKey: "o4")) == nil && (b.statistics.remote?.outdated ?? 0) > 0 } != nil)
                for i in 0..<5 { #expect(try b.value(forKey: "o\(i)") == nil) }
            }
        }
    }

    @Test("the loader runs once for the fleet when the value is in the store; AUTH end to end")
    func loaderAndAuth() async throws {
        try await withRedisServer(.init(requirePassword: "s3cret")) { server in
            let (a, _) = try fleetCache(port: server.port) { $0.password = "s3cret" }
            let (b, _) = try fleetCache(port: server.port) { $0.password = "s3cret" }
            defer { try? a.close(); try? b.close() }
            try await offloaded { try waitConfirmed(a); try waitConfirmed(b) }
            let runs = Atomic<Int>(0)
            let first = try await a.value(forKey: "loaded") {
                runs.add(1, ordering: .relaxed)
                return Array("from origin".utf8)
            }
            let second = try await b.value(forKey: "loaded") {
                runs.add(1, ordering: .relaxed)
                return Array("again".utf8)
            }
            #expect(text(first) == "from origin")
            #expect(text(second) == "from origin")
            #expect(runs.load(ordering: .relaxed) == 1)
        }
    }
}

final class LoaderRuns: Sendable {
    let count = Atomic<Int>(0)
}

@Suite("Fleet: single flight", .timeLimit(.minutes(1)))
struct FleetSingleFlightTests {
    @Test("4 instances × 25 concurrent callers of a missing key: the loader runs once for the fleet")
    func singleFlight() async throws {
        try await withRedisServer { server in
            // Generous deadlines: on a loaded machine a store that times out (its value never reaches
            // Redis) or a lease that expires mid-load rightly lets another instance load, which is not
            // what this test is about.
            let caches = try (0..<4).map { _ in
                try fleetCache(port: server.port, lease: .seconds(120)) { $0.commandTimeout = .seconds(10) }.0
            }
            defer { for cache in caches { try? cache.close() } }
            try await offloaded { for cache in caches { try waitConfirmed(cache) } }
            let runs = LoaderRuns()
            try await withThrowingTaskGroup(of: [UInt8].self) { group in
                for cache in caches {
                    for _ in 0..<25 {
                        group.addTask {
                            try await cache.value(forKey: "hot") {
                                runs.count.add(1, ordering: .relaxed)
                                try await Task.sleep(for: .milliseconds(200))
                                return Array("origin".utf8)
                            }
                        }
                    }
                }
                for try await value in group { #expect(text(value) == "origin") }
            }
            let stats = caches.compactMap { $0.statistics.remote }
            #expect(stats.map(\.errors).reduce(0, +) == 0)
            #expect(runs.count.load(ordering: .relaxed) == 1)
            #expect(stats.map(\.leasesAcquired).reduce(0, +) == 1)
            #expect(stats.map(\.sharedLoads).reduce(0, +) == 3)
            #expect(caches.map { $0.statistics.loaderRuns }.reduce(0, +) == 4)  // one flight per instance
        }
    }
}

@Suite("Fleet: metrics", .timeLimit(.minutes(1)))
struct FleetMetricsTests {
    @Test("the remote tier's counters and gauges reach swift-metrics")
    func metrics() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let metrics = TestMetrics()
                let store = try RedisRemoteStore(.init(redis: testConfiguration(port: server.port), namespace: "fleet:",
                                                       heartbeatInterval: .milliseconds(20)))
                var configuration = Cache.Configuration(memoryBudget: 1 << 20)
                configuration.metrics = Cache.MetricsOptions(interval: nil, factory: metrics)
                configuration.remote = RemoteTierOptions(store: store)
                let cache = try Cache(configuration)
                defer { try? cache.close() }
                try waitConfirmed(cache)
                try cache.set([1, 2, 3], forKey: "k")
                try settle(cache)  // its own write's message changed nothing: its copy stays
                #expect(try cache.lookup("k")?.tier == .memory)
                cache.memory.removeAll()
                #expect(try cache.value(forKey: "k") == [1, 2, 3])  // fetched from Redis
                #expect(try cache.value(forKey: "absent") == nil)
                cache.reportMetrics()
                #expect(metrics.counterTotal(label: "magpie_hits", dimensions: [("tier", "remote")]) == 1)
                #expect(metrics.counterTotal(label: "magpie_misses", dimensions: [("tier", "remote")]) == 1)
                #expect(metrics.counterTotal(label: "magpie_writes", dimensions: [("tier", "remote")]) == 1)
                #expect(metrics.counterTotal(label: "magpie_invalidations", dimensions: [("tier", "remote")]) >= 1)
                let breaker = try metrics.expectGauge("magpie_breaker_open", [("tier", "remote")])
                #expect(breaker.lastValue == 0)
            }
        }
    }
}

@Suite("Fleet: restarts", .timeLimit(.minutes(1)))
struct FleetRestartTests {
    @Test("instances and Redis restarted: a disk copy changed meanwhile is never served; group removal still reaches all")
    func restarts() async throws {
        let directoryA = TemporaryDirectory("magpie-fleet-a")
        let directoryB = TemporaryDirectory("magpie-fleet-b")
        defer { directoryA.cleanup(); directoryB.cleanup() }
        try await withRedisServer(.init(extraConfig: ["appendonly yes", "appendfsync always"])) { server in
            try await offloaded {
                do {
                    let (a, _) = try fleetCache(port: server.port, directory: directoryA.path)
                    let (b, _) = try fleetCache(port: server.port, directory: directoryB.path)
                    try waitConfirmed(a)
                    try waitConfirmed(b)
                    for i in 0..<10 { try a.set(Array("old-\(i)".utf8), forKey: "m\(i)", options: EntryOptions(group: "team")) }
                    for i in 0..<10 { #expect(text(try b.value(forKey: "m\(i)")) == "old-\(i)") }  // on b's disk too
                    try b.close()
                    // While b is down, a changes half the keys.
                    for i in 0..<5 { try a.set(Array("new-\(i)".utf8), forKey: "m\(i)", options: EntryOptions(group: "team")) }
                    try a.close()
                }
                try server.restart()
                let (a, _) = try fleetCache(port: server.port, directory: directoryA.path)
                let (b, _) = try fleetCache(port: server.port, directory: directoryB.path)
                defer { try? a.close(); try? b.close() }
                try waitConfirmed(a)
                try waitConfirmed(b)
                // Until the instances heard of before the restart published again or stopped being waited
                // for (8 heartbeats), reads are misses (the delivery watermark); never the old value.
                for i in 0..<10 {
                    let expected = i < 5 ? "new-\(i)" : "old-\(i)"
                    var seen: [String?] = []
                    #expect(try pollUntil {
                        seen.append(text(try b.value(forKey: "m\(i)")))
                        return seen.last == expected
                    } != nil)
                    #expect(seen.allSatisfy { $0 == nil || $0 == expected }, "\(seen)")
                }
                try a.removeAll(inGroup: "team")
                #expect(try pollUntil { try (0..<10).allSatisfy { try b.value(forKey: "m\($0)") == nil } } != nil)
            }
        }
    }
}

#if TLS
@Suite("Fleet: TLS", .timeLimit(.minutes(1)))
struct FleetTLSTests {
    @Test("TLS end to end: records, tracking and heartbeats over verified TLS")
    func tls() async throws {
        let directory = TemporaryDirectory("magpie-fleet-tls")
        defer { directory.cleanup() }
        let material = try TLSMaterial.make(in: directory.path)
        try await withRedisServer(.init(tls: material)) { server in
            let port = try #require(server.tlsPort)
            let configure: (inout RedisConfiguration) -> Void = { $0.tls = try? RedisTLS.trusting(caFile: material.caCertPath) }
            let (a, _) = try fleetCache(port: port, adjust: configure)
            let (b, _) = try fleetCache(port: port, adjust: configure)
            defer { try? a.close(); try? b.close() }
            try await offloaded {
                try waitConfirmed(a)
                try waitConfirmed(b)
                try a.set(Array("secret".utf8), forKey: "t")
                #expect(text(try b.value(forKey: "t")) == "secret")
                try a.set(Array("changed".utf8), forKey: "t")
                #expect(try pollUntil { text(try b.value(forKey: "t")) == "changed" } != nil)
                #expect(b.statistics.remote?.errors == 0)
            }
        }
    }
}
#endif

@Suite("Fleet: service lifecycle", .timeLimit(.minutes(1)))
struct FleetServiceTests {
    @Test("a ServiceGroup's graceful shutdown replays owed removals, flushes and closes the cache")
    func gracefulShutdown() async throws {
        try await withRedisServer(.init(extraConfig: ["appendonly yes", "appendfsync always"])) { server in
            let directory = TemporaryDirectory("magpie-fleet-service")
            defer { directory.cleanup() }
            let (a, _) = try fleetCache(port: server.port, directory: directory.path)
            try await offloaded {
                try waitConfirmed(a)
                try a.set(Array("v".utf8), forKey: "doomed")
                server.kill()
                try a.removeValue(forKey: "doomed")  // owed
            }
            #expect(a.statistics.remote?.owedRemovals == 1)
            let group = ServiceGroup(services: [a], logger: Logger(label: "magpie.test"))
            let running = Task { try await group.run() }
            try await offloaded { try server.restart() }
            await group.triggerGracefulShutdown()
            try await running.value
            #expect(throws: MagpieError.self) { try a.value(forKey: "doomed") }  // closed
            #expect(try removedInStore(server, "fleet:kdoomed"))  // the removal reached Redis first
        }
    }
}
