import Glibc
@testable import Magpie
import MagpieTestSupport
import Testing

@testable import MagpieRedis

/// A fleet on a Redis that is full (over `maxmemory`, refusing writes with `OOM`) or that lost its keys
/// (evicted): the bookkeeping goes on, and nothing stale is served.
@Suite("Fleet: a Redis that is full or evicts", .serialized, .timeLimit(.minutes(2)))
struct FleetFullRedisTests {
    @Test("the server's major version, from HELLO's version string")
    func majorVersion() {
        #expect(RedisNodePool.majorVersion("7.0.15") == 7)
        #expect(RedisNodePool.majorVersion("6.2.14") == 6)
        #expect(RedisNodePool.majorVersion("8.0.0") == 8)
        #expect(RedisNodePool.majorVersion("") == nil)
        #expect(RedisNodePool.majorVersion("unstable") == nil)
    }

    @Test("a server loading its data set is unavailable to the cache, not refusing: its owed removals keep holding the watermark")
    func loadingIsUnavailable() {
        func code(_ reply: String) -> MagpieError.Code { RedisRemoteStore.unavailable(RedisError.server(RedisServerError(reply))).code }
        #expect(code("LOADING Redis is loading the dataset in memory") == .remoteUnavailable)
        #expect(code("OOM command not allowed when used memory > 'maxmemory'.") == .remoteFull)
        #expect(code("ERR value is not an integer or out of range") == .remoteRefused)
        #expect(RedisRemoteStore.unavailable(RedisError(.timedOut, "no reply")).code == .remoteUnavailable)
    }

    @Test("only a value's store stays subject to OOM: removals, tombstones and tokens run allow-oom")
    func writesWhenFull() {
        #expect(!RedisRemoteStore.mayWriteWhenFull(.fenced, value: Array("MV12345678MR and the rest".utf8)))
        #expect(RedisRemoteStore.mayWriteWhenFull(.fenced, value: RemoteRecord.tombstone(version: 7)))
        for kind in [RedisRemoteStore.ChangeKind.plain, .created, .removal, .removalIfEqual] {
            #expect(RedisRemoteStore.mayWriteWhenFull(kind, value: []))
        }
    }

    @Test(
        "the server's version picks the scripts: 6 gets them as they were, 7 flagged allow-oom, one that cannot compile the flag the plain",
        arguments: [("6.2.14", false, false), ("7.0.15", true, false), ("7.0.15", true, true)])
    func scriptsByVersion(version: String, flagged: Bool, compileFails: Bool) async throws {
        let sent = RedisLock<[String]>([])
        try await withFakeRedisServer(handler: { command, reply in
            switch command.first {
            case "HELLO":
                reply.send("%2\r\n+server\r\n+redis\r\n+version\r\n+\(version)\r\n")
            case "EVALSHA":
                sent.withLock { $0.append(command[1]) }
                let unknown = compileFails && command[1] == RedisRemoteScript.changeAllowingOOMSHA
                reply.send(unknown ? "-NOSCRIPT No matching script. Please use EVAL.\r\n" : ":1\r\n")
            case "EVAL":
                sent.withLock { $0.append(command[1].hasPrefix("#!lua") ? "EVAL flagged" : "EVAL") }
                reply.send("-ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'\r\n")
            default:
                reply.send("+OK\r\n")
            }
        }) { server in
            let store = try RedisRemoteStore(.init(redis: testConfiguration(port: server.port), namespace: "v:"))
            // The version comes with a connection's HELLO (before the first, the scripts go unflagged).
            for _ in 0..<200 where store.single?.serverMajorVersion == nil { try await Task.sleep(for: .milliseconds(10)) }
            try await store.remove(keys: [Array("kx".utf8)])
            await store.shutdown()
            let expected =
                !flagged
                ? [RedisRemoteScript.changeSHA]
                : compileFails
                    ? [RedisRemoteScript.changeAllowingOOMSHA, "EVAL flagged", RedisRemoteScript.changeSHA]
                    : [RedisRemoteScript.changeAllowingOOMSHA]
            #expect(sent.withLock { $0 } == expected)
        }
    }

