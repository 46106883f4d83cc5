import Foundation
import MagpieRedis
import MagpieTestSupport

// The fault run (`fleet --fault`), on the private redis-server, per system while it is measured:
//
//    6 %  every subscriber connection killed (`CLIENT KILL TYPE pubsub`): the invalidation feeds
//         reconnect (Magpie's, when it is a pub/sub subscriber; the hand-built pattern's)
//   20 %  Redis killed (SIGKILL), restarted 2 s later (append-only file, fsync always: it keeps every
//         write it acknowledged); its recovery runs from when the server serves again (`PONG`, its
//         append-only file read back: `loading_seconds` after it first answered)
//   50 %  Redis paused (SIGSTOP) for 1.5 s
//   75 %  Redis evicting: `maxmemory` set with `allkeys-lru` for 1.5 s to the memory it used less three
//         quarters of its data set (`FaultTimeline.evictingLimit`), so that it evicts values, fences,
//         tombstones, sequence counters, heartbeats, whatever the policy picks, then set back; the limit
//         and the keys it evicted in the window are reported
//
// and, through the whole run, `--drop-messages` of the change messages each instance receives discarded
// (the hand-built pattern's subscriber drops them; Magpie's store, through the library's test hook). Each
// fault's window runs from its start to `FaultTimeline.grace` after Redis is back (after the kill, for the
// subscriber connections); reads and errors are reported per window. `--faults` runs only
// those named (to study one alone), each at its place.

extension FleetScenario {
    /// Injects the faults into `server` at their instants of the run `start…start + duration`; after each,
    /// the time until every worker's feed is healthy again (`feeds`: the systems that have one; the others
    /// are not waited for, so that their pause too falls inside the run). The instants go to the shared
    /// table too: the workers tally what overlapped the pause apart, and leave the own-write probes that
    /// overlapped a fault out. Samples the server's counters just before killing it (`sampler`).
    func injectFaults(
        _ server: RedisServerProcess, table: FleetShared, start: Int64, duration: Int64, feeds: Bool,
        sampler: FleetRedisSampler
    ) async throws -> FaultTimeline {
        var timeline = FaultTimeline()
        func sleep(until instant: Int64) async throws {
            let remaining = instant - monotonicNanoseconds()
            if remaining > 0 { try await Task.sleep(for: .nanoseconds(remaining)) }
        }
        func recovered(after back: Int64) async throws -> FaultTimeline.Recovery {
            guard feeds else { return FaultTimeline.Recovery(healthy: 0, confirmed: 0, delivered: 0) }
            // 10 s at most; and not past the run's end, after which the workers no longer report (10
            // then means: not recovered within the run). Each part of the feed's health (FleetFeedHealth)
            // is timed apart too: the instant every worker was first seen with it after `back`.
            let deadline = min(back + 10_000_000_000, start + duration + 100_000_000)
            var parts: [Double?] = [nil, nil, nil]
            while monotonicNanoseconds() < deadline {
                for part in 0..<3 where parts[part] == nil {
                    let statuses = (0..<options.workers).map { table.load(table.statusWord(worker: $0) + part) }
                    if statuses.allSatisfy({ $0 > back }) { parts[part] = Double((statuses.max() ?? back) - back) / 1e9 }
                }
                if parts[0] != nil { break }
                try await Task.sleep(for: .milliseconds(5))
            }
            return FaultTimeline.Recovery(healthy: parts[0] ?? 10, confirmed: parts[1] ?? 10, delivered: parts[2] ?? 10)
        }
        let chosen = Set(options.faults)
        if chosen.contains(.pubsub) {
            try await sleep(until: start + duration * 6 / 100)
            let killed = monotonicNanoseconds()
            table.store(table.pubsubKilledWord, killed)
            let clients = try await killSubscribers(sampler)
            timeline.add(.pubsubKilled, began: killed, ended: killed, recovery: try await recovered(after: killed))
            timeline.pubsubClientsKilled = clients
        }
        if chosen.contains(.kill) {
            try await sleep(until: start + duration * 20 / 100)
            timeline.beforeKill = await sampler.sample()
            let down = monotonicNanoseconds()
            table.store(table.downBeganWord, down)
            try await onOwnThread { server.kill() }
            try await Task.sleep(for: .seconds(2))
            try await onOwnThread { try server.restart() }
            let back = monotonicNanoseconds()
            table.store(table.downEndedWord, back)
            // The restarted server answers at once but serves nothing until it has read its append-only
            // file back (`LOADING`): the recovery runs from when it serves, the loading reported apart.
            let serving = try await servingAgain(sampler)
            timeline.add(
                .redisKilled, began: down, ended: back, recovery: try await recovered(after: serving),
                loading: Double(serving - back) / 1e9)
        }
        if chosen.contains(.pause) {
            try await sleep(until: start + duration * 50 / 100)
            let paused = monotonicNanoseconds()
            table.store(table.pauseBeganWord, paused)
            try await onOwnThread { server.pause() }
            try await Task.sleep(for: .milliseconds(1500))
            try await onOwnThread { server.resume() }
            let resumed = monotonicNanoseconds()
            table.store(table.pauseEndedWord, resumed)
            timeline.add(.redisPaused, began: paused, ended: resumed, recovery: try await recovered(after: resumed))
        }
        if chosen.contains(.evict) {
            try await sleep(until: start + duration * 75 / 100)
            let (began, ended, evicted, limit) = try await evict(sampler, table: table)
            (timeline.keysEvicted, timeline.evictingLimit) = (evicted, limit)
            timeline.add(.redisEvicting, began: began, ended: ended, recovery: try await recovered(after: ended))
        }
        return timeline
    }

