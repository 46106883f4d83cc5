import Synchronization

// When a local copy may be served, in a cache with a remote tier.
//
// Every value the cache keeps locally (memory or disk) starts with an 8-byte stamp: the instant (ms,
// cache clock) from which the copy is known to match the store — its own store, or the start of the
// fetch that brought it. A copy stamped `s` is served at `now` only while
//
//     s > floor   and   now − max(s, confirmed) < bound
//
// `confirmed` is the latest instant through which the store has confirmed that every change was
// reported (and applied here: confirmations are applied in order after the invalidations before them).
// `floor` moves to `now` whenever changes may have been missed (the feed was re-established, or
// everything changed): every older copy is then a miss, lazily, without a scan. `bound` is
// ``RemoteTierOptions/maxDisconnectedStaleness``.
//
// A fetch races the invalidation of the key it fetches: the reply may carry the old value while the
// invalidation has already been applied. So each key hash maps to one of 4,096 change counters, bumped
// by an invalidation (and by this cache's own writes) before the local copies go; a fetched value is
// kept locally only if its counter did not move during the fetch (checked under the key's stripe).
//
// A fetch also races this cache's own writes, which hold no lock across their round trip: a fetch that
// starts after a write's local store, but before the write reaches the store, reads the older value.
// So each slot also counts the writes of its keys under way (from before the local store until the
// store answered); a fetched value is kept only while none is, and each write bumps the change counter
// at its start and at its end, so a fetch that overlapped either end is not kept either.

final class Coherence: Sendable {
    let bound: Int64
    let floor = Atomic<Int64>(0)
    let confirmed = Atomic<Int64>(0)
    /// Bumped whenever a cached token may have changed ("g" or "a" invalidated, or everything).
    let tokenGeneration = Atomic<UInt64>(0)
    /// Per slot: changes of its keys (invalidations, and this cache's writes at their start and end).
    private let changes: InlineArray<4096, Atomic<UInt32>>
    /// Per slot: writes of its keys under way.
    private let writing: InlineArray<4096, Atomic<UInt32>>
    static let counterCount = 4096

    // Statistics.
    let invalidations = Atomic<UInt64>(0)
    let epochBumps = Atomic<UInt64>(0)
    let lastLag = Atomic<Int64>(0)
    let maxLag = Atomic<Int64>(0)
    let confirmations = Atomic<UInt64>(0)

    init(bound: Duration) {
        self.bound = max(1, bound.wholeMilliseconds)
        changes = InlineArray { _ in Atomic(0) }
        writing = InlineArray { _ in Atomic(0) }
    }

    /// Whether a copy stamped `stamp` may be served at `now`.
    @inline(__always)
    func servable(stamp: Int64, now: Int64) -> Bool {
        stamp > floor.load(ordering: .acquiring) && now - max(stamp, confirmed.load(ordering: .acquiring)) < bound
    }

    /// Whether the feed is confirmed recently enough that a fetched value may be kept locally.
    func confirmedRecently(now: Int64) -> Bool {
        now - confirmed.load(ordering: .acquiring) < bound
    }

    @inline(__always)
    private static func slot(_ hash: UInt64) -> Int { Int(truncatingIfNeeded: hash & UInt64(counterCount - 1)) }

    // The slots are atomics, not a table under a lock: a fetch reads a counter before it starts and
    // checks it again, with the key's stripe held, before it keeps its value; an invalidation bumps the
    // counter before it takes the stripe to drop the copies; a write bumps `changes` before it moves
    // `writing`, at its start and at its end, so a check that sees `writing` back at 0 also sees the
    // bump. Sequentially consistent, as the checks read two slots.

    func counter(_ hash: UInt64) -> UInt32 {
        changes[Self.slot(hash)].load(ordering: .sequentiallyConsistent)
    }

    func bump(_ hash: UInt64) {
        changes[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
    }

    /// A write of a key with this hash starts (before its local store).
    func beginWrite(_ hash: UInt64) {
        changes[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
        writing[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
    }

    /// The write ended (the store answered, or the call failed).
    func endWrite(_ hash: UInt64) {
        changes[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
        writing[Self.slot(hash)].subtract(1, ordering: .sequentiallyConsistent)
    }

    /// Whether a value fetched when the counter read `counter` may be kept locally now: nothing changed
    /// the slot since, and no write of its keys is under way.
    func keepable(_ hash: UInt64, since counter: UInt32) -> Bool {
        writing[Self.slot(hash)].load(ordering: .sequentiallyConsistent) == 0
            && changes[Self.slot(hash)].load(ordering: .sequentiallyConsistent) == counter
    }

    /// Every local copy stamped up to `now` is a miss from now on.
    func raiseFloor(to now: Int64) {
        floor.raise(to: now)
        tokenGeneration.add(1, ordering: .acquiringAndReleasing)
        epochBumps.add(1, ordering: .relaxed)
    }

    func confirm(through instant: Int64, now: Int64) {
        confirmed.raise(to: instant)
        let lag = max(0, now - instant)
        lastLag.store(lag, ordering: .relaxed)
        if lag > maxLag.load(ordering: .relaxed) { maxLag.store(lag, ordering: .relaxed) }
        confirmations.add(1, ordering: .relaxed)
    }
}
