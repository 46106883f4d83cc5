import Foundation
import MagpieRedis
import MagpieTestSupport

// The fault run (`fleet --fault`), on the private redis-server, per system while it is measured:
//
//   10 %  every subscriber connection killed (`CLIENT KILL TYPE pubsub`): the invalidation feeds
//         reconnect (Magpie's, when it is a pub/sub subscriber; the hand-built pattern's)
//   30 %  Redis killed (SIGKILL), restarted 2 s later (append-only file, fsync always: it keeps every
//         write it acknowledged)
//   65 %  Redis paused (SIGSTOP) for 1.5 s
//
// and, through the whole run, `--drop-messages` of the change messages each instance receives discarded
// (the hand-built pattern's subscriber drops them; Magpie's store, through the library's test hook). Each
// fault's window runs from its start to `FaultTimeline.grace` after Redis is back (after the kill, for the
// subscriber connections); reads and errors are reported per window. `FLEET_FAULT=pubsub|kill|pause` runs
// only that one (to study it alone).

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
        func recovered(after back: Int64) async throws -> Double {
            guard feeds else { return 0 }
            // 10 s at most; and not past the run's end, after which the workers no longer report (10
            // then means: not recovered within the run).
            let deadline = min(back + 10_000_000_000, start + duration + 100_000_000)
            while monotonicNanoseconds() < deadline {
                let statuses = (0..<options.workers).map { table.load(table.statusWord(worker: $0)) }
                if statuses.allSatisfy({ $0 > back }) { return Double((statuses.max() ?? back) - back) / 1e9 }
                try await Task.sleep(for: .milliseconds(5))
            }
            return 10
        }
        let only = ProcessInfo.processInfo.environment["FLEET_FAULT"]
        if only == nil || only == "pubsub" {
            try await sleep(until: start + duration / 10)
            let killed = monotonicNanoseconds()
            table.store(table.pubsubKilledWord, killed)
            let clients = try await killSubscribers(sampler)
            timeline.add(.pubsubKilled, began: killed, ended: killed, recovery: try await recovered(after: killed))
            timeline.pubsubClientsKilled = clients
        }
        if only == nil || only == "kill" {
            try await sleep(until: start + duration * 3 / 10)
            timeline.beforeKill = await sampler.sample()
            let down = monotonicNanoseconds()
            table.store(table.downBeganWord, down)
            try await onOwnThread { server.kill() }
            try await Task.sleep(for: .seconds(2))
            try await onOwnThread { try server.restart() }
            let back = monotonicNanoseconds()
            table.store(table.downEndedWord, back)
            timeline.add(.redisKilled, began: down, ended: back, recovery: try await recovered(after: back))
        }
        if only == nil || only == "pause" {
            try await sleep(until: start + duration * 65 / 100)
            let paused = monotonicNanoseconds()
            table.store(table.pauseBeganWord, paused)
            try await onOwnThread { server.pause() }
            try await Task.sleep(for: .milliseconds(1500))
            try await onOwnThread { server.resume() }
            let resumed = monotonicNanoseconds()
            table.store(table.pauseEndedWord, resumed)
            timeline.add(.redisPaused, began: paused, ended: resumed, recovery: try await recovered(after: resumed))
        }
        return timeline
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
    }

    struct Window {
        var kind: Kind
        var began: Int64
        var ended: Int64
        var recovery: Double
    }

    var windows: [Window] = []
    /// The server's counters just before it was killed (they restart from zero with it).
    var beforeKill: FleetRedisStats? = nil
    /// What `CLIENT KILL TYPE pubsub` killed.
    var pubsubClientsKilled: Int? = nil
    /// How long after a fault's end reads may still see its effects (the fault bar: coherence back within
    /// 2 s).
    static let grace: Int64 = 2_000_000_000

    mutating func add(_ kind: Kind, began: Int64, ended: Int64, recovery: Double) {
        windows.append(Window(kind: kind, began: began, ended: ended, recovery: recovery))
    }

    var recoveries: [Double] { windows.map(\.recovery) }
}
