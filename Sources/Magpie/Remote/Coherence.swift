import Synchronization

// When a local copy may be served, in a cache with a remote tier.
//
// Every value the cache keeps locally (memory or disk) carries a coherence stamp beside it (a memory
// entry's extras, a disk record's field): the instant `s` (ms, cache clock) from which the copy is known
// to match the store — its own store, the start of the fetch that brought it, or the change message that
// pushed it — in its top 50 bits, and the copy's partition `p` (the store's partition of its key) in the
// low 14. A copy is served at `now` only while
//
//     s > floor   and   s > floor[p]   and   now − min(max(s, confirmed), delivered) < bound
//
// `confirmed` is the latest instant through which the store has confirmed that every change was
// reported (and applied here: confirmations are applied in order after the messages before them).
// `floor` moves to `now` whenever changes may have been missed everywhere (the feed was re-established,
// or everything changed), `floor[p]` when they may have been missed in partition `p` only (a gap in its
// sequence, a heartbeat of its feed lost, a check of the sequences that found it short): every older
// copy is then a miss, lazily, without a scan. `bound` is ``RemoteTierOptions/maxDisconnectedStaleness``.
//
// Each partition's change messages are numbered 1, 2, 3, … by the store, in the order the writes took
// effect, and reported in that order. A message whose number is more than one above the last one seen
// means the ones between were missed: `floor[p]` moves. A message lost at the end of a partition's
// sequence leaves no gap to see; the store's checks find it (the total it reports with a confirmation,
// and the numbers it reads when that total is short: `sequences`).
//
// `delivered` is the fleet's delivery watermark: every write that any instance sharing the store
// returned to its callers before it has reached the store. A write made while the store could not be
// reached returns (owed, replayed later); until it lands, neither a local copy nor the store's value of
// its key may be trusted by another instance, however recently that instance's feed was confirmed. Each
// instance publishes the instant before which all of its own writes reached the store (its writes under
// way and its owed removals hold it back; `deliveredThrough()` below), and the store reports the least
// over the instances it waits for (MagpieRedis: with each heartbeat). A store that reports none leaves
// it at `Int64.max`: no constraint.
//
// A fetch races the invalidation of the key it fetches: the reply may carry the old value while the
// invalidation has already been applied. So each key hash maps to one of 4,096 slots of change counters,
// bumped by an invalidation (and by this cache's own writes) before the local copies go; a fetched value
// is kept locally only if its slot's counters did not move during the fetch (checked under the key's
// stripe). A change message that carries its write's version moves a counter of its own and raises the
// slot's newest version first: a fetch that overlapped only such messages still keeps a value at least
// as new as all of them (the usual race: the reply and the message of the very write it read arrive
// together). A change without a version (an invalidation of a foreign write, a refused write of this
// cache) and this cache's own writes move the other counter, which no version excuses.
//
// A fetch also races this cache's own writes, which hold no lock across their round trip: a fetch that
// starts after a write's local store, but before the write reaches the store, reads the older value.
// So each slot also counts the writes of its keys under way (from before the local store until the
// store answered); a fetched value is kept only while none is, and each write bumps the change counter
// at its start and at its end, so a fetch that overlapped either end is not kept either.

final class Coherence: Sendable {
    let bound: Int64
    let floor = Atomic<Int64>(0)
    /// Per partition: copies stamped up to it are misses.
    private let floors: InlineArray<16384, Atomic<Int64>>
    /// Each partition's last sequence number seen, their sum, and whether a check of them is wanted:
    /// changed on the coherence thread only (in the order the store reported).
    private let sequences = Locked(Sequences())

    private struct Sequences {
        var last = [UInt64](repeating: 0, count: RemoteChanges.maximumPartitions)
        var sum: UInt64 = 0
        var wanted = false
        /// Whether every partition's numbering is known to start at 0 (the store's numbers restarted, and
        /// this is the first of them seen): a first number above 1 then means some were missed, where
        /// after the feed's own start the first number seen only says where it continues.
        var fromZero = false
        /// Confirmations withheld because their total was short (oldest first): each is taken once a
        /// check has brought the numbers up to its total (every message before it then seen, or its
        /// partition's copies dropped).
        var withheld: [(instant: Int64, total: UInt64)] = []

