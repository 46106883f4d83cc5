import Foundation
import MagpieTestSupport
import NIOCore
import Synchronization
import Testing

@testable import MagpieRedis

/// One 3-master cluster for the whole suite (starting one takes a few seconds), stopped when the suite
/// ends, whether its tests pass or not. Tests that change the topology (a reshard, a migration, a killed
/// node) leave it usable: they find slot owners as they are now, and a killed node is restarted.
private struct SharedRedisCluster: SuiteTrait, TestScoping {
    @TaskLocal static var current: RedisClusterProcess?

    func provideScope(for test: Test, testCase: Test.Case?,
                      performing function: @Sendable () async throws -> Void) async throws {
        // Without full coverage the live masters keep serving while one is down (the killed-node test).
        let options = RedisServerProcess.Options(extraConfig: ["cluster-require-full-coverage no"])
        try await withRedisCluster(masters: 3, options) { cluster in
            try await Self.$current.withValue(cluster) { try await function() }
        }
    }

    /// The suite's cluster.
    static func cluster() throws -> RedisClusterProcess {
        try #require(current, "the suite runs without its cluster")
    }
}

extension Trait where Self == SharedRedisCluster {
    /// Runs the suite against one cluster of 3 masters.
    fileprivate static var sharedRedisCluster: Self { SharedRedisCluster() }
}

/// A client configuration for the cluster's nodes (all of them seeds unless `seeds` says otherwise).
private func clusterConfiguration(_ seeds: [RedisServerProcess],
                                  _ adjust: (inout RedisConfiguration) -> Void = { _ in }) -> RedisConfiguration {
    var configuration = RedisConfiguration(endpoints: seeds.map { RedisEndpoint(host: $0.host, port: $0.port) })
    configuration.connectTimeout = .seconds(1)
    configuration.commandTimeout = .seconds(2)
    adjust(&configuration)
    return configuration
}

/// Runs blocking harness work (redis-cli, waiting for the cluster) on a thread of its own.
private func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

private func endpoint(of node: RedisServerProcess) -> RedisEndpoint { RedisEndpoint(host: node.host, port: node.port) }

/// For each of `slots`, a hash tag whose keys (`{tag}…`) fall in it.
private func hashTags(for slots: [Int]) -> [Int: String] {
    var wanted = Set(slots)
    var tags: [Int: String] = [:]
    var candidate = 0
    while !wanted.isEmpty {
        let tag = "t\(candidate)"
        let slot = Int(RedisHashSlot.slot(of: tag.utf8))
        if wanted.remove(slot) != nil { tags[slot] = tag }
        candidate += 1
    }
    return tags
}

/// What the writers of the live-reshard test share.
private final class ReshardProgress: Sendable {
    /// The reshard has ended.
    let done = Atomic<Bool>(false)
    /// Commands that succeeded.
    let operations = Atomic<Int>(0)
    /// Commands that succeeded while the reshard ran.
    let duringReshard = Atomic<Int>(0)
}

@Suite("RedisClusterClient against a real 3-master cluster", .serialized, .sharedRedisCluster,
       .timeLimit(.minutes(1)))
