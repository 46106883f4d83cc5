import Glibc

// MARK: - Shard storage: layout, invariants and the S3-FIFO policy
//
// A memory-tier shard is one `ShardStorage` behind its own lock (see `Shard`). Everything here runs
// with that lock held, so nothing in this file is atomic and nothing is shared.
//
// ### Layout
//
//   block    one malloc block per entry: an 8-byte `EntryHeader` (value length u32, key length u16,
//            frequency u8, state u8), then the key bytes, then the value bytes.
//   index    open addressing, 8-byte buckets: tag (hash >> 56) : 8 | distance from home : 8 |
//            block address : 48. 0 = empty. A hit costs two dependent memory reads: bucket, block.
//   rings    two FIFOs of block pointers (8 B each): `small` and `main` (S3-FIFO's queues).
//   ghost    one UInt32 per index bucket: two ghosts (hashes evicted unread from `small`, and from
//            `main`), each a window over the last `budget` bytes it took in (ShardStorage+Ghost.swift).
//
// Per entry, at the index's maximum load (3/4): bucket 8/0.75 ≈ 11 B + ghost 4/0.75 ≈ 5 B + ring 8 B +
// header 8 B + glibc's chunk header 8 B = 40 B, charged as ``MemoryTier/entryOverhead``.
// Not charged: index headroom below its maximum load (it doubles past 3/4) and malloc's rounding of
// a chunk to 16 B. The benchmark reports resident memory against the budget so the uncharged part
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
// ### Eviction: S3-FIFO with a CLOCK main queue and ARC's adaptation, byte-charged
//
// S3-FIFO (Yang et al., SOSP '23) with two changes, chosen by trace replay (BENCHMARKS.md): `main`
// keeps one reference bit (frequency cap 1: plain CLOCK) rather than two, which follows drifting
// popularity better, and the split between `small` and `main` adapts as ARC's does (Megiddo and
// Modha, FAST '03), with a ghost for each queue.
//
//  - A hit sets frequency = 1: one byte store on the line already read.
//  - A new key goes to `small`, or straight to `main` when either ghost remembers its hash. A hash
//    remembered by the small ghost grows `small`'s target by the entry's charge (scaled by the
//    ghosts' size ratio when the main ghost is larger); one remembered by the main ghost shrinks it
//    likewise. The target starts at 10 % of the shard budget and stays within 1 % and 90 %.
//  - To make room: unless `main` is charged more than its share (the budget less `small`'s target)
//    or `small` is empty, pop `small`'s oldest until one is evicted: frequency > 0 moves it to `main`
//    (frequency reset), else it is evicted into the small ghost. Otherwise pop `main`'s oldest:
//    frequency > 0 re-queues it with frequency 0, else it is evicted into the main ghost.
// Guarantees the tests rely on: an entry read since its insertion is never evicted straight out of
// `small`; an entry in `main` is evicted only after `main` has rotated past it frequency + 1 times;
// new keys that are never read again (a scan) pass through `small` only and never hit a ghost, so
// they take from `main` at most the bytes by which `main` may exceed its share.
//
// ### Removal: dead blocks
//
// Removing or replacing an entry deletes its bucket at once (a read can no longer see it), but its
// block may still be in a ring. It is marked dead and stays charged, as it still holds memory, until
// its ring pops it (eviction frees dead blocks first) or the ring is compacted (when dead blocks
// outnumber live ones). A replacement of the same total size reuses the block in place. A large
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
// added to the pool, or the other way round (a lender lowers its limit before the tier puts the bytes
// in the pool; a borrower takes from the pool before it raises its limit), so the sum may fall short of
// the budget during a loan but never passes it; a lender's limit never falls below half its share. A
// shard raises its limit only with bytes it took from the pool, so the tier never charges more than its
// budget, not even during a store: room is made before a block is added.
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
//    asks the other shards one lock at a time to lend their free room, nearest first, never below half
//    their share; so a large store into a tier that has room evicts nothing. When they have no free
//    room, an entry that fits the shard's own limit is stored by evicting here; a larger one makes every
//    other shard evict an equal part (S3-FIFO order, each down to half its share at most) and lend it.
//    Retries are bounded (MemoryTier+Bytes.swift, withBorrowedRoom); the last attempt evicts or refuses.
//  - An entry charged more than `largestCharge` can never fit: it is refused at once, borrowing and
//    evicting nothing (and, as every refusal, removing the key's previous value).
//  - A shard above its share gives back what its limit holds beyond max(share, charge + slack) after a
//    store, a removal or a refusal; a large entry's block is freed as soon as the entry goes, so its
//    loan goes back at once. A lender takes its room back from the pool when it next needs room.
// The largest entry is thus `largestCharge`: at least half the budget, whatever the shard count
// (``MemoryTier/largestStorableValue``).

