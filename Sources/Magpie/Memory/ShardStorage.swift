import Glibc
import Synchronization

// MARK: - Shard storage: layout, invariants and the S3-FIFO policy
//
// A memory-tier shard is one `ShardStorage` behind its own lock (see `Shard`). Everything here runs
// with that lock held. Hits do not take it (Memory/LockFreeRead.swift): they read the index buckets and
// the entry blocks at the same time as the lock holder changes them, so those two, and nothing else here,
// are shared: buckets are atomic words, a block is immutable once indexed (but for two atomic bytes, see
// `EntryHeader`), and what is unlinked is retired, not freed (Support/ReadEpochs.swift).
//
// ### Layout
//
//   block    one malloc block per entry: an 8-byte `EntryHeader` (value length u32, key length u16,
//            frequency u8, state u8), then the key bytes, then the value bytes.
//   index    open addressing, 8-byte buckets: tag (hash >> 56) : 8 | distance from home : 8 |
//            block address : 48. 0 = empty. A hit costs two dependent memory reads: bucket, block.
//            One allocation with its mask in a 16-byte header (`IndexTable`), published to readers.
//   rings    two FIFOs of block pointers (8 B each): `small` and `main` (S3-FIFO's queues).
//   ghost    one UInt32 per index bucket: two ghosts (hashes evicted from `small`, and from `main`),
//            each a window over the last bytes it took in, 1/√2 to 2 budgets, self-tuned
//            (ShardStorage+Ghost.swift).
//   sketch   4 bytes per index bucket: 4-bit counters of misses per key and a doorkeeper
//            (FrequencySketch.swift).
//
// Per entry, at the index's maximum load (3/4): bucket 8/0.75 ≈ 11 B + ghost 4/0.75 ≈ 5 B + sketch
// 4/0.75 ≈ 6 B + ring 8 B + header 8 B + glibc's chunk header 8 B = 46 B, charged as
// ``MemoryTier/entryOverhead``.
// Not charged: index headroom below its maximum load (it doubles past 3/4), malloc's rounding of
// a chunk to 16 B, and blocks that have left the shard but wait for the lock-free readers that may still
// hold them (freed within a reclamation pass of their last reader unpinning; counted as
// ``MemoryTierStatistics/unreclaimedBytes``). The benchmark reports resident memory against the budget so the uncharged part
// is measured, not guessed.
//
// ### Index
//
// Linear probing from home = (hash >> 12) & mask (the low bits pick the shard). Each bucket records
// its distance from home, so deletion shifts later buckets of the run back (no tombstones) without
// reading any key, and a lookup that meets an empty bucket stops. A tag match is only a hint: a hit
// also compares the key's length and bytes in the block. Growing (x2 past 3/4 load, or when a run
// would exceed 255) re-hashes keys, once per doubling. Addresses must fit 48 bits (true of user-space
// pointers on x86-64 and arm64 Linux); a block outside that is freed and the store refused, never
// mis-indexed.
//
// ### Eviction: S3-FIFO with a CLOCK main queue and admission by miss count, byte-charged
//
// S3-FIFO (Yang et al., SOSP '23) with changes chosen by trace replay (docs/lab-notes/eviction.md): `main` keeps one
// reference bit (frequency cap 1: plain CLOCK) rather than two, which follows drifting popularity
// better; `small` is 1-25 % of the budget, its share tuned by the ghosts' hits as ARC tunes T1
// (ShardStorage+Sizing.swift); a new key may skip `small` when it was missed often enough for its size,
// by a threshold that tunes itself (ShardStorage+Admission.swift); and an entry over twice the mean
// charge earns a place from a ghost hit or a read only in proportion to its size (the size draw,
// ShardStorage+Sizing.swift).
//
//  - A hit sets frequency = 1: one byte store on the line already read. Nothing else: the miss counts
//    and the threshold's tuning happen under the lock, on stores.
//  - A new key goes to `main` when either ghost remembers its hash (within a window of evicted bytes
//    that tunes itself: ShardStorage+Ghost.swift) and, if it is large, the size draw lets it, or when the
//    sketch says it was missed often enough for its size (see "Admission"); else to `small`. A ghost hit
//    also moves `small`'s share.
//  - To make room: unless `main` is charged more than its share (the limit less `small`'s target)
//    or `small` is empty, pop `small`'s oldest until one is evicted: frequency > 0 moves it to `main`
//    (frequency reset), else it is evicted into the small ghost. Otherwise pop `main`'s oldest:
//    frequency > 0 re-queues it with frequency 0 (a large entry only by the size draw), else it is
//    evicted into the main ghost.
// Until 2026-11 `small`'s target adapted as ARC's does, with the two ghosts as ARC's B1 and B2, judged by
// every ghost hit; with admission by miss count, a fixed 1 % replayed better on 8 of the 12 budgets
// tried, worse on 3 (docs/lab-notes/eviction.md). It adapts again since 2026-11-28, judged only by ghost hits within
// `small`'s size of their eviction (the margin a change of the share would win or lose).
// Guarantees the tests rely on: an entry read since its insertion is never evicted straight out of
// `small`; an entry in `main` up to twice the mean charge is evicted only after `main` has rotated past
// it frequency + 1 times (a larger one may go at any pass, by the size draw);
// new keys that are never requested again (a scan) never hit a ghost and reach `main` only through a
// doorkeeper false positive (FrequencySketch.swift): none of a scan of up to about ten times a shard's
// entries, a few per cent of a longer one, which then turns `main` and can evict an idle hot set (a hot
// set still read keeps its reference bits and stays, but for entries over twice the mean charge, which
// the size draw may let go).
//
// ### Removal: dead blocks
//
// Removing or replacing an entry deletes its bucket at once (a read can no longer see it), but its
// block may still be in a ring. It is marked dead and stays charged, as it still holds memory, until
// its ring pops it (eviction frees dead blocks first) or the ring is compacted (when dead blocks
// outnumber live ones). A replacement is always a new block (a reader may be copying the old one). A large
// entry's block (see "Budget") is never left dead: it is taken out of its ring and freed at once, so
// that the room it borrowed goes back at once; that costs a scan of the ring's pointers (8 bytes per
// entry, no block read), less than copying the entry cost.
//
// ### Budget: a share, a limit, and lending (Support/BudgetPool.swift)
//
// State. `budget` is the shard's nominal share of the tier's budget (what `small`'s target and the
// ghosts are sized by, and what the shard holds when nothing is lent); `limit` is what it may charge
// now: the share, plus what it borrowed, less what it lent. The tier keeps a `pool` (an atomic) of
// budget no shard holds: the remainder of budget / shardCount at first, then room given back.
// `largeCharged` is the part of `charged` in large entries: those charged more than an eighth of the
// share. `largestCharge` is the share plus half of every other share.
//
// Invariants. `charged` (live and dead blocks) ≤ `limit` whenever the lock is free; Σ limits + pool +
// bytes in flight == the tier's budget, where bytes in flight have been taken off a limit and not yet
// added to the pool or to the borrower's limit, or taken from the pool and not yet added to a limit (a
// lender lowers its limit before the tier hands the bytes to the borrower; a borrower takes from the pool
// before it raises its limit), so the sum may fall short of the budget during a loan but never passes
// it; a lender's limit never falls below half its share. A shard raises its limit only with bytes it
// took from the pool or that others lent it, so the tier never charges more than its budget, not even
// during a store: room is made before a block is added.
//
// Rules.
//  - A small entry that does not fit under the limit of a shard at its share evicts here, touching
//    nothing shared (the fast path reads no atomic). A lender (limit below its share) first takes its
//    room back from the pool. A borrower (limit above its share) storing a small entry repays once room
//    is made: of what its large entries do not need (limit − share − largeCharged: room borrowed for an
//    entry that has gone, perhaps filled since with small ones), it evicts up to a slack (or the entry's
//    charge) and gives it back. The store's only added cost is one compare (limit > share).
//  - A large entry takes from the pool; if that is short, the shard reports the shortfall without
//    changing anything (the key's previous value included), and the tier, holding no shard's lock,
//    asks the other shards one lock at a time to lend their free room (handed to this shard, not through
//    the pool), nearest first, never below half their share; so a large store into a tier that has room
//    evicts nothing. When they have no free room, an entry that fits the shard's own limit is stored by
//    evicting here; a larger one makes every other shard evict an equal part (S3-FIFO order, each down to
//    half its share at most) and lend it. Retries are bounded (MemoryTier+Bytes.swift, withBorrowedRoom);
//    the last attempt (`.last`, which a shard treats as `.evict`) evicts or refuses.
//  - An entry charged more than `largestCharge` can never fit: it is refused at once, borrowing and
//    evicting nothing (and, as every refusal, removing the key's previous value).
//  - A shard above its share gives back what its limit holds beyond max(share, charge + slack) after a
//    store, a removal or a refusal; a large entry's block is freed as soon as the entry goes, so its
//    loan goes back at once. A lender takes its room back from the pool when it next needs room.
// The largest entry is thus `largestCharge`: at least half the budget, whatever the shard count
// (``MemoryTier/largestStorableValue``).