struct RedisClusterTests {
    @Test("CRC16 and hash tags agree with the specification and the server")
    func hashSlots() async throws {
        #expect(RedisHashSlot.crc16(Array("123456789".utf8)) == 0x31C3)
        #expect(RedisHashSlot.slot(of: "{user1000}.following".utf8) == RedisHashSlot.slot(of: "{user1000}.followers".utf8))
        #expect(RedisHashSlot.slot(of: "{user1000}.following".utf8) == RedisHashSlot.slot(of: "user1000".utf8))
        // An empty tag does not count: the whole key is hashed.
        #expect(RedisHashSlot.slot(of: "foo{}{bar}".utf8) == RedisHashSlot.crc16("foo{}{bar}".utf8) & 0x3FFF)
        // The tag runs from the first `{` to the next `}`.
        #expect(RedisHashSlot.slot(of: "foo{{bar}}zap".utf8) == RedisHashSlot.crc16("{bar".utf8) & 0x3FFF)
        #expect(RedisCommand.get("{user1000}.following").slot == RedisHashSlot.slot(of: "user1000".utf8))
        #expect(RedisCommand.ping.slot == nil)
        let cluster = try SharedRedisCluster.cluster()
        for key in ["123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "a{b}c", "{}", "", "ключ"] {
            let server = try await blocking { try cluster.nodes[0].cli(["CLUSTER", "KEYSLOT", key]) }
            #expect(Int(server) == Int(RedisHashSlot.slot(of: key.utf8)), "slot of \(key)")
            #expect(redisKeySlot(key) == Int(RedisHashSlot.slot(of: key.utf8)), "slot of \(key)")
        }
    }

    @Test("CLUSTER SHARDS and SLOTS replies: masters only, unknown hosts are the answering node's")
    func topologyParsing() throws {
        func node(_ fields: [(String, RESPValue)]) -> RESPValue {
            .map(fields.map { RESPPair(key: .bulkString(ByteBuffer(string: $0.0)), value: $0.1) })
        }
        func text(_ string: String) -> RESPValue { .bulkString(ByteBuffer(string: string)) }
        let shards = RESPValue.array([
            node([
                ("slots", .array([.integer(0), .integer(99), .integer(200), .integer(16383)])),
                ("nodes", .array([
                    node([("ip", text("10.0.0.2")), ("endpoint", text("10.0.0.2")), ("port", .integer(7001)), ("role", text("replica"))]),
                    node([("ip", text("")), ("endpoint", text("?")), ("port", .integer(7000)), ("tls-port", .integer(8000)), ("role", text("master"))]),
                ])),
            ]),
            node([
                ("slots", .array([.integer(100), .integer(199)])),
                ("nodes", .array([node([("ip", text("10.0.0.3")), ("endpoint", text("db3")), ("port", .integer(7002)), ("role", text("master"))])])),
            ]),
            node([("slots", .array([])), ("nodes", .array([]))]),  // a master without slots
        ])
        let topology = try ClusterTopology(shards: shards, answeringHost: "10.0.0.1", tls: false)
        #expect(topology.masters == [RedisEndpoint(host: "10.0.0.1", port: 7000), RedisEndpoint(host: "db3", port: 7002)])
        #expect(topology.slots[0] == 0 && topology.slots[99] == 0 && topology.slots[16383] == 0)
        #expect(topology.slots[100] == 1 && topology.slots[199] == 1 && topology.assignedSlots == RedisHashSlot.count)
        let tls = try ClusterTopology(shards: shards, answeringHost: "10.0.0.1", tls: true)
        #expect(tls.masters[0] == RedisEndpoint(host: "10.0.0.1", port: 8000))

        let slots = RESPValue.array([
            .array([.integer(0), .integer(8191), .array([text(""), .integer(7000), text("id1")]), .array([text("10.0.0.9"), .integer(7009)])]),
            .array([.integer(8192), .integer(16383), .array([text("10.0.0.2"), .integer(7001), text("id2")])]),
        ])
        let fromSlots = try ClusterTopology(slots: slots, answeringHost: "10.0.0.1")
        #expect(fromSlots.masters == [RedisEndpoint(host: "10.0.0.1", port: 7000), RedisEndpoint(host: "10.0.0.2", port: 7001)])
        #expect(fromSlots.slots[8191] == 0 && fromSlots.slots[8192] == 1)

        #expect(throws: RedisError.self) {
            try ClusterTopology(slots: .array([.array([.integer(5), .integer(16384), .array([text("h"), .integer(1)])])]),
                                answeringHost: "h")
        }
        #expect(throws: RedisError.self) { try ClusterTopology(shards: .integer(1), answeringHost: "h", tls: false) }

