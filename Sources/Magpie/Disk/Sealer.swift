import Foundation
import Synchronization

// MARK: - The sealer: one thread that writes detached memtables, off the stores' path
//
// A store that detaches its bucket's active memtable (Disk/Bucket+Seal.swift) queues the bucket here
// and returns; this thread takes buckets in order and seals their memtables (compression, hashing and,
// mostly, the file write outside the bucket's lock: Bucket+Seal.swift, Bucket+Flight.swift). It starts at the first queued bucket (a tier that is
// only read never starts it) and stops when the tier closes (after the seal it is in; `close()` writes
// what is left itself) or is released.
//
// Waiting: a store that finds its bucket's two memtables taken, and `writeBuffers`/`flush`, wait for the
// seal of a memtable another thread has claimed with ``waitForCompletion(after:)``: a count of finished
// seals under a condition, read before the caller looked at the bucket, so that a seal finishing in
// between is never missed. No lock is held across the wait, and none of the bucket locks is ever taken
// with the condition's held.

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

    private let condition = NSCondition()
    private let queue: Locked<Queue>
    private let finishedSeals = NSCondition()
    private let completions = Atomic<UInt64>(0)
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

    /// A sealer for `bucketCount` buckets.
    init(bucketCount: Int) {
        queue = Locked(Queue(queued: [Bool](repeating: false, count: bucketCount)))
    }

    /// Sets what sealing a bucket is (before the first `enqueue`); nil once the thread is stopped.
    func setWork(_ work: (@Sendable (Int) -> Void)?) {
        let boxed = work.map(Work.init)
        self.work.withLock { $0 = boxed }
    }

    /// Queues bucket `number` (once: a bucket already queued is not queued twice).
    func enqueue(_ number: Int) {
        condition.lock()
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
        }
        condition.signal()
        condition.unlock()
    }

    private func run() {
        IOThreadPool.nameCurrentThread("magpie-io-sealer")
        while true {
            condition.lock()
            var next: Int? = nil
            while next == nil {
                let (bucket, stop) = queue.withLock { queue -> (Int?, Bool) in
                    if queue.stopping { return (nil, true) }
                    guard queue.head < queue.buckets.count else { return (nil, false) }
                    let bucket = queue.buckets[queue.head]
                    queue.head += 1
                    if queue.head > 1024 && queue.head * 2 > queue.buckets.count {
                        queue.buckets.removeFirst(queue.head)
                        queue.head = 0
                    }
                    queue.queued[bucket] = false
                    return (bucket, false)
                }
                if stop {
                    queue.withLock { $0.finished = true }
                    condition.broadcast()
                    condition.unlock()
                    return
                }
                if let bucket { next = bucket } else { condition.wait() }
            }
            condition.unlock()
            work.withLock { $0 }?.seal(next!)
        }
    }

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