/// The 8-byte header at the start of every entry block. After it come the optional extras the state
/// flags announce (an 8-byte deadline, an 8-byte group hash, 16 bytes of freshness: fresh-until and
/// loaded-at, then the 16-byte coherence mark of a cache with a remote tier: its stamp and the version of
/// the remote write the copy holds), then the key, then the
/// value.
///
/// A block is written whole before it is published in the index and never changes after, but for two
/// bytes: `frequency` (set by lock-free hits, and by the policy under the lock) and the queue and dead
/// bits of `state` (written under the lock; a reader reads only the flag bits, which never change).
/// Both bytes are only ever accessed atomically (relaxed: plain byte loads and stores on x86), so a
/// value is a snapshot taken by ``init(of:)`` and changes go through ``setFrequency(_:_:)`` and
/// ``setState(_:_:)``.
struct EntryHeader {
    var valueLength: UInt32
    var keyLength: UInt16
    var frequency: UInt8
    /// Bit 0: the queue (1 small, 0 main); bit 1: has a coherence stamp (the instant a cache with a
    /// remote tier last knew the copy current: Remote/Coherence.swift); bit 2: has a deadline; bit 3:
    /// has a group; bit 4: a placeholder (the value is charged but not stored: trace replay only); bit
    /// 5: has freshness (a fresh-until and a loaded-at instant); bit 6: negative (the loader found no
    /// value: only the loader API serves it); bit 7: dead.
    var state: UInt8

