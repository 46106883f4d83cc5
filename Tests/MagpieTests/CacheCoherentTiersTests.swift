import Foundation
import Glibc
@testable import Magpie
import MagpieTestSupport
import Synchronization
import Testing

// The composition with a remote tier (CoherentTiers) against the in-memory store of the test support
// target: coherence, fencing, a paused server, a lost feed, owed removals, leases and many tasks, without
// a redis-server (the MagpieRedisTests suites run the same logic against real servers).

/// A fleet instance on `server`: memory, and with `directory` a disk tier, in front of the shared store.
func inMemoryFleetCache(
    _ server: InMemoryRemoteServer, directory: String? = nil, bound: Duration = .seconds(5), lease: Duration? = .seconds(10),
    commandTimeout: Duration = .milliseconds(300)
) throws -> (Cache, InMemoryRemoteStore) {
    let store = InMemoryRemoteStore(server, commandTimeout: commandTimeout)
    var configuration = Cache.Configuration(directory: directory, memoryBudget: 8 << 20, diskBudget: 64 << 20)
    configuration.metrics = nil
    configuration.remote = RemoteTierOptions(store: store, maxDisconnectedStaleness: bound, loadLease: lease)
    return (try Cache(configuration), store)
}

/// Two instances on `server`, each with a confirmation applied (``settled(_:)``).
func settledPair(_ server: InMemoryRemoteServer) async throws -> (Cache, Cache) {
    let (a, _) = try inMemoryFleetCache(server)
    let b: Cache
    do {
        (b, _) = try inMemoryFleetCache(server)
    } catch {
        try? a.close()
        throw error
    }
    #expect(await settled(a))
    #expect(await settled(b))
    return (a, b)
}

/// The change message another instance's write of `name` at `version` publishes, as `cache` receives it:
/// `text` pushed (a record current by the namespace token `cache` holds), or nil for a removal.
func changeMessage(_ name: String, _ text: String?, version: UInt64, to cache: Cache) throws -> RemoteChange {
    let coherent = try #require(cache.composition.coherent)
    let key = [RemoteKey.record] + Array(name.utf8)
    let partition = coherent.remote.partition(of: Array(name.utf8))
    guard let text else { return .changed(RemoteChangeMessage(key: key, version: version, own: false, partition: partition, sequence: 0)) }
    var record = RemoteRecord(value: Array(text.utf8))
    record.version = version
    record.namespaceToken = coherent.remote.tokens.cached(group: nil, now: cache.runtime.clock.now()) ?? 0
    return .changed(
        RemoteChangeMessage(key: key, version: version, own: false, partition: partition, sequence: 0, value: record.encoded(key: key)))
}

