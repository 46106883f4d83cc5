import Foundation
import Magpie
import MagpieRedis

// What a worker's callers do: Zipf reads, with a share of sets and removals of the same keys; a miss
// goes to the "origin" (the shared table's latest version, after `origin-us` of simulated work) and
// fills the cache. Every read is checked against the shared truth.

extension FleetInstance {
    /// Runs the workload from the warm-up until `end`; only what happens from `start` on is counted.
    func drive(thread: Int, from start: Int64, until end: Int64, tally: FleetTally) {
        let local = FleetTally()
        let warmup = FleetTally()
        var operations = FleetOperations(self, seed: UInt64(options.index * 1000 + thread))
        while true {
            let now = monotonicNanoseconds()
            if now >= end || table.load(table.stopWord) != 0 { break }
            let (key, kind) = operations.next()
            let counted = now >= start ? local : warmup
            switch kind {
            case .remove: change(key, removal: true, tally: counted)
            case .set: change(key, removal: false, tally: counted)
            case .read: read(key, tally: counted)
            }
            counted.allLatency.record(monotonicNanoseconds() - now)
        }
        tally.merge(local)
    }

    /// A set (a new version, written through) or a removal (a new version in the origin, the cached
    /// value removed), with the key's lock held.
    private func change(_ key: Int, removal: Bool, tally: FleetTally) {
        table.lock(key)
        defer { table.unlock(key) }
        let version = table.nextVersion(key)
        let began = monotonicNanoseconds()
        do {
            if removal {
                try remove(key)
                tally.removes += 1
            } else {
                try write(key, value(key, version: version))
                tally.writes += 1
            }
        } catch {
            tally.recordCallerError()
        }
        let finished = monotonicNanoseconds()
        if !removal { tally.recordPhase(store: true, began: began, finished: finished, table: table) }
        // The origin changed whether or not the cache call succeeded.
        table.recordWrite(key, version: version, removal: removal, now: finished)
    }

    private func read(_ key: Int, tally: FleetTally) {
        let started = monotonicNanoseconds()
        tally.reads += 1
        var found: ([UInt8], Tier)? = nil
        do {
            found = try read(key)
        } catch {
            tally.recordCallerError()
        }
        if let (bytes, tier) = found {
            judgeHit(key, bytes, tier, started: started, tally: tally)
            return
        }
        // A miss: the origin's current version, written into the cache under the key's lock (so it
        // is never older than a write that returned before it); looked up again once the lock is held
        // (the caller before may have filled it), as the task callers do.
        table.lock(key)
        do {
            if let (bytes, tier) = try read(key) {
                table.unlock(key)
                judgeHit(key, bytes, tier, started: started, tally: tally)
                return
            }
        } catch {
            tally.recordCallerError()
        }
        tally.originCalls += 1
        if options.originUs > 0 { usleep(UInt32(options.originUs)) }
        let version = table.latestVersion(key)
        do {
            try write(key, value(key, version: version))
        } catch {
            tally.recordCallerError()
        }
        table.unlock(key)
        tally.readLatency.record(monotonicNanoseconds() - started)
    }

    /// A read that found `bytes` in `tier`: counted, timed (a memory hit also in the pause rows), and
    /// judged against the ground truth.
    func judgeHit(_ key: Int, _ bytes: [UInt8], _ tier: Tier, started: Int64, tally: FleetTally) {
        let finished = monotonicNanoseconds()
        tally.readLatency.record(finished - started)
        switch tier {
        case .memory:
            tally.memoryHits += 1
            tally.recordPhase(store: false, began: started, finished: finished, table: table)
        case .disk: tally.diskHits += 1
        case .remote: tally.remoteHits += 1
        }
        guard let (owner, version) = Self.parse(bytes), owner == key else {
            tally.wrongValues += 1
            return
        }
        judge(key, version: version, readStarted: started, remote: tier == .remote, tally: tally)
    }

    /// A read of `version` that started at `readStarted` is stale beyond the bound when a newer version
    /// had replaced it more than the bound before the read began (the replacing write's return instant
    /// is known exactly when it is the latest or the one before; older ones replaced it no later than
    /// the previous write returned, so this never over-counts). A read whose key's record stayed mid-write
    /// through every attempt to read it whole is not judged (rare: its writer was descheduled midway).
    private func judge(_ key: Int, version: Int64, readStarted: Int64, remote: Bool, tally: FleetTally) {
        guard let truth = table.truth(key), version < truth.latest else { return }
        let replacedAt = version == truth.previous ? truth.latestAt : truth.previousAt
        guard replacedAt > 0, replacedAt < readStarted - boundNs else { return }
        tally.staleBeyondBound += 1
        if remote { tally.staleFromRemote += 1 }
        if tally.staleAt.count < FleetTally.instantsKept { tally.staleAt.append(readStarted) }
        // The value was removed (the latest change is a removal) long enough ago: served again.
        if truth.removal && truth.latestAt < readStarted - boundNs {
            tally.resurrected += 1
            if tally.resurrectedAt.count < FleetTally.instantsKept { tally.resurrectedAt.append(readStarted) }
        }
    }