    /// The eviction window: `maxmemory` set to `FaultTimeline.evictingLimit(usedMemory:dataset:)` with
    /// `allkeys-lru` for 1.5 s, then the server's own settings back (they are put back even when the window
    /// fails midway). Returns when it began and ended (also stored in the shared table), how many keys
    /// Redis evicted meanwhile, and the limit.
    private func evict(_ sampler: FleetRedisSampler, table: FleetShared) async throws -> (Int64, Int64, Int, Int) {
        let maxmemory = try await configValue(sampler, "maxmemory")
        let policy = try await configValue(sampler, "maxmemory-policy")
        let before = try await info(sampler, "stats", "evicted_keys")
        let limit = FaultTimeline.evictingLimit(
            usedMemory: try await info(sampler, "memory", "used_memory"), dataset: try await info(sampler, "memory", "used_memory_dataset"))
        let began = monotonicNanoseconds()
        table.store(table.evictBeganWord, began)
        do {
            try await setConfig(sampler, "maxmemory-policy", "allkeys-lru")
            try await setConfig(sampler, "maxmemory", "\(limit)")
            try await Task.sleep(for: .milliseconds(1500))
        } catch {
            try? await setConfig(sampler, "maxmemory", maxmemory)
            try? await setConfig(sampler, "maxmemory-policy", policy)
            throw error
        }
        try await setConfig(sampler, "maxmemory", maxmemory)
        try await setConfig(sampler, "maxmemory-policy", policy)
        let ended = monotonicNanoseconds()
        table.store(table.evictEndedWord, ended)
        return (began, ended, try await info(sampler, "stats", "evicted_keys") - before, limit)
    }

    private func configValue(_ sampler: FleetRedisSampler, _ name: String) async throws -> String {
        let reply = try await sampler.client.send(RedisCommand("CONFIG", ["GET", .string(name)]))
        // RESP3 replies with a map, RESP2 with a name-value array.
        if case .map(let pairs) = reply, pairs.count == 1, let value = pairs[0].value.string { return value }
        if let pair = reply.arrayValue, pair.count == 2, let value = pair[1].string { return value }
        throw BenchError("CONFIG GET \(name) replied \(reply)")
    }

    private func setConfig(_ sampler: FleetRedisSampler, _ name: String, _ value: String) async throws {
        let reply = try await sampler.client.send(RedisCommand("CONFIG", ["SET", .string(name), .string(value)]))
        guard reply.string == "OK" else { throw BenchError("CONFIG SET \(name) \(value) replied \(reply)") }
    }