        /// The latest withheld confirmation the numbers now cover, if any (it and those before it go).
        mutating func settled() -> Int64? {
            guard let index = withheld.lastIndex(where: { $0.total <= sum }) else { return nil }
            let instant = withheld[index].instant
            withheld.removeFirst(index + 1)
            return instant
        }

        /// Takes in partition `p`'s number `n`; whether numbers before it were missed.
        mutating func take(_ p: Int, _ n: UInt64) -> Bool {
            guard n > last[p] else { return false }
            let missed = (last[p] != 0 || fromZero) && n > last[p] + 1
            sum += n - last[p]
            last[p] = n
            return missed
        }
    }

    static let partitionBits: Int64 = 14
    private static let partitionMask: Int64 = (1 << partitionBits) - 1

    /// The stamp of a copy known to match the store from `instant` on, in `partition`.
    @inline(__always)
    static func stamp(at instant: Int64, partition: Int) -> Int64 {
        max(1, instant) << partitionBits | (Int64(partition) & partitionMask)
    }

    /// The instant a stamp says its copy was known current.
    @inline(__always)
    static func instant(of stamp: Int64) -> Int64 { stamp >> partitionBits }
    let confirmed = Atomic<Int64>(0)
    /// The fleet's delivery watermark (see above); `Int64.max` until the store reports one.
    let delivered = Atomic<Int64>(.max)
    /// This cache's writes under way (from before the local store until the store answered), by the
    /// instant each began: what holds back the watermark this cache publishes.
    private let underWay = Locked<[Int64: Int]>([:])
    /// Bumped whenever a cached token may have changed ("g" or "a" invalidated, or everything).
    let tokenGeneration = Atomic<UInt64>(0)
    /// Per slot: changes of its keys without a version (invalidations, and this cache's writes at their
    /// start and end).
    private let changes: InlineArray<4096, Atomic<UInt32>>
    /// Per slot: change messages of its keys that carried their write's version.
    private let versionedChanges: InlineArray<4096, Atomic<UInt32>>
    /// Per slot: the newest version a change message of its keys carried (raised before
    /// `versionedChanges` moves).
    private let newest: InlineArray<4096, Atomic<UInt64>>
    /// Per slot: writes of its keys under way.
    private let writing: InlineArray<4096, Atomic<UInt32>>
    static let counterCount = 4096

    // Statistics.
    let invalidations = Atomic<UInt64>(0)
    /// Gaps seen in a partition's sequence.
    let gaps = Atomic<UInt64>(0)
    /// Partitions a check of the store's numbers found short.
    let shortChecks = Atomic<UInt64>(0)
    /// Times partitions' copies were made misses (a gap, a lost heartbeat, a short check).
    let partitionLosses = Atomic<UInt64>(0)
    let epochBumps = Atomic<UInt64>(0)
    /// Times the store's numbering restarted at 0 (its counters were lost, evicted).
    let sequenceRestarts = Atomic<UInt64>(0)
    let lastLag = Atomic<Int64>(0)
    let maxLag = Atomic<Int64>(0)
    let confirmations = Atomic<UInt64>(0)

    init(bound: Duration) {
        self.bound = max(1, bound.wholeMilliseconds)
        changes = InlineArray { _ in Atomic(0) }
        versionedChanges = InlineArray { _ in Atomic(0) }
        newest = InlineArray { _ in Atomic(0) }
        writing = InlineArray { _ in Atomic(0) }
        floors = InlineArray { _ in Atomic(0) }
    }

    /// Whether a copy stamped `stamp` may be served at `now`.
    @inline(__always)
    func servable(stamp: Int64, now: Int64) -> Bool {
        let since = Self.instant(of: stamp)
        return since > floor.load(ordering: .acquiring) && since > floors[Int(stamp & Self.partitionMask)].load(ordering: .acquiring)
            && now - min(max(since, confirmed.load(ordering: .acquiring)), delivered.load(ordering: .acquiring)) < bound
    }

