import Foundation
import Magpie
import MagpieTestSupport
import NIOCore
import Testing

@testable import MagpieRedis

// Fenced writes sent together (`RemoteStore.storeIfNewer(batch:)`, how owed removals are replayed), and a
// load's write sent with its lease's release (`storeIfNewer(…releasing:token:)`): against a real
// redis-server and a real cluster, each write judged alone.

/// A versioned value: "MV", the version (8 bytes big endian), then `text`.
private func versioned(_ version: UInt64, _ text: String) -> [UInt8] {
    Array("MV".utf8) + withUnsafeBytes(of: version.bigEndian, Array.init) + Array(text.utf8)
}

private func key(_ text: String) -> [UInt8] { Array(text.utf8) }

/// A store (namespace "b:") on a fresh server, a plain client of it, and the change messages the server has
/// published (its sequence hash's total).
private func withStore(_ body: (RedisRemoteStore, RedisClient, () async throws -> Int64) async throws -> Void) async throws {
    try await withRedisServer { server in
        let store = try RedisRemoteStore(.init(redis: testConfiguration(port: server.port), namespace: "b:"))
        let raw = try RedisClient(testConfiguration(port: server.port))
        defer { Task { await store.shutdown(); await raw.shutdown() } }
        try await body(store, raw) {
            Int64(try await raw.send(RedisCommand("HGET", [.string("b:h~s"), .string("t")])).string ?? "0") ?? 0
        }
    }
}