    static let small: UInt8 = 1
    static let main: UInt8 = 0
    static let queueMask: UInt8 = 0x01
    static let stampFlag: UInt8 = 0x02
    static let expiryFlag: UInt8 = 0x04
    static let groupFlag: UInt8 = 0x08
    static let placeholderFlag: UInt8 = 0x10
    static let freshnessFlag: UInt8 = 0x20
    static let negativeFlag: UInt8 = 0x40
    static let deadFlag: UInt8 = 0x80
    /// The flags that make a plain read look closer (expiry) or refuse the entry (placeholder,
    /// negative): one mask test on the hit path.
    static let plainReadCheckFlags: UInt8 = expiryFlag | placeholderFlag | negativeFlag

    init(valueLength: UInt32, keyLength: UInt16, frequency: UInt8, state: UInt8) {
        self.valueLength = valueLength
        self.keyLength = keyLength
        self.frequency = frequency
        self.state = state
    }

    /// The header of `block`, read field by field (the two mutable bytes atomically).
    @inline(__always)
    init(of block: UnsafeMutableRawPointer) {
        valueLength = block.load(as: UInt32.self)
        keyLength = block.load(fromByteOffset: 4, as: UInt16.self)
        frequency = Self.frequencyCell(block).pointee.load(ordering: .relaxed)
        state = Self.stateCell(block).pointee.load(ordering: .relaxed)
    }

    /// Writes this header at the start of a new block, before the block is published.
    @inline(__always)
    func write(to block: UnsafeMutableRawPointer) {
        block.storeBytes(of: valueLength, as: UInt32.self)
        block.storeBytes(of: keyLength, toByteOffset: 4, as: UInt16.self)
        Self.frequencyCell(block).pointee.store(frequency, ordering: .relaxed)
        Self.stateCell(block).pointee.store(state, ordering: .relaxed)
    }

    @inline(__always)
    static func frequencyCell(_ block: UnsafeMutableRawPointer) -> UnsafeMutablePointer<Atomic<UInt8>> {
        (block + 6).assumingMemoryBound(to: Atomic<UInt8>.self)
    }

    @inline(__always)
    static func stateCell(_ block: UnsafeMutableRawPointer) -> UnsafeMutablePointer<Atomic<UInt8>> {
        (block + 7).assumingMemoryBound(to: Atomic<UInt8>.self)
    }

    @inline(__always)
    static func setFrequency(_ block: UnsafeMutableRawPointer, _ frequency: UInt8) {
        frequencyCell(block).pointee.store(frequency, ordering: .relaxed)
    }

    /// Writes a block's state (under the shard's lock; only the queue and dead bits ever change).
    @inline(__always)
    static func setState(_ block: UnsafeMutableRawPointer, _ state: UInt8) {
        stateCell(block).pointee.store(state, ordering: .relaxed)
    }

    var isDead: Bool { state & EntryHeader.deadFlag != 0 }
    var queue: UInt8 { state & EntryHeader.queueMask }
    var hasExpiry: Bool { state & EntryHeader.expiryFlag != 0 }
    var hasGroup: Bool { state & EntryHeader.groupFlag != 0 }
    var isPlaceholder: Bool { state & EntryHeader.placeholderFlag != 0 }
    var isNegative: Bool { state & EntryHeader.negativeFlag != 0 }
    var hasFreshness: Bool { state & EntryHeader.freshnessFlag != 0 }
    var hasStamp: Bool { state & EntryHeader.stampFlag != 0 }