    /// Every local copy of these partitions stamped up to `now` is a miss from now on.
    func lose(partitions: some Sequence<Int>, now: Int64) {
        for partition in partitions where partition >= 0 && partition < RemoteChanges.maximumPartitions {
            floors[partition].raise(to: now)
        }
        tokenGeneration.add(1, ordering: .acquiringAndReleasing)  // a token's key may be in one of them
        partitionLosses.add(1, ordering: .relaxed)
    }

    /// A change message's place in its partition: raises the partition's floor when numbers before it were
    /// missed; whether they were.
    func sequenced(partition: Int, sequence: UInt64, now: Int64) -> Bool {
        guard sequence != 0, partition >= 0, partition < RemoteChanges.maximumPartitions else { return false }
        guard sequences.withLock({ $0.take(partition, sequence) }) else { return false }
        gaps.add(1, ordering: .relaxed)
        lose(partitions: [partition], now: now)
        return true
    }

    /// The store's numbers, read after every message published before them was reported: each partition
    /// that had not reached its number missed messages (its floor rises). Then the confirmations withheld
    /// for a short total that the numbers now cover are taken.
    func check(_ numbers: [Int: UInt64], now: Int64) {
        let (short, settled) = sequences.withLock { sequences -> ([Int], Int64?) in
            sequences.wanted = false
            var short: [Int] = []
            for (partition, number) in numbers where partition >= 0 && partition < RemoteChanges.maximumPartitions {
                guard number > sequences.last[partition] else { continue }
                short.append(partition)
                _ = sequences.take(partition, number)
            }
            return (short, sequences.settled())
        }
        if !short.isEmpty {
            shortChecks.add(UInt64(short.count), ordering: .relaxed)
            lose(partitions: short, now: now)
        }
        // After the floors: a copy of a partition found short is a miss before the bound moves on.
        if let settled { confirm(through: settled, now: now) }
    }

    /// The total the store reported with a confirmation, against the numbers seen: when they fall short,
    /// a check of every partition's number is wanted (``sequencesWanted``), and true is returned: the
    /// confirmation must not be taken, as a message published before it was missed in a partition not
    /// known yet (its copies would stay servable past the bound until the check found it).
    /// The confirmation is kept (`instant`) and taken once a check covers its total.
    func check(total: UInt64, instant: Int64) -> Bool {
        sequences.withLock { sequences in
            guard sequences.sum < total else {
                sequences.withheld.removeAll { $0.instant <= instant }
                return false
            }
            sequences.wanted = true
            if sequences.withheld.count >= 16 { sequences.withheld.removeFirst() }
            sequences.withheld.append((instant, total))
            return true
        }
    }

    /// The feed restarted (or everything changed): numbering starts over. The store's numbers may have
    /// restarted too (a server that lost its data counts from 1 again), and a number at or below the last
    /// one seen would hide every gap after it. The next total then falls short of what is seen, and the
    /// check that follows drops the copies of every partition whose messages were not all seen since.
    func restartSequences() {
        sequences.withLock { $0 = Sequences() }
    }

    /// The store's numbering restarted at 0 (its counters were lost, evicted, and made anew), and nothing
    /// of the new numbering was reported yet: every partition counts from 0 again, and its first number
    /// seen above 1 is a gap; the numbers read later (``check(_:now:)``) and the totals count from 0 too.
    /// No copy is dropped for it.
    ///
    /// A message of the old numbering lost unseen after the last total this cache checked is found by
    /// nothing (no number or total of the old numbering comes after it). On a single server messages are
    /// lost only with the subscription, which drops every copy, so only an injected loss (the test hook
    /// `dropChangeMessages`) meets this. Dropping the copies at each restart closed it, and left none on a
    /// Redis that evicts the counters over and over (`maxmemory 2mb`, `allkeys-lru`: 0.07 × the
    /// hand-built pattern); deferring the drop by three quarters of the bound kept too few (0.08 ×).
    /// See docs/lab-notes/fleet.md.
    func restartSequencesFromZero() {
        sequences.withLock { sequences in
            sequences = Sequences()
            sequences.fromZero = true
        }
        sequenceRestarts.add(1, ordering: .relaxed)
    }