    /// Writes the lag probes this worker owns (probe n belongs to worker n % workers), one every
    /// `probe-interval-us` × workers, recording when each write returned.
    func probe(from start: Int64, until end: Int64) {
        while monotonicNanoseconds() < start { usleep(1_000) }
        var n = options.index
        let interval = UInt32(max(100, options.probeIntervalUs * options.workers))
        while n < options.probes, monotonicNanoseconds() < end, table.load(table.stopWord) == 0 {
            let payload = Array("probe \(n)".utf8)
            if (try? cache?.set(payload, forKey: "probe:\(n)")) != nil {
                table.store(table.probeWord(n, 0), monotonicNanoseconds())
            }
            n += options.workers
            usleep(interval)
        }
    }

    /// The single-flight phase: `callers` concurrent loads of one missing key, each through the loader
    /// API; the origin counts its runs in the shared table (control word 4).
    func singleFlight(callers: Int) throws {
        guard let cache else { return }
        _ = table.add(table.readyWord, 1)
        try FleetWorker.awaitWarmup(table)
        let group = DispatchGroup()
        let table = self.table
        let failures = FleetTally()
        for _ in 0..<callers {
            group.enter()
            Task {
                do {
                    _ = try await cache.value(forKey: "single-flight") {
                        _ = table.add(4, 1)
                        try await Task.sleep(for: .milliseconds(100))
                        return Array("loaded once".utf8)
                    }
                } catch {
                    failures.lock.withLock { failures.callerErrors += 1 }
                }
                group.leave()
            }
        }
        group.wait()
        let stats = cache.statistics.remote
        let line: [String: JSONValue] = [
            "caller_errors": .int(failures.callerErrors), "leases": .int(Int(stats?.leasesAcquired ?? 0)),
            "shared_loads": .int(Int(stats?.sharedLoads ?? 0)),
        ]
        print(String(decoding: try JSONEncoder().encode(line), as: UTF8.self))
    }

    /// Prints the worker's figures (one JSON object) for the parent.
    func report(_ tally: FleetTally) {
        var line: [String: JSONValue] = [
            "reads": .int(tally.reads), "writes": .int(tally.writes), "removes": .int(tally.removes),
            "memory_hits": .int(tally.memoryHits), "disk_hits": .int(tally.diskHits), "remote_hits": .int(tally.remoteHits),
            "origin_calls": .int(tally.originCalls), "caller_errors": .int(tally.callerErrors),
            "stale_reads_beyond_bound": .int(tally.staleBeyondBound), "stale_from_remote": .int(tally.staleFromRemote), "resurrected_removals": .int(tally.resurrected),
            "wrong_values": .int(tally.wrongValues),
            "stale_at": .array(tally.staleAt.map { .int(Int($0)) }),
            "resurrected_at": .array(tally.resurrectedAt.map { .int(Int($0)) }),
            "caller_error_at": .array(tally.callerErrorAt.map { .int(Int($0)) }),
            "read_latency": .array(tally.readLatency.counts.map { .int($0) }),
            "all_latency": .array(tally.allLatency.counts.map { .int($0) }),
            "hit_latency_running": .array(tally.hitLatencyRunning.counts.map { .int($0) }),
            "hit_latency_paused": .array(tally.hitLatencyPaused.counts.map { .int($0) }),
            "store_latency_running": .array(tally.storeLatencyRunning.counts.map { .int($0) }),
            "store_latency_paused": .array(tally.storeLatencyPaused.counts.map { .int($0) }),
        ]
        if let remote = cache?.statistics.remote {
            line["remote_errors"] = .int(Int(remote.errors))
            line["invalidations"] = .int(Int(remote.invalidations))
            line["epoch_bumps"] = .int(Int(remote.epochBumps))
            line["owed_removals"] = .int(remote.owedRemovals)
            line["replayed_removals"] = .int(Int(remote.replayedRemovals))
            // Over the whole run, the warm-up included: what the store answered, and how much of it the
            // local tiers could not keep (a change or a write of the key overlapped the fetch).
            line["store_hits"] = .int(Int(remote.hits))
            line["unkept"] = .int(Int(remote.unkept))
            line["withheld"] = .int(Int(remote.withheld))
            line["fenced"] = .int(Int(remote.fenced))
        }
        print(String(decoding: (try? JSONEncoder().encode(line)) ?? Data(), as: UTF8.self))
    }
}

/// One caller's operations: Zipf-ranked keys, each a read, a set or a removal by the configured shares.
struct FleetOperations {
    enum Kind { case read, set, remove }

    private let workload: ZipfWorkload
    private let setShare: Double
    private let removeShare: Double
    private var state: UInt64
    private var draws: UInt64
    private var ranks: [UInt32] = []
    private var position: Int
    private static let batch = 4096

    init(_ instance: FleetInstance, seed: UInt64) {
        workload = instance.workload
        setShare = instance.options.setShare
        removeShare = instance.options.removeShare
        state = splitmix64(seed &+ 0x5EED)
        // The operation draws come from a generator of their own: the ranks' generator's outputs are the
        // Zipf draws themselves (a shared stream would send every write to the hottest key).
        draws = splitmix64(state ^ 0xD1CE_D1CE_D1CE_D1CE)
        position = Self.batch
    }

    mutating func next() -> (key: Int, kind: Kind) {
        if position == Self.batch {
            state = splitmix64(state)
            ranks = workload.ranks(seed: state, count: Self.batch)
            position = 0
        }
        let key = Int(ranks[position])
        position += 1
        draws = splitmix64(draws)
        let draw = Double(draws >> 11) * (1.0 / 9_007_199_254_740_992.0)
        if draw < removeShare { return (key, .remove) }
        if draw < removeShare + setShare { return (key, .set) }
        return (key, .read)
    }
}
