import Foundation
import Magpie
import MagpieRedis

// The worker's callers as services have them (`--tasks N`): N async tasks on Swift's global executor,
// the same workload as the thread callers (FleetWorker+Drive.swift), through each system's async calls
// (FleetSystem.swift): Magpie's loader API and `cache.async`, the cache-aside's and the hand-built
// pattern's `RedisClient` calls, from the same tasks.
//
// A set or removal holds the key's lock in the shared table across the system's write, as the thread
// callers hold it, so the ground truth records versions in the order they reach the system. A task
// waits for it suspended, never blocking a thread of the pool (FleetKeyLocks.swift). Reads take no
// lock: a miss is the system's own load (its single flight), as services have it.
//
// Reads, memory hits and stores that overlapped the fault run's SIGSTOP window (the table's pause
// instants) are tallied apart from those while Redis ran: the pause rows.

extension FleetInstance {
    /// Runs `tasks` callers from the warm-up until `end`; only what happens from `start` on is counted.
    func driveTasks(_ tasks: Int, from start: Int64, until end: Int64, tally: FleetTally) async {
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<tasks {
                group.addTask { await self.driveTask(task, from: start, until: end, tally: tally) }
            }
        }
    }

    private func driveTask(_ task: Int, from start: Int64, until end: Int64, tally: FleetTally) async {
        let local = FleetTally()
        let warmup = FleetTally(measured: false)
        var operations = FleetOperations(self, seed: UInt64(options.index * 100_000 + task))
        var count = 0
        while true {
            let now = monotonicNanoseconds()
            if now >= end || table.load(table.stopWord) != 0 { break }
            // A memory hit never suspends: like a request handler between its network reads, the task
            // lets the others run now and then (every 256 operations).
            count += 1
            if count & 255 == 0 { await Task.yield() }
            let (key, kind) = operations.next()
            let counted = now >= start ? local : warmup
            switch kind {
            case .remove: await changeAsync(key, removal: true, tally: counted)
            case .set: await changeAsync(key, removal: false, tally: counted)
            case .read: await readAsync(key, tally: counted)
            }
            counted.allLatency.record(monotonicNanoseconds() - now)
        }
        tally.merge(local)
    }

    /// The key's lock, waited for by suspending (FleetKeyLocks.swift); a worker whose shared lock stays
    /// taken for `FleetShared.lockPatience` ends with an error.
    private func lockAsync(_ key: Int) async {
        if !(await keyLocks.lock(key)) { FleetShared.abandon(key) }
    }

    private func changeAsync(_ key: Int, removal: Bool, tally: FleetTally) async {
        await lockAsync(key)
        defer { keyLocks.unlock(key) }
        let version = table.nextVersion(key)
        let began = monotonicNanoseconds()
        do {
            if removal {
                try await FleetRoundTrips.run(.removal, measured: tally.measured) { try await system.remove(Self.name(key)) }
                tally.removes += 1
            } else {
                let value = value(key, version: version)
                try await FleetRoundTrips.run(.set, measured: tally.measured) { try await system.set(Self.name(key), value) }
                tally.writes += 1
            }
        } catch {
            tally.recordCallerError(table)
        }
        let finished = monotonicNanoseconds()
        recordChange(removal: removal, began: began, finished: finished, tally: tally)
        table.recordWrite(key, version: version, removal: removal, now: finished)
    }

    /// A read as the system answers it (a miss loads inside the system, single flight per key in the
    /// process, the origin the same for all), judged.
    private func readAsync(_ key: Int, tally: FleetTally) async {
        let started = monotonicNanoseconds()
        tally.reads += 1
        do {
            let read = try await FleetRoundTrips.run(.read, measured: tally.measured) { try await system.read(Self.name(key), key: key) }
            judgeRead(key, read, started: started, tally: tally)
        } catch {
            tally.recordCallerError(table)
        }
    }
}