    /// Whether a check of the partitions' numbers is wanted.
    var sequencesWanted: Bool { sequences.withLock { $0.wanted } }

    /// Whether the feed is confirmed recently enough that a fetched value may be kept locally.
    func confirmedRecently(now: Int64) -> Bool {
        now - min(confirmed.load(ordering: .acquiring), delivered.load(ordering: .acquiring)) < bound
    }

    /// Whether a value the store gave may be served at `now`, for a fetch that started when the
    /// watermark read `watermark`: every write returned more than the bound ago had reached the store
    /// before the fetch began.
    func deliveredRecently(_ watermark: Int64, now: Int64) -> Bool {
        now - watermark < bound
    }

    @inline(__always)
    private static func slot(_ hash: UInt64) -> Int { Int(truncatingIfNeeded: hash & UInt64(counterCount - 1)) }

    // The slots are atomics, not a table under a lock: a fetch reads a counter before it starts and
    // checks it again, with the key's stripe held, before it keeps its value; an invalidation bumps the
    // counter before it takes the stripe to drop the copies; a write bumps `changes` before it moves
    // `writing`, at its start and at its end, so a check that sees `writing` back at 0 also sees the
    // bump. Sequentially consistent, as the checks read two slots.

    /// A slot's counters, read before a fetch and passed to ``keepable(_:since:version:)``.
    struct Count: Equatable {
        var unversioned: UInt32
        var versioned: UInt32
    }

    func counter(_ hash: UInt64) -> Count {
        let slot = Self.slot(hash)
        return Count(
            unversioned: changes[slot].load(ordering: .sequentiallyConsistent),
            versioned: versionedChanges[slot].load(ordering: .sequentiallyConsistent))
    }

    /// A change of a key with this hash: a message carrying its write's `version`, or 0 when the change
    /// has none.
    func bump(_ hash: UInt64, version: UInt64 = 0) {
        let slot = Self.slot(hash)
        guard version != 0 else {
            changes[slot].add(1, ordering: .sequentiallyConsistent)
            return
        }
        newest[slot].max(version, ordering: .sequentiallyConsistent)
        versionedChanges[slot].add(1, ordering: .sequentiallyConsistent)
    }

    /// A write of a key with this hash starts at `now` (before its local store); pass `now` to
    /// ``endWrite(_:began:)``.
    func beginWrite(_ hash: UInt64, now: Int64) {
        underWay.withLock { $0[now, default: 0] += 1 }
        changes[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
        writing[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
    }

    /// The write that began at `began` ended (the store answered, or the call failed and the key is
    /// owed a removal: owed *before* this call, so the watermark never passes the write).
    func endWrite(_ hash: UInt64, began: Int64) {
        changes[Self.slot(hash)].add(1, ordering: .sequentiallyConsistent)
        writing[Self.slot(hash)].subtract(1, ordering: .sequentiallyConsistent)
        underWay.withLock { underWay in
            guard let count = underWay[began] else { return }
            underWay[began] = count > 1 ? count - 1 : nil
        }
    }

    /// The instant the oldest write under way began, nil when none is.
    func oldestWriteUnderWay() -> Int64? {
        underWay.withLock { $0.keys.min() }
    }

    /// Whether a value of `version` (0: none) fetched when the counters read `count` may be kept locally
    /// now: no write of the slot's keys is under way, no change without a version came since, and every
    /// versioned message since carried `version` or an older one (a message of another key of the slot
    /// counts too: such a fetch is not kept, never wrongly kept).
    func keepable(_ hash: UInt64, since count: Count, version: UInt64) -> Bool {
        let slot = Self.slot(hash)
        guard writing[slot].load(ordering: .sequentiallyConsistent) == 0,
            changes[slot].load(ordering: .sequentiallyConsistent) == count.unversioned
        else { return false }
        // `newest` is read after the counter: it covers at least every message the counter counted.
        return versionedChanges[slot].load(ordering: .sequentiallyConsistent) == count.versioned
            || version != 0 && newest[slot].load(ordering: .sequentiallyConsistent) <= version
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