    /// The bytes of the extras `flags` announce: 8 per deadline and group hash, 16 for freshness and for
    /// the stamp with its version (branch-free: bits 1, 2, 3 and 5 shifted into place).
    @inline(__always)
    static func extrasLength(flags: UInt8) -> Int {
        let bits = Int(flags)
        return (bits & Int(stampFlag)) << 3 + (bits & Int(expiryFlag)) << 1 + (bits & Int(groupFlag)) + (bits & Int(freshnessFlag)) >> 1
    }

    /// Where the key starts, from the block's start.
    var keyOffset: Int {
        @inline(__always) get { ShardStorage.headerSize + Self.extrasLength(flags: state) }
    }
    /// Where the group hash lies, from the block's start (valid when `hasGroup`).
    var groupOffset: Int { ShardStorage.headerSize + (hasExpiry ? 8 : 0) }
    /// Where fresh-until and loaded-at lie, from the block's start (valid when `hasFreshness`).
    var freshnessOffset: Int { ShardStorage.headerSize + (hasExpiry ? 8 : 0) + (hasGroup ? 8 : 0) }
    /// Where the coherence stamp lies, from the block's start (valid when `hasStamp`), the version right
    /// after it: the last extra.
    var stampOffset: Int { keyOffset - 16 }
    /// The bytes after the header: extras, key and value. The entry is charged this + the overhead.
    var storedLength: Int { Self.extrasLength(flags: state) + Int(keyLength) + Int(valueLength) }
}

/// The outcome of ``ShardStorage/store(hash:key:value:)``.
enum StoreOutcome: Equatable {
    case inserted, updated, refused
    /// Not stored, nothing changed: the shard lacked room (only with ``RoomPolicy/borrow``).
    case short(Shortfall)
}

struct ShardStorage: ~Copyable {
    /// The shard's nominal share of the tier's budget.
    let budget: Int
    let hasher: KeyHash
    let clock: CacheClock

    /// Charges of live and dead blocks.
    var charged = 0
    /// The part of `charged` in dead blocks: entries removed or replaced whose ring has not popped or
    /// compacted them yet (at most half a ring's blocks once it holds more than 32 dead ones,
    /// EntryRing.needsCompaction; their charge may be more than half of it).
    var deadCharged = 0
    /// Charges of live entries: what the policy's mean charge is taken over (liveCharged / count).
    var liveCharged: Int { charged - deadCharged }
    /// The part of `charged` in `small`.
    var smallCharged = 0
    /// Live entries (those in the index).
    var count = 0

    /// The current index table (see `IndexTable`), its buckets and their mask. Readers reach it through
    /// `published`; the shard keeps these copies for itself.
    var table: UnsafeMutableRawPointer
    var index: UnsafeMutablePointer<Atomic<UInt64>>
    var indexMask: Int
    /// Where lock-free readers find the current table: one 64-byte line of its own (the storage's lines
    /// change on every store; this one only when the table is replaced).
    let published: UnsafeMutablePointer<Atomic<UInt>>
    /// Blocks and tables unlinked but not yet freed (Support/ReadEpochs.swift).
    var retired = RetiredBlocks()
    /// As many slots as `index` has buckets (see ShardStorage+Ghost.swift).
    var ghost: UnsafeMutablePointer<UInt32>
    let ghostShift: Int
    var smallGhost = GhostWindow()
    var mainGhost = GhostWindow()
    /// Misses counted per key (FrequencySketch.swift), sized with the index.
    var sketch: FrequencySketch
    /// θ and what tunes it (ShardStorage+Admission.swift).
    var admission = AdmissionControl()
    /// The ghosts' window and what tunes it (ShardStorage+Ghost.swift).
    var ghostControl: GhostWindowControl

    var small: EntryRing
    var main: EntryRing

    var counters = MemoryTierStatistics()

    // Last, so that the fields a hit reads keep their place in the shard's cache lines.
    /// What the shard may charge now (see "Budget" above).
    var limit: Int
    /// The tier's pool of unlent budget; nil: the shard keeps to its budget alone.
    let pool: BudgetPool?
    /// The most its limit can reach (its share and all that the others may lend): a larger entry is
    /// refused without borrowing.
    let largestCharge: Int
    /// The part of `charged` in large entries (see ``isLarge(_:)``; their blocks are never left dead).
    var largeCharged = 0
    /// `small`'s share and target, and what tunes them, and the size draw (ShardStorage+Sizing.swift).
    var smallShare: SmallShareControl
    var sizeDraw = SizeDraw()

