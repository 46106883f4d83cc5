import Foundation
import Synchronization

// MARK: - The sealer: one thread that writes detached memtables, off the stores' path
//
// A store that detaches its bucket's active memtable (Disk/Bucket+Seal.swift) queues the bucket here
// and returns; this thread takes buckets in order and seals their memtables (compression, hashing and,
// mostly, the file write outside the bucket's lock: Bucket+Seal.swift, Bucket+RecordWrite.swift). It starts at
// the first queued bucket (a tier that is only read never starts it) and stops when the tier closes (after
// the seal it is in; `close()` writes what is left itself) or is released.
//
// Hand-over without a wake-up on the store's path: a store that queues a bucket takes only the queue's
// lock (held for an append or a pop, never across a wait; a store finds it taken only during the thread's
// pop) and, while the thread is awake, makes no other call. When the queue runs dry the thread does not
// sleep at once: it looks again after 50, 100, 200, 400 and 800 µs (`lookAfter`, about 1.6 ms in all, more
// with the kernel's timer slack), and only then parks on `condition` (`parked` set first). A store that
// finds it parked, or parking, takes `condition` and signals it (a futex call: the first hand-over after
// an idle spell pays it). A steady flow of hand-overs less than 0.8 ms apart never lets it park; one
// hand-over every millisecond or so costs it up to five timer wake-ups instead of one futex wake-up.
// Before this, every hand-over that found the thread waiting signalled it from the store, and on this
// 2-core machine, with the kernel's writeback runnable, the storing thread often lost its core in that call
// for 100-470 µs: enough of them to set the eviction-heavy store p99.9 (docs/lab-notes/disk.md: the
// store tail under load).
//
// The looks pay only when hand-overs come less than their span apart. At a trickle (a seal every 16 ms at
// 1,000 stores/s) each idle spell cost five timer wake-ups and then the futex wake-up anyway: about 300
// context switches a second for nothing (docs/lab-notes/disk.md: stores at a trickle). So
// after two idle spells in a row that each ended in a wake-up from the parked state more than twice the
// looks' span after they began (`LookPolicy`), the next spells park at once; any shorter spell, or one that
// ended in a look, brings the looks back. A spell is measured to the store's signal, not to when the
// thread runs again, so a slow wake-up (a core taken by another process) does not count against the
// looks; twice the span leaves room for the kernel's timer slack on the sleeps. A steady flow keeps its
// looks; a burst after a single long gap finds them as before; after a trickle, the first two quick
// hand-overs pay a futex wake-up each before the looks are back.
//
// The thread runs as batch work (`SCHED_BATCH`, see `runAsBatchWork`): its wake-ups wait for the end of
// the running thread's slice instead of preempting it, so that on a machine with every core busy it takes
// the storing thread's core once a slice or so, in slice-long turns, not at every look.
//
// No lost wake-up: the thread sets `parked`, then looks at the queue under its lock, then waits on
// `condition`, which it holds from before setting `parked` until the wait releases it. A store appends under
// the queue's lock, then reads `parked`. Either the thread's look follows the append (it sees the bucket), or
// it precedes it, and then `parked = true` (set before the look) is visible to the store's read (the queue's
// lock orders them), so the store signals; it takes `condition` to do so, which it gets only once the
// thread waits.
//
// Waiting: a store that finds its bucket's two memtables taken, and `writeBuffers`/`flush`, wait for the
// seal of a memtable another thread has claimed with ``waitForCompletion(after:)``: a count of finished
// seals under a condition, read before the caller looked at the bucket, so that a seal finishing in
// between is never missed. No lock is held across the wait, and none of the bucket locks is ever taken
// with the condition's held. (A memtable queued but not yet claimed is never waited for: whoever finds it
// seals it on its own thread, `BucketSet.sealOrWait` and `writeMemtables`; so a polling thread's delay never
// holds up a waiter.)

/// The thread that seals memtables for a tier (see above).
final class Sealer: Sendable {
    private struct Queue {
        var buckets: [Int] = []
        var head = 0
        var queued: [Bool]
        var started = false
        var stopping = false
        var finished = false
    }

    /// Where the thread parks after an idle spell (and where `stop()` waits for it to finish); guards
    /// nothing of its own.
    private let condition = NSCondition()
    private let queue: Locked<Queue>
    /// The thread is parked on `condition`, or about to be: a store that queues a bucket must wake it.
    private let parked = Atomic<Bool>(false)
    private let finishedSeals = NSCondition()
    private let completions = Atomic<UInt64>(0)
    /// The thread's sleeps, in microseconds, before each look at an empty queue (then it parks): a bucket
    /// queued while the thread sleeps waits for the rest of that sleep (its stores are readable meanwhile,
    /// and nobody waits for an unclaimed memtable: see above); one queued while it is parked, for a wake-up.
    static let lookAfter: [UInt32] = [50, 100, 200, 400, 800]
    /// The looks' span, in nanoseconds (their sleeps added up, without the kernel's timer slack).
    static let lookSpan = UInt64(lookAfter.reduce(0, +)) * 1_000
    /// Looks taken at an empty queue, in all (tests).
    private let looksTaken = Atomic<Int>(0)
    /// What `runAsBatchWork()` returned on the thread (see `batchScheduling`).
    private let batchSchedulingResult = Atomic<Int32>(-1)
    /// When a store last signalled the parked thread (`DispatchTime` nanoseconds): the end of its idle spell.
    private let signalledAt = Atomic<UInt64>(0)