/// The 8-byte header at the start of every entry block. After it come the optional extras the state
/// flags announce (an 8-byte deadline, then an 8-byte group hash), then the key, then the value.
struct EntryHeader {
    var valueLength: UInt32
    var keyLength: UInt16
    var frequency: UInt8
    /// Bits 0-1: the queue (small or main); bit 2: has a deadline; bit 3: has a group; bit 4: a
    /// placeholder (the value is charged but not stored: trace replay only); bit 7: dead.
    var state: UInt8

    static let small: UInt8 = 1
    static let main: UInt8 = 2
    static let queueMask: UInt8 = 0x03
    static let expiryFlag: UInt8 = 0x04
    static let groupFlag: UInt8 = 0x08
    static let placeholderFlag: UInt8 = 0x10
    static let deadFlag: UInt8 = 0x80

    var isDead: Bool { state & EntryHeader.deadFlag != 0 }
    var queue: UInt8 { state & EntryHeader.queueMask }
    var hasExpiry: Bool { state & EntryHeader.expiryFlag != 0 }
    var hasGroup: Bool { state & EntryHeader.groupFlag != 0 }
    var isPlaceholder: Bool { state & EntryHeader.placeholderFlag != 0 }

    static func extrasLength(flags: UInt8) -> Int {
        (flags & expiryFlag != 0 ? 8 : 0) + (flags & groupFlag != 0 ? 8 : 0)
    }

    /// Where the key starts, from the block's start.
    var keyOffset: Int { ShardStorage.headerSize + Self.extrasLength(flags: state) }
    /// Where the group hash lies, from the block's start (valid when `hasGroup`).
    var groupOffset: Int { ShardStorage.headerSize + (hasExpiry ? 8 : 0) }
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
    /// What `small` may hold before it is evicted from first; adapts (see ShardStorage+Ghost.swift).
    var smallTarget: Int
    let hasher: KeyHash
    let clock: CacheClock

    /// Charges of live and dead blocks.
    var charged = 0
    /// The part of `charged` in `small`.
    var smallCharged = 0
    /// Live entries (those in the index).
    var count = 0

    var index: UnsafeMutablePointer<UInt64>
    var indexMask: Int
    /// As many slots as `index` has buckets (see ShardStorage+Ghost.swift).
    var ghost: UnsafeMutablePointer<UInt32>
    let ghostShift: Int
    var smallGhost = GhostWindow()
    var mainGhost = GhostWindow()

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

    static let initialBuckets = 64
    static let initialRing = 32
    static let frequencyCap: UInt8 = 1
    static let headerSize = MemoryLayout<EntryHeader>.stride

    /// Creates empty storage; nil when the initial arrays (about 1.2 KiB) cannot be allocated.
    init?(budget: Int, hasher: KeyHash, clock: CacheClock, pool: BudgetPool? = nil, largestCharge: Int? = nil) {
        guard let index = allocateZeroed(UInt64.self, Self.initialBuckets) else { return nil }
        guard let ghost = allocateZeroed(UInt32.self, Self.initialBuckets) else {
            free(index)
            return nil
        }
        guard let small = EntryRing(capacity: Self.initialRing), let main = EntryRing(capacity: Self.initialRing)
        else {
            free(index); free(ghost)
            return nil
        }
        self.budget = budget
        self.limit = budget
        self.pool = pool
        self.largestCharge = largestCharge ?? budget
        self.smallTarget = budget / 10
        self.hasher = hasher
        self.clock = clock
        self.index = index
        self.indexMask = Self.initialBuckets - 1
        self.ghost = ghost
        self.ghostShift = Self.ghostShift(budget: budget)
        self.small = small
        self.main = main
    }

