import Synchronization

// MARK: - Lending a budget between the stripes of a tier
//
// Both tiers split their budget into stripes (memory shards, disk buckets), each with its own lock and a
// limit that starts at its nominal share. So that the budget acts as one, a stripe that needs more than
// its limit borrows: first from the tier's pool (atomic, below), then, through the tier (which holds no
// stripe's lock while it asks), from the other stripes' free room, and only when no stripe has room to
// lend does it evict its own entries; an entry larger than a stripe could hold alone makes the others
// evict to lend. Invariant, per tier: Σ limits + pool + (bytes in flight from a lender to the pool or to
// the borrower it lent to) == the budget, and every stripe's charge ≤ its limit, so the charge of the
// whole tier never exceeds the budget, not even transiently. The tiers' own comments (ShardStorage.swift,
// DiskLedger.swift) give their floors and slack.

/// Bytes of a tier's budget that no stripe holds.
final class BudgetPool: Sendable {
    private let bytes: Atomic<Int>

    init(_ bytes: Int) { self.bytes = Atomic(bytes) }

    /// Takes up to `wanted` bytes; returns how many it took (0 when the pool is empty). One relaxed load
    /// when it is.
    @inline(__always)
    func take(upTo wanted: Int) -> Int {
        guard wanted > 0 else { return 0 }
        var available = bytes.load(ordering: .relaxed)
        while available > 0 {
            let taken = min(wanted, available)
            let (exchanged, now) = bytes.compareExchange(expected: available, desired: available - taken, ordering: .relaxed)
            if exchanged { return taken }
            available = now
        }
        return 0
    }

    /// Returns `count` bytes to the pool.
    func give(_ count: Int) {
        if count != 0 { bytes.add(count, ordering: .relaxed) }
    }

    /// The pool's bytes now.
    var available: Int { bytes.load(ordering: .relaxed) }
}

/// How a stripe may make room for what would pass its limit once the pool is empty.
enum RoomPolicy {
    /// Report the shortfall (nothing changed): the tier then gathers room from the other stripes.
    case borrow
    /// Evict the stripe's own entries (the tier has no room elsewhere, or the entry is small). A disk
    /// bucket still reports a shortfall, changing nothing, for a record that would not fit its limit even
    /// alone (room it held for the record may have been lent away since the attempt that chose `.evict`).
    case evict
    /// As `.evict`, and never a shortfall: what cannot fit even alone is refused (the last round, and a
    /// stripe's own rewrites).
    case last
}

/// What a stripe lacked: `bytes` more; `fitsAlone`: the entry would fit the stripe's own limit if it
/// evicted.
struct Shortfall: Equatable {
    var bytes: Int
    var fitsAlone: Bool
}

/// An operation on a stripe that may not have found room: its result, or what it lacked.
enum RoomOutcome<Result> {
    case done(Result)
    case short(Shortfall)
}

/// Runs `attempt` until it finds room: with `.borrow` first; after a shortfall `gather(bytes, evicting)`
/// collects room from the other stripes (holding no stripe's lock; it cannot fail, so nothing gathered is
/// dropped) and the attempt runs again, handed what was gathered (`granted`, which it adds to its
/// stripe's limit under the stripe's lock before anything else: `acceptGranted`); when the others had no
/// free room, an entry that fits its stripe alone is stored by evicting there (`.evict`), and a larger one
/// makes the others evict to lend. Bounded: after 8 rounds the attempt runs with `.last`, which never
/// reports a shortfall.
///
/// Lent room goes to the borrowing stripe, never through the pool, where whichever stripe of another
/// thread borrowed first took it. And a stripe's room is lendable between two attempts, so `.evict` may
/// still find an entry too large for the limit alone (a disk bucket then reports it short rather than
/// evicting everything in vain). Before both, a record that did not fit its bucket alone was refused as
/// too large, after its bucket had evicted every entry, although the tier had room for it (seen in CI
/// about once in 80 runs of a test: a 570 KB record into a 4 MiB disk tier of 8 buckets while another
/// thread wrote a memtable).
@inline(__always)
func withBorrowedRoom<R, E: Error>(
    _ attempt: (_ policy: RoomPolicy, _ granted: Int) throws(E) -> RoomOutcome<R>,
    gather: (_ bytes: Int, _ evicting: Bool) -> Int
) throws(E) -> R {
    var policy = RoomPolicy.borrow
    var rounds = 0
    var granted = 0
    while true {
        let shortfall: Shortfall
        let handed = granted
        granted = 0
        switch try attempt(policy, handed) {
        case .done(let result): return result
        case .short(let lacking): shortfall = lacking
        }
        rounds += 1
        granted = gather(shortfall.bytes, false)
        if rounds >= 8 {
            policy = .last
        } else if granted >= shortfall.bytes {
            continue  // there was room: try again with it
        } else if shortfall.fitsAlone {
            policy = .evict
        } else {
            granted += gather(shortfall.bytes - granted, true)
        }
    }
}