    @Test("a full Redis: confirmations go on, copies stay servable, a refused value leaves its tombstone and nothing owed")
    func fullRedis() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let bound = Duration.seconds(3)  // the heartbeats must not lag past it on a loaded machine
                let (a, _) = try fleetCache(port: server.port, bound: bound)
                let (b, _) = try fleetCache(port: server.port, bound: bound)
                defer { try? a.close(); try? b.close() }
                try waitConfirmed(a)
                try waitConfirmed(b)
                try a.set(Array("v1".utf8), forKey: "shared")
                try a.set(Array("w1".utf8), forKey: "other")
                for key in ["shared", "other"] {
                    _ = try b.value(forKey: key)
                    try #require(try pollUntil { try b.lookup(key)?.tier == .memory } != nil)
                }
                // Full: every write that takes memory is refused from now on (the default policy, noeviction).
                #expect(try server.cli("CONFIG", "SET", "maxmemory", "1") == "OK")
                #expect(throws: RedisHarnessError.self) { try server.cli("SET", "probe", "x") }  // OOM

                // The heartbeats go on: b's copies stay servable from memory for 3 × the bound.
                let confirmations = b.statistics.remote?.confirmations ?? 0
                let until = ContinuousClock.now + bound * 3
                while ContinuousClock.now < until {
                    #expect(try b.lookup("shared")?.tier == .memory)
                    usleep(100_000)
                }
                let stats = try #require(b.statistics.remote)
                #expect(stats.confirmations > confirmations + 10)
                #expect(stats.unconfirmedMilliseconds < 3_000)

