import Foundation
import Magpie

// Beside the workload, a worker of a coherent system (magpie-fleet, local-pubsub) writes two kinds of
// probes, on keys no other worker writes:
//
//   lag probes        "probe:<n>", one every `probe-interval-us` × workers from this worker; when each
//                     write returned, and when each other worker dropped the key (the system's
//                     invalidation callback): the invalidation lag.
//   own-write probes  "own:<worker>:<n>", one every `own-write-probe-ms`: set, then, one interval later,
//                     asked whether a read would be answered locally. A probe that is not was sent to
//                     Redis by the instance's own write (nobody else writes the key, and the memory is
//                     far from full): the remote reads a writer's own writes cause.
//
// Then the worker's report to its parent, and the single-flight phase.

extension FleetInstance {
    /// Writes the lag probes this worker owns (probe n belongs to worker n % workers), recording when
    /// each write returned.
    func probe(from start: Int64, until end: Int64) async {
        await sleep(until: start)
        var n = options.index
        let interval = max(100, options.probeIntervalUs * options.workers)
        while n < options.probes, monotonicNanoseconds() < end, table.load(table.stopWord) == 0 {
            probeWrites.add(1, ordering: .relaxed)
            if (try? await system.set("probe:\(n)", Array("probe \(n)".utf8))) != nil {
                table.store(table.probeWord(n, 0), monotonicNanoseconds())
            }
            n += options.workers
            try? await Task.sleep(for: .microseconds(interval))
        }
    }

    /// The own-write probes, one every `interval` ms from `start` to `end`; those that overlapped a fault
    /// (Redis killed or paused, the subscriber connections killed) are counted apart.
    func probeOwnWrites(every interval: Int, from start: Int64, until end: Int64, tally: FleetTally) async {
        await sleep(until: start)
        let payload = Array("own write".utf8)
        var (probes, notLocal, inFaults) = (0, 0, 0)
        var n = 0
        while monotonicNanoseconds() + Int64(interval) * 1_000_000 < end, table.load(table.stopWord) == 0 {
            let name = "own:\(options.index):\(n)"
            n += 1
            let began = monotonicNanoseconds()
            probeWrites.add(1, ordering: .relaxed)
            guard (try? await system.set(name, payload)) != nil else {
                try? await Task.sleep(for: .milliseconds(interval))
                continue
            }
            try? await Task.sleep(for: .milliseconds(interval))
            guard let local = await system.answersLocally(name) else { return }
            if table.overlapsFault(began, monotonicNanoseconds()) {
                inFaults += 1
            } else {
                probes += 1
                if !local { notLocal += 1 }
            }
        }
        tally.lock.withLock {
            tally.ownWriteProbes += probes
            tally.ownWriteNotLocal += notLocal
            tally.ownWriteProbesInFaults += inFaults
        }
    }

    private func sleep(until instant: Int64) async {
        let remaining = instant - monotonicNanoseconds()
        if remaining > 0 { try? await Task.sleep(for: .nanoseconds(remaining)) }
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

    /// Prints the worker's figures (one JSON object) for the parent: the callers' tally, the system's
    /// remote reads and the process's CPU time within the measured window (`window`), its Redis round
    /// trips (`roundTrips`, FleetRoundTrips.swift), its origin calls, its own counters.
    func report(_ tally: FleetTally, window: (remote: FleetRemoteReads, cpu: UInt64), roundTrips: [String: JSONValue]) {
        let remote = window.remote
        var line: [String: JSONValue] = [
            "reads": .int(tally.reads), "writes": .int(tally.writes), "removes": .int(tally.removes),
            "memory_hits": .int(tally.memoryHits), "disk_hits": .int(tally.diskHits),
            "remote_hits": .int(tally.remoteHits),
            "origin_calls": .int(origin.measuredCalls), "caller_errors": .int(tally.callerErrors),
            "stale_reads_beyond_bound": .int(tally.staleBeyondBound), "stale_from_remote": .int(tally.staleFromRemote),
            "resurrected_removals": .int(tally.resurrected), "wrong_values": .int(tally.wrongValues),
            "remote_reads": .int(remote.total), "probe_writes": .int(probeWrites.load(ordering: .relaxed)),
            "own_write_probes": .int(tally.ownWriteProbes), "own_write_probes_not_local": .int(tally.ownWriteNotLocal),
            "own_write_probes_in_faults": .int(tally.ownWriteProbesInFaults),
        ]
        for (name, path) in FleetTally.histograms { line[name] = .array(tally[keyPath: path].counts.map { .int($0) }) }
        if let hits = remote.hits { line["remote_read_hits"] = .int(hits) }
        if let misses = remote.misses { line["remote_read_misses"] = .int(misses) }
        if let unserved = remote.unserved { line["unserved_copies"] = .int(unserved) }
        // The fraction of received change messages this instance discarded (Magpie: what its store was given).
        let dropped =
            (system as? FleetMagpieSystem)?.droppedChangeMessages
            ?? (system is FleetLocalPubSubSystem ? options.dropMessages : 0)
        line["drop_messages_applied"] = .double(dropped)
        line.merge(tally.windows.json) { mine, _ in mine }
        line["cpu_ns"] = .int(Int(window.cpu))
        line.merge(roundTrips) { mine, _ in mine }
        line["key_lock_waits"] = .int(keyLocks.sharedWaits)  // the warm-up's too: a count of the driver's, not a rate
        line.merge(system.report()) { mine, _ in mine }
        print(String(decoding: (try? JSONEncoder().encode(line)) ?? Data(), as: UTF8.self))
    }
}
