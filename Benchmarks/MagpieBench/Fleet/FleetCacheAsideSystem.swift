import MagpieRedis
import NIOCore
import Synchronization

/// `redis-cache-aside`: the async cache-aside a careful user writes on a `RedisClient`, from the same
/// tasks. A read is `GET`; on a miss, the key's one load in this process (`FleetFlights`: concurrent
/// misses of the key await it) calls the origin and `SET`s its value, then every caller gets it. A set
/// is `SET`, a removal `DEL`. Nothing is kept in the process: every read is a round trip.
final class FleetCacheAsideSystem: FleetSystem {
    let client: RedisClient
    let namespace: String
    let origin: FleetOrigin
    private let flights = FleetFlights<[UInt8]>()
    private let gets = Atomic<Int>(0)

    init(redis: RedisConfiguration, namespace: String, origin: FleetOrigin) throws {
        client = try RedisClient(redis)
        self.namespace = namespace
        self.origin = origin
    }

    func read(_ name: String, key: Int) async throws -> FleetRead {
        let redisKey = namespace + name
        gets.add(1, ordering: .relaxed)
        if let found = try await client.get(redisKey) {
            return FleetRead(value: Array(found.readableBytesView), source: .remote)
        }
        let (client, origin) = (client, origin)
        let value = try await flights.run(redisKey) {
            let value = await origin.value(key)
            try await client.set(redisKey, value)
            return value
        }
        return FleetRead(value: value, source: .origin)
    }

    func set(_ name: String, _ value: [UInt8]) async throws {
        try await client.set(namespace + name, value)
    }

    func remove(_ name: String) async throws {
        _ = try await client.send(RedisCommand("DEL", [.string(namespace + name)], keyIndices: [0]))
    }

    func remoteReads() -> FleetRemoteReads { FleetRemoteReads(total: gets.load(ordering: .relaxed)) }

    func close() async { await client.shutdown() }
}