    /// Whether the thread's idle spells look at the queue before parking (see the comment at the top).
    struct LookPolicy {
        /// Long spells in a row.
        private(set) var longSpells = 0
        /// Whether the next idle spell looks before it parks.
        var looking: Bool { longSpells < 2 }

        /// An idle spell ended in a wake-up from the parked state, `idle` nanoseconds after it began.
        mutating func spellEndedParked(idle: UInt64) {
            longSpells = idle > 2 * Sealer.lookSpan ? min(longSpells + 1, 2) : 0
        }

        /// An idle spell ended in a look (a bucket found before the thread parked).
        mutating func spellEndedInLook() { longSpells = 0 }
    }

    /// Seals one bucket (it logs its failures); set once, by the tier, when its initialiser is done.
    /// Boxed in a class, never held as a bare closure: a function type as `Locked`'s generic state is
    /// stored reabstracted, and every `withLock` then wraps it in two more thunks on the way in and out of
    /// its `inout` (measured, a loop of 20,000 reads of such a closure: 2.1 s, then 7.5, 15.6, 24.8 and
    /// 47.5 s for each next 20,000). The sealer read it once per seal: a tier's seals slowed
    /// quadratically, and the thunk chain, one call deep per link, would in the end overflow the thread's
    /// stack.
    private final class Work: Sendable {
        let seal: @Sendable (Int) -> Void
        init(_ seal: @escaping @Sendable (Int) -> Void) { self.seal = seal }
    }
    private let work = Locked<Work?>(nil)
    #if MAGPIE_TESTING
    /// Test builds only (`MAGPIE_TESTING`, see Package.swift; scripts/check-release-seams.sh): called on the
    /// thread right after its look at the queue before it parks, when that look found it empty
    /// (`racingHandOverAtParking`).
    private let parkingProbe = Locked<Work?>(nil)

    /// Test builds only: sets what the thread calls after its look before parking (see `parkingProbe`).
    func setParkingProbe(_ probe: (@Sendable (Int) -> Void)?) {
        let boxed = probe.map(Work.init)
        parkingProbe.withLock { $0 = boxed }
    }
    #endif

    /// A sealer for `bucketCount` buckets.
    init(bucketCount: Int) {
        queue = Locked(Queue(queued: [Bool](repeating: false, count: bucketCount)))
    }

    /// Sets what sealing a bucket is (before the first `enqueue`); nil once the thread is stopped.
    func setWork(_ work: (@Sendable (Int) -> Void)?) {
        let boxed = work.map(Work.init)
        self.work.withLock { $0 = boxed }
    }

