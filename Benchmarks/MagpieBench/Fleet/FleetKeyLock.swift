import CFleetFutex
import Synchronization

// A key's lock in the fleet's shared table (FleetShared.swift), handed from one worker process to the
// next by the kernel: the three-state futex mutex of Ulrich Drepper's "Futexes Are Tricky" (its
// "Mutex, Take 3"). A waiter sleeps in FUTEX_WAIT and the holder's release wakes it, so the benchmark adds no
// polling interval to a contended write: the time a waiter loses is the system's write it waits for
// and one wake-up, the same in every system measured.
//
// The word is the first 4 bytes of the key's 8-byte slot 0 (the other 4 stay zero; the file starts
// zeroed, so every lock starts free). It holds
//   0  free
//   1  held, and no thread has gone to sleep on it since it was taken
//   2  held, and a thread may be asleep in FUTEX_WAIT on it
//
// Invariants (what the lock's correctness rests on):
// - Taking a free lock is one compare-exchange 0 → 1, no system call; releasing a lock still at 1 is one
//   atomic decrement, no system call.
// - A thread goes to sleep only on the value 2, and only `lock` stores 2, after it failed to take the
//   lock free. FUTEX_WAIT compares the word with 2 atomically with going to sleep: a release between
//   the thread's exchange and its sleep changes the word, the wait returns at once (EAGAIN), and the
//   thread tries again. So no wake-up is lost.
// - A release that finds 2 stores 0 and wakes one sleeper. The woken thread takes the lock with 2 (it
//   cannot know whether others sleep), so the next release wakes the next: no sleeper is left behind,
//   at the cost of a wake that may find nobody.
// - The lock has no owner: any thread may release a lock another thread took. The async callers rely
//   on it (a waiter thread takes the lock for a task, which releases it from another thread).
// - The futex operations are the shared ones: each process maps the table at an address of its own,
//   and a private futex (keyed by the address) would not wake a waiter in another process.

/// The lock of one key in the shared table: a futex word (see the notes at the top of this file).
struct FleetKeyLock: @unchecked Sendable {
    // @unchecked Sendable invariant: `word` points into a MAP_SHARED mapping that outlives every copy of
    // this value (`FleetShared` owns it and hands locks out to code that holds the table); the word is
    // accessed only atomically, here, and by the kernel.
    private let word: UnsafeMutablePointer<Atomic<UInt32>>

    /// The lock whose word is at `address` (4-byte aligned, inside the shared mapping).
    init(address: UnsafeMutableRawPointer) {
        precondition(Int(bitPattern: address) % 4 == 0, "a futex word is 4-byte aligned")
        word = address.assumingMemoryBound(to: Atomic<UInt32>.self)
    }

    static let free: UInt32 = 0
    static let held: UInt32 = 1
    static let contended: UInt32 = 2

    /// Takes the lock if it is free, without waiting.
    func tryLock() -> Bool {
        word.pointee.compareExchange(expected: Self.free, desired: Self.held, ordering: .acquiring).exchanged
    }

    /// Takes the lock, sleeping in FUTEX_WAIT while another thread (of any process) holds it, at most
    /// until `deadline` (monotonic ns). Blocks the calling thread: never call it on a thread of Swift's
    /// cooperative pool.
    /// - Returns: whether the lock was taken; false when it was not free by `deadline`.
    func lock(until deadline: Int64) -> Bool {
        var state = word.pointee.compareExchange(expected: Self.free, desired: Self.held, ordering: .acquiring).original
        if state == Self.free { return true }
        // Announce a sleeper before sleeping (a release must then wake); the exchange also takes the
        // lock if it was released meanwhile (it returns 0).
        if state != Self.contended { state = word.pointee.exchange(Self.contended, ordering: .acquiring) }
        while state != Self.free {
            let remaining = deadline - monotonicNanoseconds()
            if remaining <= 0 { return false }
            // Woken, EAGAIN (the word changed before the sleep), EINTR or a timeout: all end in the
            // exchange, which takes the lock if it is free and announces this sleeper again if not.
            _ = fleet_futex_wait(UnsafeMutableRawPointer(word), Self.contended, remaining)
            state = word.pointee.exchange(Self.contended, ordering: .acquiring)
        }
        return true
    }

    /// Releases the lock (taken by any thread), waking one sleeper if there may be one.
    func unlock() {
        let before = word.pointee.wrappingSubtract(1, ordering: .releasing).oldValue
        precondition(before != Self.free, "a fleet key lock released while free")
        if before == Self.contended {
            word.pointee.store(Self.free, ordering: .releasing)
            _ = fleet_futex_wake(UnsafeMutableRawPointer(word), 1)
        }
    }
}