@Suite("Fleet: fenced writes in one batch", .serialized, .timeLimit(.minutes(2)))
struct FleetBatchTests {
    @Test("a batch with a fenced loser, a malformed value and an expired write inside applies the others, each its own change message; NOSCRIPT resends as EVAL")
    func batchOnOneServer() async throws {
        try await withStore { store, raw, messages in
            #expect(try await store.storeIfNewer(versioned(10, "b10"), forKey: key("kb"), expiresAt: 0, notAfter: 0))
            let before = try await messages()
            let now = Int64(Date.now.timeIntervalSince1970 * 1000)
            let writes = [
                RemoteVersionedWrite(value: versioned(5, "a5"), key: key("ka"), expiresAt: 0, notAfter: 0),
                RemoteVersionedWrite(value: versioned(7, "b7"), key: key("kb"), expiresAt: 0, notAfter: 0),  // older than 10
                RemoteVersionedWrite(value: key("not versioned"), key: key("kc"), expiresAt: 0, notAfter: 0),
                RemoteVersionedWrite(value: versioned(9, "d9"), key: key("kd"), expiresAt: now - 1000, notAfter: 0),  // expired
                RemoteVersionedWrite(value: versioned(8, "e8"), key: key("ke"), expiresAt: now + 60_000, notAfter: now + 30_000),
                RemoteVersionedWrite(value: versioned(3, "f3"), key: key("kf"), expiresAt: 0, notAfter: now - 1000),  // past its deadline
            ]
            let outcomes = await store.storeIfNewer(batch: writes)
            #expect(outcomes.count == writes.count)
            #expect((try? outcomes[0].get()) == true)
            #expect((try? outcomes[1].get()) == false)
            if case .failure(let error) = outcomes[2] { #expect(error.code == .invalidConfiguration) } else { Issue.record("\(outcomes[2])") }
            #expect((try? outcomes[3].get()) == false)
            #expect((try? outcomes[4].get()) == true)
            #expect((try? outcomes[5].get()) == false)
            let held = try await store.values(forKeys: ["ka", "kb", "kc", "kd", "ke", "kf"].map(key))
            #expect(held[0] == versioned(5, "a5"))
            #expect(held[1] == versioned(10, "b10"))
            #expect(held[2] == nil && held[3] == nil && held[5] == nil)
            #expect(held[4] == versioned(8, "e8"))
            // One change message per write that stored, none for the others.
            #expect(try await messages() == before + 2)

            // A server that forgot the scripts: the batch goes again as EVAL, whole.
            #expect(try await raw.send(RedisCommand("SCRIPT", [.string("FLUSH")])).string == "OK")
            let again = await store.storeIfNewer(batch: [
                RemoteVersionedWrite(value: versioned(6, "a6"), key: key("ka"), expiresAt: 0, notAfter: 0),
                RemoteVersionedWrite(value: versioned(4, "a4"), key: key("kg"), expiresAt: 0, notAfter: 0),
            ])
            #expect(again.map { try? $0.get() } == [true, true])
            #expect(try await store.values(forKeys: [key("ka"), key("kg")]) == [versioned(6, "a6"), versioned(4, "a4")])
            #expect(try await messages() == before + 4)
        }
    }

    @Test("a batch cut by the server going away fails each write it did not answer, and none is reported stored")
    func batchWhenDown() async throws {
        try await withRedisServer { server in
            let store = try RedisRemoteStore(.init(redis: testConfiguration(port: server.port) { $0.connectTimeout = .milliseconds(300) }, namespace: "b:"))
            defer { Task { await store.shutdown() } }
            #expect(try await store.storeIfNewer(versioned(1, "x"), forKey: key("kx"), expiresAt: 0, notAfter: 0))
            await offloaded { server.kill() }
            let outcomes = await store.storeIfNewer(batch: (0..<20).map {
                RemoteVersionedWrite(value: versioned(2, "y"), key: key("k\($0)"), expiresAt: 0, notAfter: 0)
            })
            #expect(outcomes.count == 20)
            for outcome in outcomes {
                guard case .failure(let error) = outcome else {
                    Issue.record("a write reported \(outcome) with the server down")
                    continue
                }
                #expect(error.code == .remoteUnavailable)
            }
        }
    }

    @Test("a batch over a 3-master cluster: each write goes to its key's master, every one applied; a write and its lease's release (another slot) go apart, both done")
    func batchOnACluster() async throws {
        try await withRedisCluster(masters: 3) { cluster in
            var redis = RedisConfiguration(endpoints: cluster.nodes.map { RedisEndpoint(host: $0.host, port: $0.port) })
            redis.connectTimeout = .seconds(2)
            redis.commandTimeout = .seconds(2)
            let store = try RedisRemoteStore(.init(redis: redis, namespace: "b:", cluster: true))
            defer { Task { await store.shutdown() } }
            let keys = (0..<60).map { key("key:\($0)") }
            let outcomes = await store.storeIfNewer(batch: keys.enumerated().map {
                RemoteVersionedWrite(value: versioned(UInt64($0.offset + 1), "v\($0.offset)"), key: $0.element, expiresAt: 0, notAfter: 0)
            })
            #expect(outcomes.allSatisfy { (try? $0.get()) == true })
            for (index, key) in keys.enumerated() {
                #expect(try await store.values(forKeys: [key]) == [versioned(UInt64(index + 1), "v\(index)")])
            }
            // Spread over many slots (so, with 3 masters holding a third of the slots each, over them all).
            let slots = Set(keys.map { store.partition(of: $0) })
            #expect(slots.count > 30)
            // A load's write carrying its lease's release: the lease lies in another slot, so the two go apart.
            let (record, leaseKey, token) = (key("rkey:7"), key("lkey:7"), key("t1"))
            #expect(store.partition(of: record) != store.partition(of: leaseKey))
            #expect(try await store.store(token, forKey: leaseKey, expiresAt: 0, onlyIfAbsent: true))  // the lease taken
            #expect(try await store.storeIfNewer(versioned(1, "v1"), forKey: record, expiresAt: 0, notAfter: 0, pushing: false, releasing: leaseKey, token: token))
            #expect(try await store.values(forKeys: [record, leaseKey]) == [versioned(1, "v1"), nil])
            // Another holder's lease stays.
            #expect(try await store.store(key("t2"), forKey: leaseKey, expiresAt: 0, onlyIfAbsent: true))
            #expect(try await store.storeIfNewer(versioned(2, "v2"), forKey: record, expiresAt: 0, notAfter: 0, pushing: false, releasing: leaseKey, token: token))
            #expect(try await store.values(forKeys: [leaseKey]) == [key("t2")])
            // The value or the lease: separate calls, the same answers as the one script's.
            let (other, otherLease) = (key("rkey:8"), key("lkey:8"))
            #expect(try await store.valueOrLease(forKey: other, lease: otherLease, token: key("t3"), expiresAt: RemoteChangesClock.now() + 10_000)
                == RemoteLeaseRead(value: nil, leased: true))
            #expect(try await store.valueOrLease(forKey: other, lease: otherLease, token: key("t4"), expiresAt: RemoteChangesClock.now() + 10_000)
                == RemoteLeaseRead(value: nil, leased: false))
            #expect(try await store.valueOrLease(forKey: record, lease: leaseKey, token: key("t5"), expiresAt: RemoteChangesClock.now() + 10_000)
                == RemoteLeaseRead(value: versioned(2, "v2"), leased: false))
        }
    }

    @Test("a write that carries its load lease's release: one script call, the write's message alone; the lease removed only while it holds the token, however the write turns out")
    func writeReleasingLease() async throws {
        try await withStore { store, raw, messages in
            func lease() async throws -> String? { try await raw.send(.get("b:lk")).string }
            func take(_ token: String) async throws { _ = try await raw.send(.set("b:lk", Array(token.utf8))) }
            let (record, leaseKey, token) = (key("rk"), key("lk"), key("t1"))
            let single = try #require(store.single)
            #expect(try await store.storeIfNewer(versioned(10, "v10"), forKey: record, expiresAt: 0, notAfter: 0))  // the script loaded
            // The holder's token: stored and released in one command; one change message (the write's).
            try await take("t1")
            let (commands, sent) = (single.statistics.commands, try await messages())
            #expect(try await store.storeIfNewer(versioned(11, "v11"), forKey: record, expiresAt: 0, notAfter: 0, pushing: false, releasing: leaseKey, token: token))
            #expect(single.statistics.commands == commands + 1)
            #expect(try await messages() == sent + 1)
            #expect(try await lease() == nil)
            #expect(try await store.values(forKeys: [record]) == [versioned(11, "v11")])
            // Another holder's lease (this one's expired and was taken again) stays; the write goes on.
            try await take("t2")
            #expect(try await store.storeIfNewer(versioned(12, "v12"), forKey: record, expiresAt: 0, notAfter: 0, pushing: false, releasing: leaseKey, token: token))
            #expect(try await lease() == "t2")
            // A write the fence refuses and one past its deadline: nothing stored, no message, the lease
            // released all the same, in the same call. One expired already sends no write: the release goes
            // alone, with its own message.
            let now = RemoteChangesClock.now()
            for (value, expiresAt, notAfter, released) in [
                (versioned(9, "v9"), Int64(0), Int64(0), Int64(0)), (versioned(13, "v13"), 0, now - 1_000, 0), (versioned(14, "v14"), now - 1, 0, 1),
            ] {
                try await take("t1")
                let (commands, sent) = (single.statistics.commands, try await messages())
                #expect(try await !store.storeIfNewer(value, forKey: record, expiresAt: expiresAt, notAfter: notAfter, pushing: false, releasing: leaseKey, token: token))
                #expect(try await lease() == nil)
                // (The release alone runs the script flagged `allow-oom`: its first use here is NOSCRIPT, then EVAL.)
                #expect(released == 0 ? single.statistics.commands == commands + 1 : (commands + 1...commands + 2).contains(single.statistics.commands))
                #expect(try await messages() == sent + released)
            }
            #expect(try await store.values(forKeys: [record]) == [versioned(12, "v12")])
        }
    }

    @Test("the value or the lease in one script call: a value answers and takes no lease; absence or a tombstone takes a free lease only; no message")
    func valueOrLeaseInOneCall() async throws {
        try await withStore { store, raw, messages in
            let (record, leaseKey) = (key("rk"), key("lk"))
            let single = try #require(store.single)
            func ask(_ token: String) async throws -> RemoteLeaseRead {
                try await store.valueOrLease(forKey: record, lease: leaseKey, token: key(token), expiresAt: RemoteChangesClock.now() + 10_000)
            }
            func lease() async throws -> String? { try await raw.send(.get("b:lk")).string }
            // The script's SHA-1 is the server's own.
            let loaded = try await raw.send(RedisCommand("SCRIPT", [.string("LOAD"), .string(RedisRemoteScript.valueOrLease)])).string
            #expect(loaded == RedisRemoteScript.valueOrLeaseSHA)
            let sent = try await messages()
            // Absent: the lease taken (with its lifetime), in one command; then held: not taken again.
            var commands = single.statistics.commands
            #expect(try await ask("t1") == RemoteLeaseRead(value: nil, leased: true))
            #expect(single.statistics.commands == commands + 1)
            #expect(try await lease() == "t1")
            let ttl = try await raw.send(RedisCommand("PTTL", [.string("b:lk")]))
            #expect((1...10_000).contains(ttl.integerValue ?? 0))
            #expect(try await ask("t2") == RemoteLeaseRead(value: nil, leased: false))
            #expect(try await lease() == "t1")
            // A tombstone (the fence, then "MT") is no value.
            _ = try await raw.send(.del(["b:lk"]))
            _ = try await raw.send(.set("b:rk", versioned(20, "MT")))
            #expect(try await ask("t3") == RemoteLeaseRead(value: nil, leased: true))
            // A value answers; no lease is taken, none released.
            _ = try await raw.send(.del(["b:lk"]))
            for value in [versioned(21, "MX"), versioned(22, "a longer value")] {
                _ = try await raw.send(.set("b:rk", value))
                commands = single.statistics.commands
                #expect(try await ask("t4") == RemoteLeaseRead(value: value, leased: false))
                #expect(single.statistics.commands == commands + 1)
                #expect(try await lease() == nil)
            }
            _ = try await raw.send(.set("b:lk", key("t5")))
            #expect(try await ask("t6") == RemoteLeaseRead(value: versioned(22, "a longer value"), leased: false))
            #expect(try await lease() == "t5")
            #expect(try await messages() == sent)
            // The default (separate calls, a cluster's) answers the same.
            _ = try await raw.send(.del(["b:lk"]))
            _ = try await raw.send(.set("b:rk", versioned(23, "MT")))
            let expiresAt = RemoteChangesClock.now() + 10_000
            #expect(try await store.valueThenLease(forKey: record, lease: leaseKey, token: key("t7"), expiresAt: expiresAt) == RemoteLeaseRead(value: nil, leased: true))
            #expect(try await store.valueThenLease(forKey: record, lease: leaseKey, token: key("t8"), expiresAt: expiresAt) == RemoteLeaseRead(value: nil, leased: false))
            _ = try await raw.send(.set("b:rk", versioned(24, "v24")))
            #expect(try await store.valueThenLease(forKey: record, lease: leaseKey, token: key("t8"), expiresAt: expiresAt) == RemoteLeaseRead(value: versioned(24, "v24"), leased: false))
            #expect(try await lease() == "t7")
        }
    }

    @Test("after a removal (another instance's, or its own), a load asks for the value and its lease in one call, never GET first, and serves a value the store holds after all (async and synchronous)")
    func loadAfterRemovalReadsWithLease() async throws {
        try await withRedisServer { server in
            let (a, _) = try fleetCache(port: server.port)
            let (b, _) = try fleetCache(port: server.port)
            defer {
                try? a.close()
                try? b.close()
            }
            try await offloaded { () throws -> Void in
                try waitConfirmed(a)
                try waitConfirmed(b)
            }
            let raw = try RedisClient(testConfiguration(port: server.port))
            defer { Task { await raw.shutdown() } }
            _ = try server.cli("CONFIG", "SET", "slowlog-max-len", "100000")
            /// The commands clients sent since the last call (a script's own calls left out), as (name, first
            /// argument) pairs.
            func commands() async throws -> [(String, String)] {
                let log = try await raw.send(RedisCommand("SLOWLOG", [.string("GET"), .string("100000")])).arrayValue ?? []
                _ = try server.cli("SLOWLOG", "RESET")
                return log.compactMap { entry -> (String, String)? in
                    guard let fields = entry.arrayValue, fields.count >= 5, fields[4].string != "?:0",
                        let arguments = fields[3].arrayValue?.compactMap(\.string), arguments.count >= 2
                    else { return nil }
                    return (arguments[0].uppercased(), arguments[1])
                }
            }
            func removedAt(_ cache: Cache, by remover: Cache) async throws {
                let dropped = cache.statistics.remote?.copiesDropped ?? 0
                _ = try await remover.async.removeValue(forKey: "kk")
                #expect(pollUntil { (cache.statistics.remote?.copiesDropped ?? 0) > dropped } != nil)
            }
            try await a.async.set(Array("a1".utf8), forKey: "kk")
            #expect(text(try await b.value(forKey: "kk") { Array("unused".utf8) }) == "a1")  // b holds a copy
            // Another instance's removal: b's load asks once, takes the lease, loads, lands.
            try await removedAt(b, by: a)
            _ = try server.cli("CONFIG", "SET", "slowlog-log-slower-than", "0")
            _ = try await commands()
            #expect(text(try await b.value(forKey: "kk") { Array("b1".utf8) }) == "b1")
            var ran = try await commands()
            #expect(!ran.contains { $0 == ("GET", "fleet:kkk") })
            #expect(!ran.contains { $0.0 == "SET" && $0.1 == "fleet:lkk" })
            #expect(ran.contains { $0 == ("EVALSHA", RedisRemoteScript.valueOrLeaseSHA) })
            // The store holds a value after all (put back behind the feed's back): served, no load.
            let stored = try await raw.send(.get("fleet:kkk"))
            try await removedAt(b, by: a)
            _ = try await raw.send(RedisCommand("SET", [.string("fleet:kkk"), .bytes(Array(try #require(stored.bulkBytes).readableBytesView))]))
            _ = try await commands()
            #expect(text(try await b.value(forKey: "kk") { Array("b2".utf8) }) == "b1")
            ran = try await commands()
            #expect(!ran.contains { $0 == ("GET", "fleet:kkk") })
            // Its own removal, then the synchronous loader API: the same one call.
            _ = try await b.async.removeValue(forKey: "kk")
            _ = try await commands()
            try await offloaded { () throws -> Void in
                #expect(text(try b.loadValue(forKey: "kk") { Array("b3".utf8) }) == "b3")
            }
            ran = try await commands()
            #expect(!ran.contains { $0 == ("GET", "fleet:kkk") })
            #expect(ran.contains { $0 == ("EVALSHA", RedisRemoteScript.valueOrLeaseSHA) })
            #expect(text(try await a.value(forKey: "kk") { Array("unused".utf8) }) == "b3")
        }
    }

    @Test("a load through the loader API lands its value and ends its lease in one call (async and synchronous)")
    func loadEndsLeaseWithItsWrite() async throws {
        try await withRedisServer { server in
            let (a, _) = try fleetCache(port: server.port)
            defer { try? a.close() }
            try await offloaded { try waitConfirmed(a) }
            try await a.async.set(Array("w".utf8), forKey: "warm")  // the namespace's token made (its own message)
            @Sendable func messages() throws -> Int { Int(try server.cli("HGET", "fleet:h~s", "t")) ?? 0 }
            let before = try messages()
            #expect(text(try await a.value(forKey: "loaded") { Array("v".utf8) }) == "v")
            #expect(try server.cli("EXISTS", "fleet:lloaded") == "0")
            #expect(try messages() == before + 1)  // the write's message; the release sent none of its own
            try await offloaded { () throws -> Void in
                #expect(text(try a.loadValue(forKey: "loaded-sync") { Array("s".utf8) }) == "s")
                #expect(try server.cli("EXISTS", "fleet:lloaded-sync") == "0")
                #expect(try messages() == before + 2)
            }
            #expect(a.statistics.remote?.leasesAcquired == 2)
        }
    }
}