    /// Queues bucket `number` (once: a bucket already queued is not queued twice). No system call unless
    /// the thread is parked (or not started yet).
    func enqueue(_ number: Int) {
        let start = queue.withLock { queue -> Bool in
            guard !queue.stopping, !queue.queued[number] else { return false }
            queue.queued[number] = true
            queue.buckets.append(number)
            defer { queue.started = true }
            return !queue.started
        }
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "magpie-io-sealer"
            thread.start()
        } else if parked.load(ordering: .sequentiallyConsistent) {
            signalledAt.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
            condition.lock()
            condition.signal()
            condition.unlock()
        }
    }

    /// Whether the thread is parked (tests).
    var isParked: Bool { parked.load(ordering: .sequentiallyConsistent) }

    /// Looks the thread has taken at an empty queue, in all (tests).
    var looks: Int { looksTaken.load(ordering: .relaxed) }

    private enum Next {
        case bucket(Int)
        case empty
        case stop
    }

    /// The next queued bucket, taken off the queue.
    private func next() -> Next {
        queue.withLock { queue -> Next in
            if queue.stopping { return .stop }
            guard queue.head < queue.buckets.count else { return .empty }
            let bucket = queue.buckets[queue.head]
            queue.head += 1
            if queue.head > 1024 && queue.head * 2 > queue.buckets.count {
                queue.buckets.removeFirst(queue.head)
                queue.head = 0
            }
            queue.queued[bucket] = false
            return .bucket(bucket)
        }
    }

    /// `next()`, as the thread's look before it parks.
    private func lastLook() -> Next {
        let step = next()
        #if MAGPIE_TESTING
        if case .empty = step { parkingProbe.withLock { $0 }?.seal(0) }
        #endif
        return step
    }

    private func run() {
        IOThreadPool.nameCurrentThread("magpie-io-sealer")
        batchSchedulingResult.store(Self.runAsBatchWork(), ordering: .releasing)
        var looks = 0
        /// Whether this idle spell looks before it parks (set by the spells before, see the top).
        var policy = LookPolicy()
        /// When this idle spell began (the queue first found empty), or 0 outside one.
        var idleSince: UInt64 = 0
        while true {
            var step = next()
            if case .empty = step {
                if idleSince == 0 { idleSince = max(1, DispatchTime.now().uptimeNanoseconds) }
                if policy.looking && looks < Self.lookAfter.count {
                    // An empty queue: look again shortly; a store meanwhile queues without waking this thread.
                    // A relative sleep, not a timed wait on `condition`: that takes a wall-clock deadline, and a
                    // clock set back would stretch it. `stop()` waits for at most one sleep.
                    usleep(Self.lookAfter[looks])
                    looks += 1
                    looksTaken.add(1, ordering: .relaxed)
                    continue
                }
                // Idle for a while: park until a store wakes it (see the comment at the top for the order).
                condition.lock()
                parked.store(true, ordering: .sequentiallyConsistent)
                step = lastLook()
                var woken = false
                while case .empty = step {
                    condition.wait()
                    woken = true
                    step = next()
                }
                parked.store(false, ordering: .sequentiallyConsistent)
                condition.unlock()
                if woken {
                    // Ended by the store's signal (its time, read after the wait: the signal follows the
                    // store), or by `stop()` or a spurious wake-up (then now).
                    let signalled = signalledAt.load(ordering: .relaxed)
                    let end = signalled > idleSince ? signalled : DispatchTime.now().uptimeNanoseconds
                    policy.spellEndedParked(idle: end &- idleSince)
                    idleSince = 0
                }
            }
            if idleSince != 0 {
                // The spell ended in a look (or in the look before parking).
                policy.spellEndedInLook()
                idleSince = 0
            }
            switch step {
            case .bucket(let bucket):
                looks = 0
                work.withLock { $0 }?.seal(bucket)
            case .empty:
                continue  // not reached: the idle branch above leaves with a bucket or `.stop`, or continues
            case .stop:
                condition.lock()
                queue.withLock { $0.finished = true }
                condition.broadcast()
                condition.unlock()
                return
            }
        }
    }

    /// Puts the calling thread (the sealer's) under Linux's `SCHED_BATCH` policy, and returns 0 or the
    /// call's errno. The thread keeps its nice value and so its share of the CPU, but a wake-up of it never
    /// preempts a running thread of the normal policy: it runs when that thread blocks, or at the first
    /// tick after its slice ends, or on an idle core. No privilege is needed. Where the call is refused (a
    /// seccomp filter, gVisor) the thread stays as it was: seals as before, only the store tail below.
    /// `SCHED_RESET_ON_FORK`: a thread started from this one (by a user's log or metrics handler, say)
    /// starts under the normal policy.
    ///
    /// Why: with every core busy (on a 2-core machine, one core taken by another process), the storing
    /// thread and this one share a core, and each of this thread's wake-ups (a look after its sleep, or a
    /// store's signal) took the core from the storing thread at once, often in the middle of a store, for
    /// the rest of a seal: thousands of times per eviction-heavy run. As batch work it waits for the end of
    /// the storing thread's slice and seals what has queued meanwhile in one turn, about an eighth as many
    /// turns for about the same CPU; the store p99.9 with a core taken fell by about half, and nothing
    /// changed with a free core (docs/lab-notes/disk.md: the sealer as batch work).
    static func runAsBatchWork() -> Int32 {
        var parameters = sched_param()
        return sched_setscheduler(0, schedBatch | schedResetOnFork, &parameters) == 0 ? 0 : errno
    }

    /// `SCHED_BATCH` and `SCHED_RESET_ON_FORK` (3 and 0x40000000 in Linux's ABI, `<linux/sched.h>`;
    /// glibc's `<sched.h>` declares them for `_GNU_SOURCE` only, so Swift's Glibc module does not import
    /// them). `sched_getscheduler` reports the policy with the second ORed in.
    static let schedBatch: Int32 = 3
    static let schedResetOnFork: Int32 = 0x4000_0000

    /// What the thread's `runAsBatchWork()` returned (0, or the errno of a refused call); -1 before the
    /// thread has started (tests).
    var batchScheduling: Int32 { batchSchedulingResult.load(ordering: .acquiring) }

    /// Asks the thread to stop after the seal it is in, and waits until it has; nothing queued later
    /// runs.
    func stop() {
        condition.lock()
        let started = queue.withLock { queue -> Bool in
            queue.stopping = true
            return queue.started
        }
        condition.broadcast()
        if started {
            while !queue.withLock({ $0.finished }) { condition.wait() }
        }
        condition.unlock()
    }

    /// Seals finished so far (by any thread).
    var completed: UInt64 { completions.load(ordering: .acquiring) }

    /// Counts a finished seal and wakes the threads waiting for one.
    func noteCompleted() {
        finishedSeals.lock()
        completions.add(1, ordering: .releasing)
        finishedSeals.broadcast()
        finishedSeals.unlock()
    }

    /// Waits until more than `count` seals have finished.
    func waitForCompletion(after count: UInt64) {
        finishedSeals.lock()
        while completions.load(ordering: .acquiring) <= count { finishedSeals.wait() }
        finishedSeals.unlock()
    }
}
