import MagpieRedis
import NIOCore
import Synchronization

/// `local-pubsub`: the pattern users build by hand, and FusionCache (memory + distributed cache +
/// backplane) or Redisson (`RLocalCachedMap`) give them: a local map in front of Redis, kept coherent by
/// invalidation messages on one pub/sub channel.
///
/// - A read is the local map's copy; else (one load per key per process, `FleetFlights`) Redis `GET`,
///   kept locally; on a Redis miss the origin's value, `SET` in Redis (a fill publishes nothing: no
///   instance holds the key) and kept locally.
/// - A set is `SET key value` and `PUBLISH <channel> <origin>|<key>`, pipelined in one write (a careful
///   user's one round trip), then the value kept locally; a removal drops the local copy, then `DEL` and
///   `PUBLISH`, pipelined. A failed write drops the local copy too.
/// - One `RedisSubscriber` per instance receives the channel; a message drops the key's local copy. The
///   message carries its writer's tag, and the writer skips its own (as FusionCache's and Redisson's
///   messages carry their instance id); `--pubsub-echo` drops it instead (the naive version, whose writer
///   then reads its own write back from Redis).
/// - The subscription lost (its connection killed, Redis down) and restored: the local map is cleared at
///   both (Redisson's `ReconnectionStrategy.CLEAR`), as messages in between were missed.
///
/// What it does not do, as users do not: nothing bounds how long a copy is served when a message is lost
/// while the connection stays up (`--drop-messages`, the fault run), and a read that fetched a value just
/// before a write's message arrived keeps the old value after it (the message found nothing to drop).
/// Both are counted by the judge as stale reads once the bound has passed.
final class FleetLocalPubSubSystem: FleetSystem {
    let client: RedisClient
    let subscriber: RedisSubscriber
    let local: FleetLocalMap
    let namespace: String
    let channel: String
    let origin: FleetOrigin
    /// This instance's tag in the messages it publishes.
    let tag: [UInt8]
    let skipsOwnMessages: Bool
    private let flights = FleetFlights<FleetRead>()
    private let counters = Counters()
    private let listener = Mutex<Task<Void, Never>?>(nil)

    final class Counters: Sendable {
        let gets = Atomic<Int>(0)
        let messages = Atomic<Int>(0)
        let ownSkipped = Atomic<Int>(0)
        let dropped = Atomic<Int>(0)
        let losses = Atomic<Int>(0)
        let connected = Atomic<Bool>(false)
    }

    /// A system subscribed to its channel (returns once Redis confirmed the subscription).
    /// - Parameters:
    ///   - dropMessages: the fraction (0…1) of received messages the instance discards (a fault).
    ///   - onInvalidation: called with each key a message dropped here (the lag probes).
    static func start(
        redis: RedisConfiguration, namespace: String, origin: FleetOrigin, budget: Int, instance: Int,
        skipsOwnMessages: Bool,
        dropMessages: Double, seed: UInt64, onInvalidation: (@Sendable ([UInt8]) -> Void)?
    ) async throws -> FleetLocalPubSubSystem {
        let system = try FleetLocalPubSubSystem(
            redis: redis, namespace: namespace, origin: origin, budget: budget, instance: instance,
            skipsOwnMessages: skipsOwnMessages)
        do {
            let stream = try await system.subscriber.subscribe(to: [system.channel])
            system.counters.connected.store(true, ordering: .releasing)
            let task = Task { [system] in
                var random = splitmix64(seed)
                for await event in stream {
                    switch event {
                    case .message(let message):
                        let drop: Bool
                        if dropMessages > 0 {
                            random = splitmix64(random)
                            drop = Double(random >> 11) * (1.0 / 9_007_199_254_740_992.0) < dropMessages
                        } else {
                            drop = false
                        }
                        system.received(message.payload, dropped: drop, onInvalidation: onInvalidation)
                    case .lost:
                        system.counters.connected.store(false, ordering: .releasing)
                        system.counters.losses.add(1, ordering: .relaxed)
                        system.local.removeAll()
                    case .restored:
                        system.local.removeAll()
                        system.counters.connected.store(true, ordering: .releasing)
                    }
                }
            }
            system.listener.withLock { $0 = task }
            return system
        } catch {
            await system.close()
            throw error
        }
    }

