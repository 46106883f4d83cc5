import Foundation
import Magpie
import MagpieRedis
import NIOConcurrencyHelpers

// The worker's callers as services have them (`--tasks N`): N async tasks on Swift's global executor,
// the same workload as the thread callers (FleetWorker+Drive.swift), through each system's async calls
// (FleetSystem.swift): Magpie's loader API and `cache.async`, the cache-aside's and the hand-built
// pattern's `RedisClient` calls, from the same tasks.
//
// A set or removal holds the key's lock in the shared table across the system's write, as the thread
// callers hold it, so the ground truth records versions in the order they reach the system. The tasks of
// one worker first queue for the key on an async lock of the process (`FleetKeyLocks`: a waiter suspends,
// and the releaser hands the key to the next waiter), so that at most one task per process competes for
// the shared lock, which it then takes by trying, yielding, and sleeping between tries (20 µs, doubling to
// 1 ms): a task never spins on a cooperative thread while the holder waits to be resumed on one. That
// cannot deadlock: a task holds at most one key (its process's turn, then the shared word) and awaits
// only the system's write while it holds it; every waiter is suspended (a continuation, a yield, or a
// sleep), so the pool's threads stay free to resume the holder, in this process or another. Reads take
// no lock: a miss is the system's own load (its single flight), as services have it.
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
        let warmup = FleetTally()
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

    /// The key's lock, waited for by suspending: this process's turn first, then the shared lock (a
    /// worker whose shared lock stays taken for `FleetShared.lockPatience` ends with an error).
    private func lockAsync(_ key: Int) async {
        await keyLocks.acquire(key)
        var attempts = 0
        var deadline: Int64 = 0
        while !table.tryLock(key) {
            attempts += 1
            if attempts < 16 {
                await Task.yield()
            } else {
                if attempts == 16 { deadline = monotonicNanoseconds() + FleetShared.lockPatience }
                if monotonicNanoseconds() > deadline { FleetShared.abandon(key) }
                // 20 µs, doubling to 1 ms: a holder holds the key for a round trip or an origin call, and
                // each sleep is a timer on the executor's timer thread (at a flat 20 µs, `perf` found the
                // waiters' timers a quarter of the machine's CPU at 16 tasks, taken from both systems).
                try? await Task.sleep(for: .microseconds(min(1_000, 20 << min(attempts - 16, 6))))
            }
        }
    }

    private func unlockAsync(_ key: Int) {
        table.unlock(key)
        keyLocks.release(key)
    }

    private func changeAsync(_ key: Int, removal: Bool, tally: FleetTally) async {
        await lockAsync(key)
        defer { unlockAsync(key) }
        let version = table.nextVersion(key)
        let began = monotonicNanoseconds()
        do {
            if removal {
                try await system.remove(Self.name(key))
                tally.removes += 1
            } else {
                try await system.set(Self.name(key), value(key, version: version))
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
            judgeRead(key, try await system.read(Self.name(key), key: key), started: started, tally: tally)
        } catch {
            tally.recordCallerError(table)
        }
    }
}

/// Per-key async locks of one worker process: a task waits for a key by suspending; the holder's
/// release hands the key to the longest waiter.
final class FleetKeyLocks: Sendable {
    private struct State {
        var held: Set<Int> = []
        var waiters: [Int: [CheckedContinuation<Void, Never>]] = [:]
    }

    private let state = NIOLockedValueBox(State())

    func acquire(_ key: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLockedValue { state -> Bool in
                if state.held.insert(key).inserted { return true }
                state.waiters[key, default: []].append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func release(_ key: Int) {
        let next = state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            guard var queue = state.waiters[key], !queue.isEmpty else {
                state.held.remove(key)
                return nil
            }
            let first = queue.removeFirst()
            state.waiters[key] = queue.isEmpty ? nil : queue
            return first  // still held: handed over
        }
        next?.resume()
    }
}