                // A value refused for lack of memory: its tombstone replaces v1 in the store, and its
                // message drops b's copy well within the bound; nothing is owed.
                let written = ContinuousClock.now
                try a.set(Array("v2".utf8), forKey: "shared")
                let dropped = try pollUntil(timeout: bound) { try b.value(forKey: "shared") == nil }
                #expect(dropped != nil, "b still served v1 \(ContinuousClock.now - written) after a's write")
                #expect((a.statistics.remote?.oomRefusals ?? 0) >= 1)
                #expect((a.statistics.remote?.errors ?? 0) >= (a.statistics.remote?.oomRefusals ?? 0))
                #expect(try removedInStore(server, "fleet:kshared"))
                // A removal is taken, full as the store is.
                try a.removeValue(forKey: "other")
                #expect(try pollUntil(timeout: bound) { try b.value(forKey: "other") == nil } != nil)
                #expect(try removedInStore(server, "fleet:kother"))
                #expect(pollUntil(timeout: bound) { a.statistics.remote?.owedRemovals == 0 && b.statistics.remote?.owedRemovals == 0 } != nil)
                #expect(a.statistics.remote?.queuedRemovals == 0)
            }
        }
    }

    @Test("a namespace token evicted and created anew by one instance: the others follow its message, nothing older comes back")
    func tokenCreatedAnew() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                try storeAndKeep(a, "before", "old")
                #expect(text(try b.value(forKey: "before")) == "old")  // b reads (and caches) the token too
                // Redis evicts the token; an instance that holds none (a new one) writes, and so creates another.
                #expect(try server.cli("DEL", "fleet:a") == "1")
                let (c, _) = try fleetCache(port: server.port)
                defer { try? c.close() }
                try waitConfirmed(c)
                try c.set(Array("new".utf8), forKey: "after")
                try settle(a)
                try settle(b)
                // One message later every instance judges the records by the new token.
                #expect(text(try b.value(forKey: "after")) == "new")
                #expect(text(try a.value(forKey: "after")) == "new")
                try b.set(Array("from b".utf8), forKey: "later")
                try settle(c)
                #expect(text(try c.value(forKey: "later")) == "from b")
                // What was written under the evicted token is gone for every instance, local copies too.
                for cache in [a, b, c] { #expect(try cache.value(forKey: "before") == nil) }
            }
        }
    }

    @Test("on a full Redis a token is still created and announced; the value is refused, its tombstone taken")
    func tokenCreatedWhenFull() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                defer { try? a.close(); try? b.close() }
                try storeAndKeep(a, "before", "old")
                #expect(text(try b.value(forKey: "before")) == "old")
                #expect(try server.cli("CONFIG", "SET", "maxmemory", "1") == "OK")
                #expect(try server.cli("DEL", "fleet:a") == "1")
                let (c, _) = try fleetCache(port: server.port)
                defer { try? c.close() }
                try waitConfirmed(c)
                try c.set(Array("new".utf8), forKey: "after")
                #expect(try server.cli("STRLEN", "fleet:a") == "8")
                try settle(a)
                try settle(b)
                for cache in [a, b, c] { #expect(try cache.value(forKey: "before") == nil) }
                #expect((c.statistics.remote?.oomRefusals ?? 0) >= 1)
                #expect(try removedInStore(server, "fleet:kafter"))
                #expect(c.statistics.remote?.owedRemovals == 0)
            }
        }
    }

    @Test("the sequence counters evicted: numbering restarts without dropping copies, and a message lost after it is found")
    func sequencesEvicted() async throws {
        try await withRedisServer { server in
            try await offloaded {
                let (a, b) = try confirmedPair(port: server.port)
                // c discards every change message: only the heartbeats' totals, and the checks they call
                // for, tell it what changed.
                var dropping = RedisRemoteStore.Configuration(
                    redis: testConfiguration(port: server.port) { $0.commandTimeout = .seconds(2) }, namespace: "fleet:",
                    heartbeatInterval: .milliseconds(20))
                dropping.dropChangeMessages = 1
                var configuration = Cache.Configuration(directory: nil, memoryBudget: 8 << 20, diskBudget: 64 << 20)
                configuration.metrics = nil
                configuration.remote = RemoteTierOptions(store: try RedisRemoteStore(dropping), maxDisconnectedStaleness: .seconds(5))
                let c = try Cache(configuration)
                defer { try? a.close(); try? b.close(); try? c.close() }
                try waitConfirmed(c)
                try a.set(Array("v1".utf8), forKey: "k")
                try a.set(Array("x1".utf8), forKey: "x")
                try settle(c)  // c's numbers have caught up with the writes (by a check: it saw no message)
                for (cache, key) in [(b, "k"), (b, "x"), (c, "k")] {
                    try #require(try pollUntil { _ = try cache.value(forKey: key); return try cache.lookup(key)?.tier == .memory } != nil)
                }
                let losses = b.statistics.remote?.partitionLosses ?? 0
                let restarts = b.statistics.remote?.sequenceRestarts ?? 0
                try settle(c)
                // Redis evicts the counters; the next write makes them anew, numbered from 1 again.
                #expect(try server.cli("DEL", "fleet:h~s") == "1")
                try a.set(Array("v2".utf8), forKey: "k")
                // c lost that write's message: the new total, read against numbering from 0, finds it.
                #expect(try pollUntil(timeout: .seconds(3)) { text(try c.value(forKey: "k")) == "v2" } != nil)
                #expect(c.statistics.remote?.sequenceRestarts ?? 0 >= 1)
                // b took the restart for what it is: no gap, no copy dropped but the written key's.
                try settle(b)
                #expect(text(try b.value(forKey: "k")) == "v2")
                #expect(try b.lookup("x")?.tier == .memory)
                #expect(b.statistics.remote?.partitionLosses == losses)
                #expect(b.statistics.remote?.sequenceRestarts == restarts + 1)
            }
        }
    }
}

