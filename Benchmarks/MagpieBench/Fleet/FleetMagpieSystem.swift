import Foundation
import Magpie
import MagpieRedis
import Synchronization

/// `magpie-fleet` (a `RedisRemoteStore` behind the cache) and `local-uncoherent` (no remote tier): Magpie
/// as services call it. A read is the loader API, whose load is the origin's; a set and a removal are
/// `cache.async`'s. The thread callers use the synchronous forms (`loadValue`, `set`, `removeValue`).
final class FleetMagpieSystem: FleetSystem {
    let cache: Cache
    let store: RedisRemoteStore?
    let origin: FleetOrigin
    /// The fraction of change messages the store was configured to drop (its test hook).
    let droppedChangeMessages: Double

    /// - Parameters:
    ///   - remote: the store's Redis configuration and namespace; nil: no remote tier.
    ///   - onInvalidation: called with each key the store reported changed (the lag probes).
    init(
        remote: (redis: RedisConfiguration, namespace: String)?, boundMs: Int, dropMessages: Double,
        origin: FleetOrigin,
        onInvalidation: (@Sendable ([UInt8]) -> Void)?
    ) throws {
        self.origin = origin
        var configuration = Cache.Configuration(memoryBudget: FleetInstance.memoryBudget)
        configuration.metrics = nil
        if let remote {
            var storeConfiguration = RedisRemoteStore.Configuration(redis: remote.redis, namespace: remote.namespace)
            storeConfiguration.dropChangeMessages = dropMessages
            let store = try RedisRemoteStore(storeConfiguration)
            var options = RemoteTierOptions(store: store, maxDisconnectedStaleness: .milliseconds(boundMs))
            options.onInvalidation = onInvalidation
            configuration.remote = options
            self.store = store
            droppedChangeMessages = dropMessages
        } else {
            store = nil
            droppedChangeMessages = 0
        }
        cache = try Cache(configuration)
    }

    func read(_ name: String, key: Int) async throws -> FleetRead {
        let origin = origin
        let value = try await cache.value(forKey: name) { await origin.value(key) }
        return FleetRead(value: value, source: .unknown)
    }

    func set(_ name: String, _ value: [UInt8]) async throws {
        try await cache.async.set(value, forKey: name)
    }

    func remove(_ name: String) async throws {
        _ = try await cache.async.removeValue(forKey: name)
    }

    func readBlocking(_ name: String, key: Int) throws -> FleetRead {
        let origin = origin
        return FleetRead(value: try cache.loadValue(forKey: name) { origin.valueBlocking(key) }, source: .unknown)
    }

    func setBlocking(_ name: String, _ value: [UInt8]) throws {
        try cache.set(value, forKey: name)
    }

    func removeBlocking(_ name: String) throws {
        try cache.removeValue(forKey: name)
    }

    /// The own-write probes' look-ups (`cache.async.lookup`) that went to Redis: a remote hit, or nothing
    /// found. Left out of `remoteReads()`, which counts the callers' reads.
    private let probeRemoteHits = Atomic<Int>(0)
    private let probeRemoteMisses = Atomic<Int>(0)

    func answersLocally(_ name: String) async -> Bool? {
        guard store != nil else { return nil }
        guard let hit = try? await cache.async.lookup(name) else {
            probeRemoteMisses.add(1, ordering: .relaxed)
            return false
        }
        guard hit.tier == .remote else { return true }
        probeRemoteHits.add(1, ordering: .relaxed)
        return false
    }

    func remoteReads() -> FleetRemoteReads {
        guard let remote = cache.statistics.remote else { return FleetRemoteReads(total: 0) }
        let hits = Int(remote.readHits) - probeRemoteHits.load(ordering: .relaxed)
        let misses = Int(remote.readMisses) - probeRemoteMisses.load(ordering: .relaxed)
        return FleetRemoteReads(total: hits + misses, hits: hits, misses: misses, unserved: Int(remote.unservedCopies))
    }

    var feedHealth: FleetFeedHealth? {
        // Coherent: the feed confirmed (a heartbeat every 100 ms), and every instance's owed writes
        // landed (the fleet's watermark runs 100-250 ms behind while all is well: each instance
        // publishes its own with its heartbeat).
        guard let remote = cache.statistics.remote else { return nil }
        return FleetFeedHealth(confirmed: remote.unconfirmedMilliseconds < 200, delivered: remote.undeliveredMilliseconds < 350)
    }

    func traceLine() -> String? {
        guard let r = cache.statistics.remote else { return nil }
        return "unconfirmed \(r.unconfirmedMilliseconds) ms, undelivered \(r.undeliveredMilliseconds) ms, fails fast \(r.failsFast), "
            + "owed \(r.owedRemovals), replayed \(r.replayedRemovals), errors \(r.errors), remote reads \(r.readHits)/\(r.readMisses), "
            + "confirmations \(r.confirmations), gaps \(r.sequenceGaps), partition losses \(r.partitionLosses), "
            + "short partitions \(r.shortPartitions), invalidations \(r.invalidations)"
    }

    func report() -> [String: JSONValue] {
        guard let remote = cache.statistics.remote else { return [:] }
        // Over the whole run, the warm-up included: what the store answered, and how much of it the local
        // tiers could not keep (a change or a write of the key overlapped the fetch).
        return [
            "remote_errors": .int(Int(remote.errors)), "invalidations": .int(Int(remote.invalidations)),
            "epoch_bumps": .int(Int(remote.epochBumps)), "owed_removals": .int(remote.owedRemovals),
            "replayed_removals": .int(Int(remote.replayedRemovals)), "store_hits": .int(Int(remote.hits)),
            "unkept": .int(Int(remote.unkept)), "withheld": .int(Int(remote.withheld)),
            "fenced": .int(Int(remote.fenced)),
            "leases": .int(Int(remote.leasesAcquired)), "lease_waits": .int(Int(remote.leaseWaits)),
            "shared_loads": .int(Int(remote.sharedLoads)),
            "copies_dropped": .int(Int(remote.copiesDropped)), "pushes_applied": .int(Int(remote.pushesApplied)),
            "own_messages": .int(Int(remote.ownMessages)), "stale_messages": .int(Int(remote.staleMessages)),
            "sequence_gaps": .int(Int(remote.sequenceGaps)), "partition_losses": .int(Int(remote.partitionLosses)),
            "sequence_restarts": .int(Int(remote.sequenceRestarts)),
            "short_partitions": .int(Int(remote.shortPartitions)),
        ]
    }

    func close() async {
        try? cache.close()
        if let store { await store.shutdown() }
    }
}