/// Polls `condition` every 2 ms until it holds or `timeout` passes.
func eventually(timeout: Duration = .seconds(5), _ condition: () async throws -> Bool) async rethrows -> Bool {
    let start = ContinuousClock.now
    while ContinuousClock.now - start < timeout {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return false
}

/// Waits until `cache` has applied a confirmation made after this call (and so every change before it).
func settled(_ cache: Cache) async -> Bool {
    let before = cache.statistics.remote?.confirmations ?? 0
    return await eventually { (cache.statistics.remote?.confirmations ?? 0) >= before + 2 }
}

/// A count shared by tasks.
final class SharedCount: Sendable {
    private let count = Atomic<Int>(0)
    func add() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }
private func string(_ value: [UInt8]?) -> String? { value.map { String(decoding: $0, as: UTF8.self) } }

@Suite("Cache: coherent tiers on the in-memory store", .serialized, .timeLimit(.minutes(2)))
struct CacheCoherentTiersTests {
    @Test("a store on one instance reaches the others; a change drops their copies; removals, groups, everything")
    func coherence() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        try await a.async.set(bytes("one"), forKey: "k")
        #expect(string(try await b.async.value(forKey: "k")) == "one")
        #expect(try await eventually { try await b.async.lookup("k")?.tier == .memory })  // kept locally
        try await a.async.set(bytes("two"), forKey: "k")
        #expect(try await eventually { string(try await b.async.value(forKey: "k")) == "two" })
        try a.set(bytes("three"), forKey: "k")  // the synchronous API, through the bridge
        #expect(try await eventually { string(try b.value(forKey: "k")) == "three" })
        try await a.async.removeValue(forKey: "k")
        #expect(try await eventually { try await b.async.value(forKey: "k") == nil })
        try await a.async.set(bytes("g"), forKey: "grouped", options: EntryOptions(group: "team"))
        #expect(string(try await b.async.value(forKey: "grouped")) == "g")
        try await a.async.removeAll(inGroup: "team")
        #expect(try await eventually { try await b.async.value(forKey: "grouped") == nil })
        try b.set(bytes("x"), forKey: "other")
        #expect(string(try await a.async.value(forKey: "other")) == "x")
        try await b.async.removeAll()
        #expect(try await eventually { try await a.async.value(forKey: "other") == nil })
        #expect(a.statistics.remote?.errors == 0)
        #expect(b.statistics.remote?.errors == 0)
    }

    @Test("the store applies a versioned write only over an older one, and refuses one past its deadline")
    func fencedStore() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let store = InMemoryRemoteStore(server)
        func fenced(_ version: UInt64, _ tail: String) -> [UInt8] {
            bytes("MV") + withUnsafeBytes(of: version.bigEndian) { Array($0) } + bytes(tail)
        }
        let now = CacheClock.system.now()
        #expect(try await store.storeIfNewer(fenced(5, "a"), forKey: bytes("k"), expiresAt: 0, notAfter: 0))
        #expect(try await !store.storeIfNewer(fenced(5, "b"), forKey: bytes("k"), expiresAt: 0, notAfter: 0))
        #expect(try await !store.storeIfNewer(fenced(4, "c"), forKey: bytes("k"), expiresAt: 0, notAfter: 0))
        #expect(try await !store.storeIfNewer(fenced(9, "d"), forKey: bytes("k"), expiresAt: 0, notAfter: now - 1))
        #expect(try await store.storeIfNewer(fenced(6, "e"), forKey: bytes("k"), expiresAt: 0, notAfter: now + 60_000))
        #expect(server.value(bytes("k")) == fenced(6, "e"))
    }

    @Test("a paused store: writes that time out run late and are refused; the later removal wins on every instance")
    func pausedServerLateWrite() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, _) = try inMemoryFleetCache(server, commandTimeout: .milliseconds(100))
        let (b, _) = try inMemoryFleetCache(server, commandTimeout: .milliseconds(100))
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        let names = (0..<8).map { "late:\($0)" }
        for name in names { try await a.async.set(bytes("before"), forKey: name) }
        for round in 0..<3 {
            server.pause()
            // a's stores time out; their commands stay queued and run when the store resumes.
            for name in names { try await a.async.set(bytes("resurrected \(round)"), forKey: name) }
            // b removes the keys after them (its commands time out too, and are owed).
            for name in names { try await b.async.removeValue(forKey: name) }
            server.resume()
            #expect(await eventually { a.statistics.remote?.owedRemovals == 0 && b.statistics.remote?.owedRemovals == 0 })
            #expect(await settled(a))
            #expect(await settled(b))
            for name in names {
                let held = server.value(bytes("k") + bytes(name))
                #expect(held.map { $0.count == 12 && $0[10] == 0x4D && $0[11] == 0x54 } ?? true, "round \(round), \(name)")
                #expect(try await a.async.value(forKey: name) == nil)
                #expect(try await b.async.value(forKey: name) == nil)
            }
            for name in names { try await a.async.set(bytes("before"), forKey: name) }
        }
    }

    @Test("a paused store: local copies are served until the bound, then misses; served again after it resumes")
    func pausedServerBound() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, _) = try inMemoryFleetCache(server, bound: .milliseconds(500))
        defer { try? a.close() }
        #expect(await settled(a))
        try a.set(bytes("local"), forKey: "p")
        #expect(try await eventually { try a.lookup("p")?.tier == .memory })
        server.pause()
        let paused = ContinuousClock.now
        #expect(string(try a.value(forKey: "p")) == "local")  // within the bound
        #expect(try await eventually { try a.value(forKey: "p") == nil })
        #expect(ContinuousClock.now - paused >= .milliseconds(300))
        server.resume()
        #expect(try await eventually { string(try a.value(forKey: "p")) == "local" })
    }

    @Test("a lost feed: another instance's write is never read stale past the bound; the restored feed drops every older copy")
    func lostFeed() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let bound = Duration.milliseconds(400)
        let (a, _) = try inMemoryFleetCache(server, bound: bound)
        let (b, bStore) = try inMemoryFleetCache(server, bound: bound)
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        try a.set(bytes("v1"), forKey: "k")
        #expect(try await eventually { try b.lookup("k")?.tier == .memory }, "\(String(describing: b.statistics.remote))")
        bStore.loseFeed()
        try a.set(bytes("v2"), forKey: "k")
        let written = ContinuousClock.now
        // b never hears of v2: it may serve v1 only within the bound of its last confirmation; after it, a
        // miss (the fleet's delivery watermark, which comes with the feed, is as old: the store's value
        // is withheld too) or v2.
        var lastStale = written
        while ContinuousClock.now - written < .seconds(2) {
            let read = string(try b.value(forKey: "k"))
            if read == "v1" { lastStale = ContinuousClock.now }
            #expect(read == "v1" || read == "v2" || read == nil)
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(lastStale - written <= bound + .milliseconds(100), "v1 served \(lastStale - written) after v2 was written")
        #expect(try b.value(forKey: "k") == nil)
        #expect((b.statistics.remote?.withheld ?? 0) > 0)
        bStore.restoreFeed()
        #expect(await settled(b))
        #expect(try await eventually { try b.lookup("k")?.tier == .memory })
        #expect((b.statistics.remote?.epochBumps ?? 0) >= 2)  // the feed's start and its restoration
    }

    @Test("the writer keeps its write: served from its memory right after, no remote read; its own message changes nothing")
    func writerKeepsItsWrite() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        for round in 0..<20 {
            try a.set(bytes("sync \(round)"), forKey: "mine")
            #expect(try a.lookup("mine")?.tier == .memory)
            try await a.async.set(bytes("async \(round)"), forKey: "mine")
            #expect(try await a.async.lookup("mine") == CacheHit(value: bytes("async \(round)"), tier: .memory))
        }
        #expect(await settled(a))
        #expect(try a.lookup("mine")?.tier == .memory)
        let statistics = try #require(a.statistics.remote)
        #expect(statistics.readHits == 0 && statistics.readMisses == 0 && statistics.ownWritesFetched == 0)
        #expect(statistics.ownMessages >= 40)
    }

    @Test("a small value travels in its change message: an instance holding the key takes it with no round trip; a long one drops the copy")
    func pushedValues() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        try a.set(bytes("v1"), forKey: "k")
        #expect(string(try b.value(forKey: "k")) == "v1")  // b holds it now
        let fetched = b.statistics.remote?.readHits ?? 0
        try a.set(bytes("v2"), forKey: "k")
        #expect(try await eventually { try b.lookup("k") == CacheHit(value: bytes("v2"), tier: .memory) })
        #expect(b.statistics.remote?.readHits == fetched)  // no round trip
        #expect((b.statistics.remote?.pushesApplied ?? 0) >= 1)
        // An instance that does not hold a key ignores its pushed value (nothing is added).
        try a.set(bytes("other"), forKey: "not-held")
        #expect(await settled(b))
        #expect(b.memory.value(forKey: "not-held") == nil)
        // A value longer than the limit drops the copy: the next read fetches it.
        let long = [UInt8](repeating: 7, count: 5000)
        try a.set(long, forKey: "k")
        #expect(await eventually { b.memory.value(forKey: "k") == nil })
        #expect(try b.value(forKey: "k") == long)
        #expect(b.statistics.remote?.readHits == fetched + 1)
    }

    @Test("a copy a removal dropped comes back with the next write's pushed value (no round trip); an older push does not, nor one older than an own removal")
    func droppedCopyComesBack() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        try a.set(bytes("v1"), forKey: "k")
        #expect(string(try b.value(forKey: "k")) == "v1")  // b holds it now
        #expect(try await eventually { try b.lookup("k")?.tier == .memory })
        let fetched = b.statistics.remote?.readHits ?? 0
        try a.removeValue(forKey: "k")
        #expect(await eventually { b.memory.value(forKey: "k") == nil })
        try a.set(bytes("v2"), forKey: "k")
        #expect(try await eventually { try b.lookup("k") == CacheHit(value: bytes("v2"), tier: .memory) })
        #expect(b.statistics.remote?.readHits == fetched)  // no round trip
        // A key b never held is still not added.
        try a.set(bytes("other"), forKey: "never-held")
        #expect(await settled(b))
        #expect(b.memory.value(forKey: "never-held") == nil)

        // Messages injected in order: a removal at H + 2 drops the copy; a push of H + 1 (older than the
        // removal, reordered behind it) is not taken; a push of H + 3 is.
        let coherent = try #require(b.composition.coherent)
        let held = try #require(Array("k".utf8).withUnsafeBytes { b.memory.metadata(HashedKey($0, hasher: b.hasher)) })
        coherent.apply(try changeMessage("k", nil, version: held.version + 2, to: b))
        #expect(b.memory.value(forKey: "k") == nil)
        coherent.apply(try changeMessage("k", "older", version: held.version + 1, to: b))
        #expect(b.memory.value(forKey: "k") == nil)
        coherent.apply(try changeMessage("k", "newer", version: held.version + 3, to: b))
        #expect(try b.lookup("k") == CacheHit(value: bytes("newer"), tier: .memory))

        // b's own removal counts as a drop at its own version: a message of an older write (one the store
        // took before the removal, still on its way) does not bring the key back; a newer one does.
        coherent.apply(try changeMessage("k", nil, version: held.version + 4, to: b))  // dropped at H + 4
        try await Task.sleep(for: .milliseconds(5))  // b's next version is above H + 5 (milliseconds first)
        try b.removeValue(forKey: "k")
        coherent.apply(try changeMessage("k", "before the removal", version: held.version + 5, to: b))
        #expect(b.memory.value(forKey: "k") == nil)
        coherent.apply(try changeMessage("k", "after the removal", version: held.version + (1 << 40), to: b))
        #expect(try b.lookup("k") == CacheHit(value: bytes("after the removal"), tier: .memory))
    }

    @Test("the report of a token this instance created, before it cached it, drops nothing; another token makes every copy a miss")
    func ownTokenEcho() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, _) = try inMemoryFleetCache(server)
        defer { try? a.close() }
        #expect(await settled(a))
        try a.set(bytes("v"), forKey: "r")
        #expect(try a.lookup("r") == CacheHit(value: bytes("v"), tier: .memory))
        let coherent = try #require(a.composition.coherent)
        func report(_ token: UInt64) -> RemoteChange {
            .changed(
                RemoteChangeMessage(
                    key: RemoteKey.namespaceKey, version: 0, own: false, partition: coherent.remote.partition(of: RemoteKey.namespaceKey),
                    sequence: 0, value: RemoteRecord.tokenBytes(token)))
        }
        // As `token(group:create:)` does before its store; the report comes before the token is cached.
        let mine = RemoteRecord.newToken()
        coherent.remote.tokens.noteCreated(mine)
        coherent.remote.tokens.forget(group: nil)
        coherent.apply(report(mine))
        #expect(try a.lookup("r") == CacheHit(value: bytes("v"), tier: .memory))
        #expect(a.statistics.remote?.ownWritesFetched == 0)
        // Another program's (or instance's) token: every local copy is outdated.
        coherent.apply(report(mine &+ 1))
        #expect(try a.lookup("r")?.tier != .memory)
    }

    @Test("a change message replaces or drops a copy only when its version is newer than the copy's (messages reordered)")
    func reorderedMessages() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        try a.set(bytes("current"), forKey: "r")
        #expect(string(try b.value(forKey: "r")) == "current")
        #expect(try await eventually { try b.lookup("r")?.tier == .memory })
        let coherent = try #require(b.composition.coherent)
        let held = try #require(Array("r".utf8).withUnsafeBytes { b.memory.metadata(HashedKey($0, hasher: b.hasher)) })
        // An older write's message, arriving late: the copy stays.
        coherent.apply(try changeMessage("r", "older", version: held.version - 1, to: b))
        #expect(try b.lookup("r") == CacheHit(value: bytes("current"), tier: .memory))
        #expect((b.statistics.remote?.staleMessages ?? 0) == 1)
        // A newer one: replaced, served from memory.
        coherent.apply(try changeMessage("r", "newer", version: held.version + 1, to: b))
        #expect(try b.lookup("r") == CacheHit(value: bytes("newer"), tier: .memory))
        // The older one again (reordered after the newer): the newer copy stays.
        coherent.apply(try changeMessage("r", "older", version: held.version - 1, to: b))
        #expect(try b.lookup("r") == CacheHit(value: bytes("newer"), tier: .memory))
        // A newer removal (no value): the copy goes.
        coherent.apply(try changeMessage("r", nil, version: held.version + 2, to: b))
        #expect(b.memory.value(forKey: "r") == nil)
    }

    @Test("a gap in a partition's sequence makes exactly that partition's copies unservable")
    func sequenceGap() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        let coherent = try #require(b.composition.coherent)
        // Two keys in different partitions, held by b.
        let names = (0..<200).map { "g\($0)" }
        let first = names[0]
        let firstPartition = coherent.remote.partition(of: Array(first.utf8))
        let second = try #require(names.first { coherent.remote.partition(of: Array($0.utf8)) != firstPartition })
        for name in [first, second] {
            try a.set(bytes(name), forKey: name)
            #expect(string(try b.value(forKey: name)) == name)
            #expect(try await eventually { try b.lookup(name)?.tier == .memory })
        }
        // Messages of an unrelated key in the first key's partition: 1,000,000 (after what b saw: maybe a gap
        // already, after which its copy is fetched again), then 1,000,002: one missed.
        let unrelated = [RemoteKey.record] + Array("unrelated".utf8)
        coherent.apply(.changed(RemoteChangeMessage(key: unrelated, version: 1, own: false, partition: firstPartition, sequence: 1_000_000)))
        try await Task.sleep(for: .milliseconds(2))
        #expect(string(try b.value(forKey: first)) == first)
        #expect(try await eventually { try b.lookup(first)?.tier == .memory })
        let gaps = b.statistics.remote?.sequenceGaps ?? 0
        try await Task.sleep(for: .milliseconds(2))  // the floor moves to a later millisecond than the copies' stamps
        coherent.apply(.changed(RemoteChangeMessage(key: unrelated, version: 2, own: false, partition: firstPartition, sequence: 1_000_002)))
        #expect(b.statistics.remote?.sequenceGaps == gaps + 1)
        #expect(try b.lookup(first)?.tier == .remote)  // unservable: fetched again (and kept)
        #expect(try b.lookup(second)?.tier == .memory)  // another partition: untouched
    }

    @Test("lost change messages: a fraction dropped on the way, never a read stale past the bound; gaps and short partitions found")
    func droppedMessages() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let bound = Duration.milliseconds(500)
        let (a, _) = try inMemoryFleetCache(server, bound: bound)
        let (b, bStore) = try inMemoryFleetCache(server, bound: bound)
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        bStore.dropMessages(0.3)
        let keys = (0..<32).map { "d\($0)" }
        // Per key: the value written and when its store returned.
        var written: [String: (value: Int, at: ContinuousClock.Instant)] = [:]
        var staleReads: [String] = []
        let end = ContinuousClock.now + .seconds(3)
        var round = 0
        while ContinuousClock.now < end {
            let key = keys[round % keys.count]
            try await a.async.set(bytes("\(round)"), forKey: key)
            written[key] = (round, ContinuousClock.now)
            for key in keys {
                guard let read = string(try await b.async.value(forKey: key)).flatMap(Int.init), let last = written[key] else { continue }
                if read < last.value && ContinuousClock.now - last.at > bound + .milliseconds(100) { staleReads.append("\(key): \(read) < \(last.value)") }
            }
            round += 1
        }
        #expect(staleReads.isEmpty, "\(staleReads.prefix(5))")
        let statistics = try #require(b.statistics.remote)
        #expect(statistics.sequenceGaps + statistics.shortPartitions > 0)
    }

    @Test("a store restarted empty numbers its partitions from 1 again: a change message lost after it is still found")
    func restartedNumbering() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let bound = Duration.milliseconds(400)
        let (a, _) = try inMemoryFleetCache(server, bound: bound)
        let (b, bStore) = try inMemoryFleetCache(server, bound: bound)
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        // The key's partition numbered well past what the restarted server will reach.
        for round in 0..<50 { try await a.async.set(bytes("old \(round)"), forKey: "r") }
        #expect(await settled(b))
        server.restartEmpty()
        #expect(await settled(b))
        try await a.async.set(bytes("v1"), forKey: "r")
        #expect(string(try await b.async.value(forKey: "r")) == "v1")
        #expect(try await eventually { try b.lookup("r")?.tier == .memory })
        // The next change of "r" (number 2 since the restart) never reaches b: found by the total.
        bStore.dropMessages(1)
        try await a.async.set(bytes("v2"), forKey: "r")
        try await Task.sleep(for: bound + .milliseconds(150))
        #expect(string(try await b.async.value(forKey: "r")) == "v2")
        #expect((b.statistics.remote?.shortPartitions ?? 0) > 0)
    }

    @Test("a lost message whose partition the check never finds: confirmations stop, and the copy lapses within the bound")
    func uncheckedLoss() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let bound = Duration.milliseconds(400)
        let (a, _) = try inMemoryFleetCache(server, bound: bound)
        let (b, bStore) = try inMemoryFleetCache(server, bound: bound)
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        try await a.async.set(bytes("v1"), forKey: "w")
        #expect(string(try await b.async.value(forKey: "w")) == "v1")
        #expect(try await eventually { try b.lookup("w")?.tier == .memory })
        server.withholdSequences(true)
        bStore.dropMessages(1)
        try await a.async.set(bytes("v2"), forKey: "w")
        try await Task.sleep(for: bound + .milliseconds(150))
        #expect(string(try await b.async.value(forKey: "w")) == "v2")
        // Once the check answers, confirmations resume.
        bStore.dropMessages(0)
        server.withholdSequences(false)
        #expect(await settled(b))
    }

    @Test("a load that read its origin before another instance's write, and lands after it, never overwrites that write")
    func loadRacesAWrite() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, _) = try inMemoryFleetCache(server)
        let (b, _) = try inMemoryFleetCache(server, lease: nil)
        defer { try? a.close(); try? b.close() }
        #expect(await settled(a))
        #expect(await settled(b))
        let originRead = Wakeup()
        let writeDone = Wakeup()
        let load = Task {
            try await b.value(forKey: "raced") {
                let old = bytes("from the origin, before the write")
                originRead.finish()
                await writeDone.wait(upTo: .seconds(5))
                return old
            }
        }
        await originRead.wait(upTo: .seconds(5))
        try await a.async.set(bytes("newer"), forKey: "raced")
        #expect(await settled(b))  // the write's message reached b before the load lands
        writeDone.finish()
        #expect(try await load.value == bytes("from the origin, before the write"))  // its callers get what it loaded
        #expect(await settled(b))
        #expect(string(try await a.async.value(forKey: "raced")) == "newer")
        #expect(try await eventually { string(try await b.async.value(forKey: "raced")) == "newer" })
        #expect(string(try await b.async.value(forKey: "raced")) == "newer")
    }

    @Test("removals made while the store is down are owed and replayed when it is back: nothing comes back")
    func removalsReplayed() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        for i in 0..<10 { try await a.async.set(bytes("v\(i)"), forKey: "r\(i)") }
        server.goDown()
        for i in 0..<10 { try await a.async.removeValue(forKey: "r\(i)") }
        #expect(a.statistics.remote?.owedRemovals == 10)
        for i in 0..<10 { #expect(try await a.async.value(forKey: "r\(i)") == nil) }
        server.comeUp()
        #expect(await eventually { a.statistics.remote?.owedRemovals == 0 })
        #expect(await settled(b))
        for i in 0..<10 { #expect(try await b.async.value(forKey: "r\(i)") == nil) }
        #expect((a.statistics.remote?.replayedRemovals ?? 0) == 10)
    }

    @Test("a shutdown waits for the owed removals to land (woken by the replay, no polling)")
    func shutdownWaitsForReplay() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, _) = try inMemoryFleetCache(server)
        #expect(await settled(a))
        try await a.async.set(bytes("v"), forKey: "s")
        server.goDown()
        try await a.async.removeValue(forKey: "s")
        #expect(a.statistics.remote?.owedRemovals == 1)
        Task {
            try? await Task.sleep(for: .milliseconds(100))
            server.comeUp()
        }
        let started = ContinuousClock.now
        try await a.shutdown(replayingFor: .seconds(5))
        #expect(ContinuousClock.now - started < .seconds(2))
        #expect(a.statistics.remote?.owedRemovals == 0)
    }

    @Test("a load whose write fails (the store down) releases its lease once: the write's error leaves the release to the cache, not to the store's default too")
    func failedLandingReleasesOnce() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, store) = try inMemoryFleetCache(server)
        defer { try? a.close() }
        #expect(await settled(a))
        try await a.async.set(bytes("w"), forKey: "warm")  // the namespace's token made: the write goes out
        let value = try await a.value(forKey: "down") { () async -> [UInt8] in
            server.goDown()  // the lease taken; the write will fail
            return bytes("v")
        }
        #expect(value == bytes("v"))
        #expect(a.statistics.remote?.leasesAcquired == 1)
        #expect(a.statistics.remote?.owedRemovals == 1)
        #expect(store.conditionalRemovalsAsked == 1)
        server.comeUp()
    }

    @Test("4 instances × 25 callers of a missing key: the loader runs once for the fleet; waiters wake on the value, not a timer")
    func singleFlight() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let caches = try (0..<4).map { _ in try inMemoryFleetCache(server, bound: .seconds(5)).0 }
        defer { for cache in caches { try? cache.close() } }
        for cache in caches { #expect(await settled(cache)) }
        let loads = SharedCount()
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: [UInt8].self) { group in
            for cache in caches {
                for _ in 0..<25 {
                    group.addTask {
                        try await cache.value(forKey: "expensive") {
                            loads.add()
                            try await Task.sleep(for: .milliseconds(50))
                            return bytes("loaded")
                        }
                    }
                }
            }
            for try await value in group { #expect(value == bytes("loaded")) }
        }
        #expect(loads.value == 1)
        // The waiters of the other instances woke on the value's change, long before the 5 s bound.
        #expect(ContinuousClock.now - started < .seconds(2))
    }

    @Test("statistics add up with a remote tier: hits + misses = memory's reads")
    func statisticsAddUp() async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (a, b) = try await settledPair(server)
        defer { try? a.close(); try? b.close() }
        for i in 0..<20 { try a.set(bytes("v\(i)"), forKey: "s\(i)") }
        for round in 0..<3 {
            for i in 0..<30 { _ = try await b.async.value(forKey: "s\(i)") }
            if round == 0 { #expect(try await eventually { try b.lookup("s0")?.tier == .memory }) }
        }
        let statistics = b.statistics
        #expect(statistics.hits + statistics.misses == statistics.memory.hits + statistics.memory.misses)
        #expect(statistics.hits >= 20 && statistics.misses >= 30)
        #expect((statistics.remote?.hits ?? 0) >= 20)
    }
}