    deinit {
        small.freeAllBlocks()
        main.freeAllBlocks()
        small.release(); main.release()
        free(index); free(ghost)
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

    // MARK: Reads

    /// Runs `body` over the value stored for `key`, counting a hit or a miss.
    @inline(__always)
    mutating func withValue<R>(
        hash: UInt64, key: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) -> R
    ) -> R? {
        guard let (position, block) = find(hash: hash, key: key) else {
            counters.misses &+= 1
            return nil
        }
        let state = block.assumingMemoryBound(to: EntryHeader.self).pointee
        if state.state & (EntryHeader.expiryFlag | EntryHeader.placeholderFlag) != 0 {
            // A placeholder has no bytes to show (only `simulateRequest` makes them).
            if state.isPlaceholder {
                counters.misses &+= 1
                return nil
            }
            if Self.isExpired(block, state, now: clock.now()) {
                unlink(position: position, block: block)
                returnSurplus(keeping: 0)
                counters.expirations &+= 1
                counters.misses &+= 1
                return nil
            }
        }
        counters.hits &+= 1
        // Invariant: a block reachable from the index is live: header, then keyLength + valueLength bytes.
        let header = block.assumingMemoryBound(to: EntryHeader.self)
        let frequency = header.pointee.frequency
        if frequency < Self.frequencyCap { header.pointee.frequency = frequency &+ 1 }
        let start = block + header.pointee.keyOffset + Int(header.pointee.keyLength)
        return body(UnsafeRawBufferPointer(start: start, count: Int(header.pointee.valueLength)))
    }

    /// Whether `key` is present and unexpired, without counting a read or changing its frequency.
    func contains(hash: UInt64, key: UnsafeRawBufferPointer) -> Bool {
        guard let (_, block) = find(hash: hash, key: key) else { return false }
        let header = block.assumingMemoryBound(to: EntryHeader.self).pointee
        return !header.isPlaceholder && !(header.hasExpiry && Self.isExpired(block, header, now: clock.now()))
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

    /// Takes a live entry out of the index and marks its block dead; the block (and its charge) stays
    /// until its ring pops it or is compacted. A large entry's block is taken out of its ring and freed
    /// at once (see "Removal: dead blocks"); the caller returns any surplus limit once its own
    /// operation is done.
    mutating func unlink(position: Int, block: UnsafeMutableRawPointer) {
        indexDelete(at: position)
        count -= 1
        let header = block.assumingMemoryBound(to: EntryHeader.self)
        let queue = header.pointee.queue
        let charge = Self.charge(storedLength: header.pointee.storedLength)
        if isLarge(charge) && (queue == EntryHeader.small ? small.remove(block) : main.remove(block)) {
            // Freed now rather than when its ring pops it: the room it borrowed can go back at once.
            release(block, charge: charge, fromSmall: queue == EntryHeader.small)
            return
        }
        header.pointee.state |= EntryHeader.deadFlag
        if queue == EntryHeader.small {
            small.dead += 1
            if small.needsCompaction {
                let freed = small.compact()
                charged -= freed
                smallCharged -= freed
            }
        } else {
            main.dead += 1
            if main.needsCompaction { charged -= main.compact() }
        }
    }

    /// Frees a block that has left both the index and its ring, and its charge.
    @inline(__always)
    mutating func release(_ block: UnsafeMutableRawPointer, charge: Int, fromSmall: Bool) {
        free(block)
        charged -= charge
        if fromSmall { smallCharged -= charge }
        if isLarge(charge) { largeCharged -= charge }
    }
}

@inline(__always)
func copyBytes(_ source: UnsafeRawBufferPointer, to destination: UnsafeMutableRawPointer) {
    if let base = source.baseAddress, !source.isEmpty { memcpy(destination, base, source.count) }
}

/// `calloc` for `count` values of a trivial type whose all-zero bit pattern is valid; nil on failure.
func allocateZeroed<T>(_ type: T.Type, _ count: Int) -> UnsafeMutablePointer<T>? {
    calloc(count, MemoryLayout<T>.stride)?.bindMemory(to: T.self, capacity: count)
}
