import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import MagpieBench

/// The fleet benchmark's key lock (a futex word in the shared table) handed from holder to waiter:
/// callers hammer one key through two mappings of the table file (as two worker processes map it, at
/// two addresses), each counting a non-atomic counter under the lock and checking that no one else is
/// inside. A lost wake-up leaves a waiter asleep until its patience runs out (it then finds the lock
/// free, or gives up), which these tests count as a stall, a failure: a handoff takes a wake-up, never
/// seconds. They end in seconds either way. A private futex (keyed by address) would lose every wake
/// across the two mappings.
@Suite("magpie-bench fleet: the key lock's handoff", .timeLimit(.minutes(1)))
struct BenchFleetLockTests {
    /// What the callers saw, shared by them.
    final class Tally: @unchecked Sendable {
        // @unchecked Sendable invariant: `counter` is written only with the key's lock held (that is what
        // is tested) and read after every caller ended; the rest are atomics.
        let inside = Atomic<Int>(0)
        let violations = Atomic<Int>(0)
        let timeouts = Atomic<Int>(0)
        /// Acquisitions that took the whole patience: only a lost wake-up sleeps that long.
        let stalls = Atomic<Int>(0)
        let contended = Atomic<Int>(0)
        var counter = 0

        /// The critical section: nobody else inside, and a read-modify-write of `counter` that overlapping
        /// holders would lose increments of.
        /// A caller waited from `began` for a lock with `patience`, and got it (`taken`) or not.
        func waited(from began: Int64, patience: Int64, taken: Bool) -> Bool {
            if monotonicNanoseconds() - began >= patience { stalls.add(1, ordering: .relaxed) }
            if !taken { timeouts.add(1, ordering: .relaxed) }
            return taken
        }

        func expectHandedOff(_ expected: Int) {
            #expect(timeouts.load(ordering: .relaxed) == 0)
            #expect(stalls.load(ordering: .relaxed) == 0)
            #expect(violations.load(ordering: .relaxed) == 0)
            #expect(counter == expected)
        }

        func critical(_ work: () -> Void = {}) {
            if inside.add(1, ordering: .relaxed).oldValue != 0 { violations.add(1, ordering: .relaxed) }
            let seen = counter
            work()
            counter = seen + 1
            inside.subtract(1, ordering: .relaxed)
        }
    }

    /// How long a caller waits for the lock before giving up, ns: far beyond a handoff, even one that loses
    /// to other callers a few times on a loaded machine (the lock is not fair), and short enough for a
    /// lost wake-up to fail the test in seconds.
    static let patience: Int64 = 5_000_000_000

    /// Two mappings of one table file: the memory two worker processes share, at two addresses.
    func mappings(_ directory: TemporaryDirectory) throws -> (FleetShared, FleetShared) {
        let path = directory.path + "/shared"
        let first = try FleetShared(path: path, keys: 2, probes: 0, workers: 1, create: true)
        return (first, try FleetShared(path: path, keys: 2, probes: 0, workers: 1, create: false))
    }

    @Test("threads blocking in FUTEX_WAIT on one key: mutual exclusion, every waiter woken")
    func threads() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (first, second) = try mappings(directory)
        let tally = Tally()
        let (callers, rounds) = (4, 5_000)
        let done = DispatchGroup()
        for caller in 0..<callers {
            let lock = (caller % 2 == 0 ? first : second).keyLock(0)
            done.enter()
            Thread {
                defer { done.leave() }
                for _ in 0..<rounds {
                    if !lock.tryLock() {
                        tally.contended.add(1, ordering: .relaxed)
                        let began = monotonicNanoseconds()
                        let taken = lock.lock(until: began + Self.patience)
                        guard tally.waited(from: began, patience: Self.patience, taken: taken) else { return }
                    }
                    // The holder gives up its core inside, so that the others find the lock taken and sleep.
                    tally.critical { sched_yield() }
                    lock.unlock()
                }
            }.start()
        }
        done.wait()
        tally.expectHandedOff(callers * rounds)
        // The waiting path ran (a test whose callers never met would prove nothing).
        #expect(tally.contended.load(ordering: .relaxed) > rounds / 10)
        // Released: free again, through either mapping.
        #expect(second.keyLock(0).tryLock())
        first.keyLock(0).unlock()
    }

    @Test("tasks on the global executor, two processes' locks: mutual exclusion, every waiter resumed")
    func tasks() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (first, second) = try mappings(directory)
        // Two keys, each with its own tally: the waiter threads serve several keys at once.
        let tallies = [Tally(), Tally()]
        let locks = [first, second].map { FleetKeyLocks(table: $0, patience: Self.patience) }
        let (tasksPerProcess, rounds) = (16, 500)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<(2 * tasksPerProcess) {
                let (locks, key) = (locks[task % 2], (task / 2) % 2)
                let tally = tallies[key]
                group.addTask {
                    for _ in 0..<rounds {
                        let began = monotonicNanoseconds()
                        let taken = await locks.lock(key)
                        guard tally.waited(from: began, patience: Self.patience, taken: taken) else { return }
                        // Held across a suspension, as a holder awaits the system's write.
                        if tally.inside.add(1, ordering: .relaxed).oldValue != 0 { tally.violations.add(1, ordering: .relaxed) }
                        let seen = tally.counter
                        await Task.yield()
                        tally.counter = seen + 1
                        tally.inside.subtract(1, ordering: .relaxed)
                        locks.unlock(key)
                    }
                }
            }
        }
        for tally in tallies { tally.expectHandedOff(tasksPerProcess * rounds) }
        // Tasks of the two processes met on the shared word and waited on a waiter thread.
        #expect(locks[0].sharedWaits + locks[1].sharedWaits > 10)
        #expect(first.keyLock(0).tryLock() && second.keyLock(1).tryLock())
    }
}