/// The composer under concurrency, through each composition: memory only, memory and disk, and both kept
/// coherent with a remote tier (two instances on one in-memory store).
@Suite("Cache: 256 tasks through every composition", .serialized, .timeLimit(.minutes(2)))
struct CacheCompositionTaskTests {
    enum Kind: String, CaseIterable, Sendable {
        case memory, memoryAndDisk, coherent, coherentWithDisk
    }

    @Test("256 concurrent tasks: every read is nil or a value written for its key; instances converge", arguments: Kind.allCases)
    func manyTasks(kind: Kind) async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let directories = (TemporaryDirectory("magpie-tasks-a"), TemporaryDirectory("magpie-tasks-b"))
        defer { directories.0.cleanup(); directories.1.cleanup() }
        let withDisk = kind == .memoryAndDisk || kind == .coherentWithDisk
        let caches: [Cache]
        switch kind {
        case .memory, .memoryAndDisk:
            var configuration = Cache.Configuration(directory: withDisk ? directories.0.path : nil, memoryBudget: 1 << 20)
            configuration.metrics = nil
            caches = [try Cache(configuration)]
        case .coherent, .coherentWithDisk:
            caches = [
                try inMemoryFleetCache(server, directory: withDisk ? directories.0.path : nil, commandTimeout: .seconds(10)).0,
                try inMemoryFleetCache(server, directory: withDisk ? directories.1.path : nil, commandTimeout: .seconds(10)).0,
            ]
            for cache in caches { #expect(await settled(cache)) }
        }
        defer { for cache in caches { try? cache.close() } }
        let keys = 48
        let (wrong, reads) = (SharedCount(), SharedCount())
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<256 {
                group.addTask {
                    let cache = caches[task % caches.count]
                    var random = SystemRandomNumberGenerator()
                    for step in 0..<40 {
                        let key = Int.random(in: 0..<keys, using: &random)
                        let name = "key:\(key)"
                        switch Int.random(in: 0..<10, using: &random) {
                        case 0..<5:
                            guard let value = try? await cache.async.value(forKey: name) else { continue }
                            reads.add()
                            if !(string(value) ?? "").hasPrefix("\(name)/") { wrong.add() }
                        case 5:
                            guard let value = try? cache.value(forKey: name) else { continue }  // the synchronous API too
                            if !(string(value) ?? "").hasPrefix("\(name)/") { wrong.add() }
                        case 6..<9:
                            try? await cache.async.set(bytes("\(name)/\(task)/\(step)"), forKey: name)
                        default:
                            _ = try? await cache.async.removeValue(forKey: name)
                        }
                    }
                }
            }
        }
        #expect(wrong.value == 0)
        #expect(reads.value > 0)
        guard caches.count == 2 else { return }
        #expect(caches[0].statistics.remote?.errors == 0)
        #expect(caches[1].statistics.remote?.errors == 0)
        // Quiet now: both instances answer what the store holds, for every key.
        #expect(await settled(caches[0]))
        #expect(await settled(caches[1]))
        for key in 0..<keys {
            let name = "key:\(key)"
            let (fromA, fromB) = (try await caches[0].async.value(forKey: name), try await caches[1].async.value(forKey: name))
            #expect(fromA == fromB, "\(name): \(string(fromA) ?? "nil") vs \(string(fromB) ?? "nil")")
        }
    }
}
