import Foundation
import NIOConcurrencyHelpers
import Synchronization

// The callers' key locks. A set or removal holds its key's lock in the shared table (`FleetKeyLock`, a
// futex word) across the system's write. A thread caller (`--tasks 0`) blocks in FUTEX_WAIT for it
// itself. An async caller (`--tasks N`, FleetWorker+Tasks.swift) must never block a thread of Swift's
// cooperative pool (two threads on this machine: one blocked in FUTEX_WAIT would halve the worker), so
// it waits in two stages, neither of which polls:
//
// 1. The process's turn at the key: the worker's tasks queue for the key here, suspended, and a release
//    hands the key to the longest waiter. At most one task per process then competes for the shared word.
// 2. The shared word: taken at once when free (one compare-exchange); otherwise the task suspends and
//    one of the process's waiter threads (`FleetLockWaiters`) blocks in FUTEX_WAIT on its behalf, then
//    resumes the task holding the lock. The holder in another process wakes that thread when it
//    releases the key, so the handoff costs a wake-up and a task's resumption, never a sleep interval.
//
// This cannot deadlock: a task holds at most one key (its process's turn, then the shared word) and
// awaits only the system's write while it holds it; every waiting task is suspended, so the pool's
// threads stay free to run holders, in this process or another.

/// A worker process's locks of keys: for a task, its turn at a key, then the key's lock in the shared
/// table; for a thread, the shared lock alone.
final class FleetKeyLocks: Sendable {
    private struct Turns {
        var held: Set<Int> = []
        var waiters: [Int: [CheckedContinuation<Void, Never>]] = [:]
    }

    private let table: FleetShared
    private let patience: Int64
    private let turns = NIOLockedValueBox(Turns())
    private let waiters = FleetLockWaiters()
    private let waits = Atomic<Int>(0)

    /// - Parameter patience: how long a task waits for the shared word before `lock` gives up (ns).
    init(table: FleetShared, patience: Int64 = FleetShared.lockPatience) {
        self.table = table
        self.patience = patience
    }

    /// Takes `key`'s lock, waiting by suspending.
    /// - Returns: whether it was taken; false when the shared word was not free for `patience` (its
    ///   holder died or hangs; the worker then ends with an error).
    func lock(_ key: Int) async -> Bool {
        await acquireTurn(key)
        let shared = table.keyLock(key)
        if shared.tryLock() { return true }
        waits.add(1, ordering: .relaxed)
        if await waiters.lock(shared, until: monotonicNanoseconds() + patience) { return true }
        releaseTurn(key)
        return false
    }

    /// Releases `key`'s lock, taken by `lock`.
    func unlock(_ key: Int) {
        table.keyLock(key).unlock()
        releaseTurn(key)
    }

    /// Takes `key`'s shared lock on this thread, blocking in FUTEX_WAIT while another holds it (the thread
    /// callers; never a thread of Swift's cooperative pool). Their threads, being few, compete for the
    /// word directly.
    /// - Returns: whether it was taken; false when it was not free for `patience`.
    func lockBlocking(_ key: Int) -> Bool {
        let shared = table.keyLock(key)
        if shared.tryLock() { return true }
        waits.add(1, ordering: .relaxed)
        return shared.lock(until: monotonicNanoseconds() + patience)
    }

    /// Releases `key`'s shared lock, taken by `lockBlocking`.
    func unlockBlocking(_ key: Int) { table.keyLock(key).unlock() }

    /// How often a caller found the shared word taken (by another process, or for a thread caller by
    /// another thread) and waited in FUTEX_WAIT, since the worker started.
    var sharedWaits: Int { waits.load(ordering: .relaxed) }

    private func acquireTurn(_ key: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = turns.withLockedValue { turns -> Bool in
                if turns.held.insert(key).inserted { return true }
                turns.waiters[key, default: []].append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func releaseTurn(_ key: Int) {
        let next = turns.withLockedValue { turns -> CheckedContinuation<Void, Never>? in
            guard var queue = turns.waiters[key], !queue.isEmpty else {
                turns.held.remove(key)
                return nil
            }
            let first = queue.removeFirst()
            turns.waiters[key] = queue.isEmpty ? nil : queue
            return first  // still held: handed over
        }
        next?.resume()
    }
}

/// The threads of one process that block in FUTEX_WAIT for suspended tasks. Each request is served by
/// an idle thread, or by a new one when none is idle, so a task never waits behind another key's wait:
/// the threads number at most the keys waited for at once in the process (at most its caller tasks,
/// one per key by `FleetKeyLocks`' turns), and they stay for the process's life (a worker's run).
final class FleetLockWaiters: @unchecked Sendable {
    // @unchecked Sendable invariant: `requests` and `idle` are read and written with `condition` held.
    private struct Request {
        let lock: FleetKeyLock
        let deadline: Int64
        let continuation: CheckedContinuation<Bool, Never>
    }

    private let condition = NSCondition()
    private var requests: [Request] = []
    /// Threads waiting on `condition` for a request.
    private var idle = 0

    /// Takes `lock` on a waiter thread, this task suspended meanwhile; whether it was taken by `deadline`.
    func lock(_ lock: FleetKeyLock, until deadline: Int64) async -> Bool {
        await withCheckedContinuation { continuation in
            condition.lock()
            requests.append(Request(lock: lock, deadline: deadline, continuation: continuation))
            // Every idle thread will take one request: a new thread when there are more requests.
            let start = idle < requests.count
            if !start { condition.signal() }
            condition.unlock()
            if start {
                let thread = Thread { [self] in serve() }
                thread.stackSize = 256 << 10
                thread.start()
            }
        }
    }

    private func serve() {
        while true {
            condition.lock()
            while requests.isEmpty {
                idle += 1
                condition.wait()
                idle -= 1
            }
            let request = requests.removeFirst()
            condition.unlock()
            request.continuation.resume(returning: request.lock.lock(until: request.deadline))
        }
    }
}