    private init(
        redis: RedisConfiguration, namespace: String, origin: FleetOrigin, budget: Int, instance: Int,
        skipsOwnMessages: Bool
    ) throws {
        client = try RedisClient(redis)
        subscriber = client.makeSubscriber()
        local = FleetLocalMap(budget: budget)
        self.namespace = namespace
        channel = namespace + "invalidations"
        self.origin = origin
        tag = Array("w\(instance)".utf8)
        self.skipsOwnMessages = skipsOwnMessages
    }

    /// A message `<tag>|<key>`: the key's local copy dropped, unless the message is this instance's own
    /// (and it skips those) or the fault drops it.
    private func received(_ payload: ByteBuffer, dropped: Bool, onInvalidation: (@Sendable ([UInt8]) -> Void)?) {
        counters.messages.add(1, ordering: .relaxed)
        let bytes = Array(payload.readableBytesView)
        guard let bar = bytes.firstIndex(of: UInt8(ascii: "|")) else { return }
        if skipsOwnMessages, bytes[..<bar].elementsEqual(tag) {
            counters.ownSkipped.add(1, ordering: .relaxed)
            return
        }
        if dropped {
            counters.dropped.add(1, ordering: .relaxed)
            return
        }
        let name = Array(bytes[(bar + 1)...])
        local.remove(String(decoding: name, as: UTF8.self))
        onInvalidation?(name)
    }

    private func message(_ name: String) -> RedisCommand {
        RedisCommand("PUBLISH", [.string(channel), .bytes(tag + [UInt8(ascii: "|")] + Array(name.utf8))])
    }

    func read(_ name: String, key: Int) async throws -> FleetRead {
        if let value = local.value(name) { return FleetRead(value: value, source: .memory) }
        counters.gets.add(1, ordering: .relaxed)
        let (client, origin, local) = (client, origin, local)
        let redisKey = namespace + name
        return try await flights.run(name) {
            if let found = try await client.get(redisKey) {
                let value = Array(found.readableBytesView)
                local.set(name, value)
                return FleetRead(value: value, source: .remote)
            }
            let value = await origin.value(key)
            try await client.set(redisKey, value)
            local.set(name, value)
            return FleetRead(value: value, source: .origin)
        }
    }

    func set(_ name: String, _ value: [UInt8]) async throws {
        do {
            for reply in try await client.send(batch: [.set(namespace + name, value), message(name)]) {
                _ = try reply.get()
            }
        } catch {
            local.remove(name)
            throw error
        }
        local.set(name, value)
    }

    func remove(_ name: String) async throws {
        local.remove(name)
        for reply in try await client.send(batch: [.del([namespace + name]), message(name)]) { _ = try reply.get() }
    }

    func answersLocally(_ name: String) async -> Bool? { local.contains(name) }

    func remoteReads() -> FleetRemoteReads { FleetRemoteReads(total: counters.gets.load(ordering: .relaxed)) }

    var feedHealth: FleetFeedHealth? { FleetFeedHealth(confirmed: counters.connected.load(ordering: .acquiring), delivered: true) }

    func report() -> [String: JSONValue] {
        [
            "messages_received": .int(counters.messages.load(ordering: .relaxed)),
            "own_messages_skipped": .int(counters.ownSkipped.load(ordering: .relaxed)),
            "messages_dropped": .int(counters.dropped.load(ordering: .relaxed)),
            "subscription_losses": .int(counters.losses.load(ordering: .relaxed)),
            "local_entries": .int(local.count),
        ]
    }

    func close() async {
        listener.withLock { $0?.cancel() }
        await subscriber.close()
        await client.shutdown()
    }
}