    static let initialBuckets = 64
    static let initialRing = 32
    static let frequencyCap: UInt8 = 1
    static let headerSize = MemoryLayout<EntryHeader>.stride

    /// Creates empty storage; nil when the initial arrays (about 1.6 KiB) cannot be allocated.
    init?(budget: Int, hasher: KeyHash, clock: CacheClock, pool: BudgetPool? = nil, largestCharge: Int? = nil) {
        guard let table = IndexTable.allocate(buckets: Self.initialBuckets) else { return nil }
        var line: UnsafeMutableRawPointer? = nil
        guard posix_memalign(&line, 64, 64) == 0, let line else {
            free(table)
            return nil
        }
        guard let ghost = allocateZeroed(UInt32.self, Self.initialBuckets) else {
            free(table); free(line)
            return nil
        }
        guard let sketch = FrequencySketch(buckets: Self.initialBuckets) else {
            free(table); free(line); free(ghost)
            return nil
        }
        let small = EntryRing(capacity: Self.initialRing)
        let main = EntryRing(capacity: Self.initialRing)
        guard let small, let main else {
            free(table); free(line); free(ghost)
            sketch.release()
            small?.release(); main?.release()  // the one that was allocated
            return nil
        }
        self.sketch = sketch
        published = line.bindMemory(to: Atomic<UInt>.self, capacity: 1)
        published.pointee.store(UInt(bitPattern: table), ordering: .releasing)
        self.table = table
        self.budget = budget
        self.limit = budget
        self.pool = pool
        self.largestCharge = largestCharge ?? budget
        self.smallShare = SmallShareControl(budget: budget)
        self.hasher = hasher
        self.clock = clock
        self.index = IndexTable.buckets(table)
        self.indexMask = Self.initialBuckets - 1
        self.ghost = ghost
        self.ghostShift = Self.ghostShift(budget: budget)
        self.ghostControl = GhostWindowControl(budgetUnits: Self.ghostBudgetUnits(budget: budget, shift: ghostShift))
        self.small = small
        self.main = main
    }

    deinit {
        small.freeAllBlocks()
        main.freeAllBlocks()
        small.release(); main.release()
        // No reader holds anything: the tier that owns this shard is being destroyed.
        retired.freeAll()
        free(table); free(ghost); free(published)
        sketch.release()
    }

    /// The charge of an entry storing `storedLength` bytes after its header.
    @inline(__always)
    static func charge(storedLength: Int) -> Int {
        storedLength &+ MemoryTier.entryOverhead
    }

    /// The deadline (ms since 1970) of a block whose header has the expiry flag.
    @inline(__always)
    static func deadline(of block: UnsafeMutableRawPointer) -> Int64 {
        block.loadUnaligned(fromByteOffset: headerSize, as: Int64.self)
    }

    /// Whether a block's entry has expired at `now`.
    @inline(__always)
    static func isExpired(_ block: UnsafeMutableRawPointer, _ header: EntryHeader, now: Int64) -> Bool {
        header.hasExpiry && deadline(of: block) <= now
    }

    // MARK: Entry lifecycle

    /// Counts a refused store. When it was meant to replace a value, that value is already gone, and
    /// is counted as removed so that `entries == inserts - removals - evictions` always holds.
    mutating func refuse(droppedPrevious: Bool) -> StoreOutcome {
        counters.refusals &+= 1
        if droppedPrevious { counters.removals &+= 1 }
        returnSurplus(keeping: 0)  // what this store borrowed
        return .refused
    }

    @inline(__always)
    mutating func addCharge(_ charge: Int, queue: UInt8) {
        charged += charge
        if queue == EntryHeader.small { smallCharged += charge }
        if isLarge(charge) { largeCharged += charge }
    }

    /// Releases a block that has left both the index and its ring, and its charge: the block is freed
    /// once no lock-free reader can hold it (Support/ReadEpochs.swift).
    @inline(__always)
    mutating func release(_ block: UnsafeMutableRawPointer, charge: Int, fromSmall: Bool) {
        retired.retire(block, bytes: charge)
        charged -= charge
        if fromSmall { smallCharged -= charge }
        if isLarge(charge) { largeCharged -= charge }
    }
}

@inline(__always)
func copyBytes(_ source: UnsafeRawBufferPointer, to destination: UnsafeMutableRawPointer) {
    if let base = source.baseAddress, !source.isEmpty { memcpy(destination, base, source.count) }
}