    /// The integer `field` of `INFO section` (e.g. `evicted_keys` of `stats`: every key the server evicted
    /// since it started).
    private func info(_ sampler: FleetRedisSampler, _ section: String, _ field: String) async throws -> Int {
        let reply = try await sampler.client.send(RedisCommand("INFO", [.string(section)]))
        for line in (reply.string ?? "").split(whereSeparator: \.isNewline) where line.hasPrefix("\(field):") {
            if let count = Int(line.dropFirst(field.count + 1)) { return count }
        }
        throw BenchError("INFO \(section) has no \(field)")
    }

    /// Polls `PING` until the server answers `PONG` (not `LOADING`); the instant it did.
    private func servingAgain(_ sampler: FleetRedisSampler) async throws -> Int64 {
        let deadline = monotonicNanoseconds() + 30_000_000_000
        while monotonicNanoseconds() < deadline {
            if let reply = try? await sampler.client.send(RedisCommand("PING")), reply.string == "PONG" { return monotonicNanoseconds() }
            try await Task.sleep(for: .milliseconds(5))
        }
        throw BenchError("the restarted redis-server did not serve within 30 s")
    }

    /// `CLIENT KILL TYPE pubsub` on the bench's own connection: how many connections the server killed.
    private func killSubscribers(_ sampler: FleetRedisSampler) async throws -> Int {
        let reply = try await sampler.client.send(RedisCommand("CLIENT", ["KILL", "TYPE", "pubsub"]))
        guard case .integer(let killed) = reply else { throw BenchError("CLIENT KILL replied \(reply)") }
        return Int(killed)
    }
}

/// The faults of a run: when each began and ended, and how long every worker's feed took to be healthy
/// again after each.
struct FaultTimeline {
    enum Kind: String, CaseIterable {
        case pubsubKilled = "pubsub_killed"
        case redisKilled = "redis_killed"
        case redisPaused = "redis_paused"
        case redisEvicting = "redis_evicting"
    }

    struct Window {
        var kind: Kind
        var began: Int64
        var ended: Int64
        var recovery: Recovery
        /// Seconds from the restarted server's first answer to its first `PONG` (the kill only).
        var loading: Double?
    }

    /// Seconds from a fault's end (for the kill: from the restarted server's first `PONG`) until every
    /// worker's feed was seen healthy, and until each of its parts was (`FleetFeedHealth`); 10: not
    /// within the run.
    struct Recovery {
        var healthy: Double
        var confirmed: Double
        var delivered: Double
    }

    var windows: [Window] = []
    /// The server's counters just before it was killed (they restart from zero with it).
    var beforeKill: FleetRedisStats? = nil
    /// What `CLIENT KILL TYPE pubsub` killed.
    var pubsubClientsKilled: Int? = nil
    /// The keys Redis evicted in the eviction window.
    var keysEvicted: Int? = nil
    /// The eviction window's `maxmemory`.
    var evictingLimit: Int? = nil

    /// The eviction window's `maxmemory`: what the server uses less three quarters of its data set, so
    /// that Redis evicts about that much of the keyspace (the fleet's values and its bookkeeping alike)
    /// at any `--keys`, and keeps a quarter as room for the clients' buffers to grow, so that it evicts
    /// rather than refuses writes with `OOM` (with 20 k keys of 256 bytes, about the `maxmemory 2mb` of
    /// #65). At least 1 MiB: below, the server's own overhead does not fit.
    static func evictingLimit(usedMemory: Int, dataset: Int) -> Int {
        max(1 << 20, usedMemory - dataset * 3 / 4)
    }
    /// How long after a fault's end reads may still see its effects (the fault bar: coherence back within
    /// 2 s).
    static let grace: Int64 = 2_000_000_000

    mutating func add(_ kind: Kind, began: Int64, ended: Int64, recovery: Recovery, loading: Double? = nil) {
        windows.append(Window(kind: kind, began: began, ended: ended, recovery: recovery, loading: loading))
    }

    var recoveries: [Double] { windows.map(\.recovery.healthy) }
}