        // A master whose every slot a later range took gets no pool; the indices stay dense.
        let overwritten = RESPValue.array([
            .array([.integer(0), .integer(99), .array([text("10.0.0.5"), .integer(7005)])]),
            .array([.integer(0), .integer(16383), .array([text("10.0.0.6"), .integer(7006)])]),
        ])
        var shadowed = try ClusterTopology(slots: overwritten, answeringHost: "h")
        shadowed.dropMastersWithoutSlots()
        #expect(shadowed.masters == [RedisEndpoint(host: "10.0.0.6", port: 7006)])
        #expect(shadowed.slots.allSatisfy { $0 == 0 })
        // A hostile reply naming more masters than there are slots is refused (their indices would not fit).
        let crowded = RESPValue.array((0...RedisHashSlot.count).map { index in
            .array([.integer(0), .integer(0), .array([text("10.1.\(index / 256).\(index % 256)"), .integer(7000)])])
        })
        #expect(throws: RedisError.self) { try ClusterTopology(slots: crowded, answeringHost: "h") }
    }

    @Test("discovery from any one seed finds the same masters; a dead seed is skipped")
    func discovery() async throws {
        let cluster = try SharedRedisCluster.cluster()
        let all = Set(cluster.nodes.map(endpoint(of:)))
        var maps: [[UInt16]] = []
        for node in cluster.nodes {
            let client = try RedisClusterClient(clusterConfiguration([node]))
            try await client.refreshTopology()
            #expect(Set(client.masters) == all)
            maps.append(client.routing.withLock { routing in
                routing.slots.map { $0 == ClusterTopology.unassigned ? 0 : UInt16(routing.nodes[Int($0)].endpoint.port) }
            })
            #expect(client.statistics.topologyRefreshes >= 1)
            await client.shutdown()
        }
        #expect(Set(maps).count == 1, "every seed reports the same slot map")
        #expect(maps.first?.count == RedisHashSlot.count)
        #expect(maps.first?.contains(0) == false, "every slot has an owner")

        // CLUSTER SLOTS (the fallback for servers before Redis 7) describes the same map as CLUSTER SHARDS.
        let probe = try RedisClusterClient(clusterConfiguration([cluster.nodes[0]]))
        let shards = try ClusterTopology(shards: try await probe.send(RedisCommand("CLUSTER", ["SHARDS"])),
                                         answeringHost: "127.0.0.1", tls: false)
        let slots = try ClusterTopology(slots: try await probe.send(RedisCommand("CLUSTER", ["SLOTS"])),
                                        answeringHost: "127.0.0.1")
        #expect(Set(shards.masters) == all && Set(slots.masters) == all)
        #expect(shards.slots.map { shards.masters[Int($0)] } == slots.slots.map { slots.masters[Int($0)] })
        await probe.shutdown()

        // A seed nothing listens on comes first: the next seed answers.
        let deadPort = try freeLoopbackPort()
        let client = try RedisClusterClient(clusterConfiguration([cluster.nodes[1]]) {
            $0.endpoints.insert(RedisEndpoint(host: "127.0.0.1", port: deadPort), at: 0)
        })
        try await client.set("seeded", Array("yes".utf8))
        #expect(try await client.get("seeded").map { String(buffer: $0) } == "yes")
        #expect(Set(client.masters) == all)
        await client.shutdown()

        // No seed answers: the command fails, and says why.
        let lost = try RedisClusterClient(clusterConfiguration([]) {
            $0.endpoints = [RedisEndpoint(host: "127.0.0.1", port: deadPort)]
        })
        let unreachable = await #expect(throws: RedisError.self) { try await lost.get("x") }
        #expect(unreachable?.code == .connectFailed)
        await lost.shutdown()
        let afterShutdown = await #expect(throws: RedisError.self) { try await lost.get("x") }
        #expect(afterShutdown?.code == .shutDown)
    }

    @Test("keys across every slot go to their owners; a batch spanning every node keeps its order")
    func routingAndBatch() async throws {
        let cluster = try SharedRedisCluster.cluster()
        let client = try RedisClusterClient(clusterConfiguration(cluster.nodes))
        defer { Task { await client.shutdown() } }
        try await client.refreshTopology()
        // One key in every 8th slot (2048 keys), set and read back from 16 tasks.
        let tags = hashTags(for: Array(stride(from: 0, to: RedisHashSlot.count, by: 8)))
        let keys = tags.sorted { $0.key < $1.key }.map { "{\($0.value)}:route" }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for part in 0..<16 {
                group.addTask {
                    for key in keys[(part * keys.count / 16)..<((part + 1) * keys.count / 16)] {
                        try await client.set(key, Array("\(key):1".utf8))
                        let value = try await client.get(key).map { String(buffer: $0) }
                        #expect(value == "\(key):1")
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(client.statistics.movedRedirections == 0, "a fresh slot map routes every key to its owner")
        for node in cluster.nodes {
            let size = try await blocking { try node.cli(["DBSIZE"]) }
            #expect((Int(size) ?? 0) > 0, "\(node.endpointDescription) holds keys")
        }

        // A batch over all nodes: reads, writes, a keyless PING, an error reply — in order.
        var commands: [RedisCommand] = []
        for (index, key) in keys.enumerated() where index % 4 == 0 {
            commands.append(.get(key))
            commands.append(.set(key, Array("\(key):2".utf8)))
            commands.append(.get(key))
        }
        commands.append(.ping)
        commands.append(RedisCommand("INCR", [.string(keys[0])], keyIndices: [0]))
        let results = try await client.send(batch: commands)
        #expect(results.count == commands.count)
        for (index, key) in keys.enumerated() where index % 4 == 0 {
            let base = index / 4 * 3
            #expect(try results[base].get().string == "\(key):1")
            #expect(try results[base + 1].get() == .simpleString("OK"))
            #expect(try results[base + 2].get().string == "\(key):2")
        }
        #expect(try results[results.count - 2].get() == .simpleString("PONG"))
        guard case .failure(let error) = results[results.count - 1] else {
            Issue.record("INCR of a string succeeded")
            return
        }
        #expect(error.code == .server)
        #expect(try await client.send(batch: []).isEmpty)
    }

    @Test("a live reshard: writers and readers of the moving slots see no failure and no stale value")
    func liveReshard() async throws {
        let cluster = try SharedRedisCluster.cluster()
        let (source, destination) = try await blocking { () -> (RedisServerProcess, RedisServerProcess) in
            // The master with the most slots gives to the next one.
            let sizes = try cluster.nodes.map { node in try cluster.ownedSlots(of: node).reduce(0) { $0 + $1.count } }
            let index = sizes.indices.max { sizes[$0] < sizes[$1] }!
            return (cluster.nodes[index], cluster.nodes[(index + 1) % cluster.nodes.count])
        }
        let moving = 120
        let slots = Array(try await blocking { try cluster.ownedSlots(of: source) }.joined().prefix(moving))
        let tags = hashTags(for: slots)
        // 8 writers, each the only writer of its keys (3 per slot).
        let keys = slots.flatMap { slot in (0..<3).map { "{\(tags[slot]!)}:live:\($0)" } }
        let writers = 8
        let client = try RedisClusterClient(clusterConfiguration([cluster.nodes[0]]))
        defer { Task { await client.shutdown() } }
        for key in keys { try await client.set(key, Array("\(key):0".utf8)) }

        let reshard = try await blocking { try cluster.startReshard(from: source, to: destination, slots: moving, pipeline: 5) }
        let progress = ReshardProgress()
        async let finished: Void = {
            defer { progress.done.store(true, ordering: .relaxed) }
            try await reshard.finished(timeout: .seconds(40))
        }()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for writer in 0..<writers {
                let mine = keys.enumerated().filter { $0.offset % writers == writer }.map(\.element)
                group.addTask {
                    var version = 0
                    var roundsAfterDone = 0
                    while roundsAfterDone < 2 {
                        if progress.done.load(ordering: .relaxed) { roundsAfterDone += 1 }
                        version += 1
                        for key in mine {
                            let expected = "\(key):\(version)"
                            try await client.set(key, Array(expected.utf8))
                            let read = try await client.get(key).map { String(buffer: $0) }
                            #expect(read == expected, "read after write")
                            progress.operations.add(2, ordering: .relaxed)
                            if !progress.done.load(ordering: .relaxed) { progress.duringReshard.add(2, ordering: .relaxed) }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        try await finished
        let statistics = client.statistics
        #expect(statistics.movedRedirections + statistics.askRedirections > 0, "\(statistics)")
        #expect(progress.operations.load(ordering: .relaxed) > keys.count * 4)
        #expect(progress.duringReshard.load(ordering: .relaxed) > 0, "the commands overlapped the reshard")
        // The client's map now matches the cluster's, and every key reads back its last version.
        try await client.refreshTopology()
        let owner = endpoint(of: destination)
        #expect(client.routing.withLock { routing in slots.allSatisfy { routing.nodes[Int(routing.slots[$0])].endpoint == owner } })
        let fresh = try RedisClusterClient(clusterConfiguration([cluster.nodes[2]]))
        defer { Task { await fresh.shutdown() } }
        let reads = try await fresh.send(batch: keys.map { .get($0) })
        for (key, read) in zip(keys, reads) {
            let value = try read.get().string
            #expect(value?.hasPrefix("\(key):") == true, "\(key) = \(value ?? "nil")")
        }
    }

    @Test("a slot half migrated: ASK is followed without changing the map; then MOVED")
    func askThenMoved() async throws {
        let cluster = try SharedRedisCluster.cluster()
        let slot = 9000
        let tag = hashTags(for: [slot])[slot]!
        let keys = (0..<10).map { "{\(tag)}:ask:\($0)" }
        let client = try RedisClusterClient(clusterConfiguration(cluster.nodes))
        defer { Task { await client.shutdown() } }
        for key in keys { try await client.set(key, Array("\(key):v".utf8)) }
        let source = try #require(try await blocking { try cluster.slotOwner(slot) })
        let destination = try #require(cluster.nodes.first { $0 !== source })
        try await blocking { try cluster.beginSlotMigration(slot, from: source, to: destination) }
        // Half the keys move; the slot stays MIGRATING / IMPORTING.
        let moved = Array(keys.prefix(5))
        _ = try await blocking {
            try source.cli(["MIGRATE", destination.host, String(destination.port), "", "0", "10000", "KEYS"] + moved)
        }
        let before = client.statistics
        for key in keys {
            #expect(try await client.get(key).map { String(buffer: $0) } == "\(key):v")
        }
        // A new key of the slot: the source does not have it, so it is created on the destination.
        try await client.set("{\(tag)}:ask:new", Array("created".utf8))
        #expect(try await client.get("{\(tag)}:ask:new").map { String(buffer: $0) } == "created")
        let during = client.statistics
        #expect(during.askRedirections - before.askRedirections == UInt64(moved.count) + 2)
        #expect(during.movedRedirections == before.movedRedirections)
        #expect(client.routing.withLock { $0.nodes[Int($0.slots[slot])].endpoint } == endpoint(of: source))
        // In a batch too.
        let batch = try await client.send(batch: keys.map { .get($0) })
        #expect(batch.map { try? $0.get().string } == keys.map { Optional("\($0):v") })

        // The migration ends: the slot belongs to the destination, and the client follows MOVED once.
        try await blocking {
            try cluster.moveKeys(inSlot: slot, from: source, to: destination)
            try cluster.finishSlotMigration(slot, to: destination)
        }
        let movedBefore = client.statistics.movedRedirections
        for key in keys {
            #expect(try await client.get(key).map { String(buffer: $0) } == "\(key):v")
        }
        #expect(client.statistics.movedRedirections - movedBefore == 1)
        #expect(client.routing.withLock { $0.nodes[Int($0.slots[slot])].endpoint } == endpoint(of: destination))
    }

    @Test("a dead master: its slots fail fast, the others keep working, and it comes back")
    func deadMaster() async throws {
        let cluster = try SharedRedisCluster.cluster()
        let client = try RedisClusterClient(clusterConfiguration(cluster.nodes))
        defer { Task { await client.shutdown() } }
        try await client.refreshTopology()
        let victim = cluster.nodes[2]
        let victimEndpoint = endpoint(of: victim)
        let tags = hashTags(for: Array(stride(from: 3, to: RedisHashSlot.count, by: 64)))
        let keys = tags.values.sorted().map { "{\($0)}:dead" }
        for key in keys { try await client.set(key, Array("\(key):1".utf8)) }
        let owners = client.routing.withLock { routing in
            keys.map { routing.nodes[Int(routing.slots[Int(RedisHashSlot.slot(of: $0.utf8))])].endpoint }
        }
        #expect(owners.contains(victimEndpoint))

        try await blocking { victim.kill() }
        var failed = 0
        var slowest = Duration.zero
        for (key, owner) in zip(keys, owners) {
            let start = ContinuousClock.now
            do {
                let value = try await client.get(key).map { String(buffer: $0) }
                #expect(owner != victimEndpoint, "a key of the dead node was read")
                #expect(value == "\(key):1")
                try await client.set(key, Array("\(key):2".utf8))
            } catch let error as RedisError {
                #expect(owner == victimEndpoint, "\(key) on \(owner): \(error)")
                #expect([RedisError.Code.connectFailed, .circuitOpen, .connectionClosed].contains(error.code), "\(error)")
                slowest = max(slowest, start.duration(to: .now))
                failed += 1
            }
        }
        #expect(failed == owners.filter { $0 == victimEndpoint }.count)
        #expect(slowest < .milliseconds(500), "a call to the dead node took \(slowest)")
        // The breaker opens after its threshold of failed reconnects (on the backoff schedule, so perhaps
        // after the loop above); from then on a call to the dead node is rejected without a connect.
        try await eventually(timeout: .seconds(10)) { client.isBreakerOpen(for: victimEndpoint) }
        let rejectionsBefore = client.statistics.breakerRejections
        let deadKey = try #require(zip(keys, owners).first { $0.1 == victimEndpoint }?.0)
        await #expect(throws: RedisError.self) { _ = try await client.get(deadKey) }
        #expect(client.statistics.breakerRejections > rejectionsBefore)
        // A batch over every node: the live nodes' entries succeed, the dead node's fail.
        let results = try await client.send(batch: keys.map { .get($0) })
        for ((key, owner), result) in zip(zip(keys, owners), results) {
            switch result {
            case .success(let value):
                #expect(owner != victimEndpoint)
                #expect(value.string == "\(key):2")
            case .failure(let error):
                #expect(owner == victimEndpoint, "\(error)")
            }
        }

        // Restarted (same node id, data lost): the pool reconnects, the slots work again.
        try await blocking {
            try victim.restart()
            try cluster.waitUntilStable()
        }
        let victimKey = try #require(zip(keys, owners).first { $0.1 == victimEndpoint }?.0)
        try await eventually(timeout: .seconds(10)) {
            (try? await client.set(victimKey, Array("back".utf8))) == true
        }
        #expect(try await client.get(victimKey).map { String(buffer: $0) } == "back")
        #expect(!client.isBreakerOpen(for: victimEndpoint))
    }
}
