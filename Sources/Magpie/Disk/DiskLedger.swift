import Synchronization

// MARK: - The tier's byte ledger: one budget, lent between buckets
//
// Everything the tier writes in its directory fits in ``DiskTier/Configuration/budget`` bytes:
//
//   budget = MANIFEST allowance (128 B) + Σ bucket limits + index snapshots + SIZES + journal + pool
//
//  - `share` = (budget − 128) / bucketCount: a bucket's nominal part.
//  - limit (per bucket, under its lock): the most bytes its file may hold. Invariant: size ≤ limit (a
//    file is its header and its slots; it grows and shrinks by whole slots). Limits start at one share
//    each.
//  - pool (here, atomic): bytes no bucket holds. A bucket whose file must grow past its limit first
//    takes from the pool; if the pool is short, the tier (holding no bucket lock) asks the other
//    buckets, one at a time, to lend their free room (limit − size beyond a little slack, however far
//    below a share that takes them; handed to the borrowing bucket, not through the pool, where another
//    thread's bucket could take them first), so a store evicts nothing while the tier has room anywhere, a
//    record of the largest storable size included. Only when no bucket has room does a bucket reclaim
//    its own oldest region; a record too large for that takes room from the others by making them give
//    up their last slots (their regions emptied, entries evicted) down to half a share.
//  - a bucket that was emptied, or gave up slots, returns what it no longer needs above one share.
//  - index snapshots: a bucket's snapshot left by the last close is charged from the open until it is
//    deleted (at its load if unused, else by the loader thread or before the bucket file changes:
//    Disk/Bucket+Snapshot.swift). SIZES, likewise, until the first change to a bucket file deletes it.
//    After an open that read SIZES, a bucket file found larger at its load than SIZES said (a SIZES
//    restored from a backup) is charged the difference then, from the pool (which may go below zero).
//  - index snapshots (and SIZES, whose room is set aside first) are written on close only while the
//    bucket files and the snapshots together fit the budget less the MANIFEST allowance (a snapshot that
//    does not fit is skipped: that bucket is scanned on the next open).
// There is no room to keep free for rewriting files: nothing is rewritten (regions are reclaimed in
// place, Disk/Bucket+Reclaim.swift). So the largest record is one share plus half a share from every
// other bucket (about half the budget), less a region header, at most ``DiskSlot/maximumLength``
// (2 GiB), whatever the bucket count.
//
// The pool goes below zero (the tier is in debt) when an open charges more than the budget: every
// bucket's limit starts at its share or its file's size, whichever is larger, so a reopen after a loan
// charges the lent room twice (in the borrower's file, and in each lender's share); and a directory
// opened with a smaller budget than its files hold owes what they hold beyond it. A file never grows into
// room the debt claims: a bucket that must grow first repays the debt from its own free room, then asks
// for what it needs and for what is still owed, as one shortfall, through the room loop (`reserveRoom`).
// The others' free room repays a debt of the first kind without evicting anything; one of the second kind
// takes evictions, as a store into a full tier does. Buckets also repay as they give room back. (Before
// this, the bucket that grew repaid the debt out of its own limit and then found no room: a bucket with
// regions evicted its own although the tier had room, and an empty one refused the record as too large —
// a store that had returned, lost when its memtable was written.)

/// The shared part of the disk tier's budget (see the comment above).
final class DiskLedger: Sendable {
    /// Bytes of the budget that no bucket holds.
    let pool: BudgetPool
    /// A bucket's nominal part of the budget.
    let share: Int
    /// The most bytes a bucket's limit may reach (its index addresses 32 GiB; a record is at most 2 GiB).
    let maximumLimit: Int

    /// What the MANIFEST (and its temporary file at creation) may take of the budget.
    static let manifestAllowance = 128

    /// How many times a bucket's file lost slots (a shrink to lend, an emptying). Room only moves from one
    /// bucket's size to another's through such a cut, so a sum of sizes read one bucket at a time while
    /// this count did not change is within the budget (`DiskTier.statistics`). Changed under the bucket's
    /// lock, whose release publishes it; read with acquiring loads, so that the bucket reads between two
    /// of them stay between them.
    private let fileCuts = Atomic<UInt64>(0)

    func noteFileCut() { fileCuts.add(1, ordering: .relaxed) }
    var fileCutCount: UInt64 { fileCuts.load(ordering: .acquiring) }

    init(pool: Int, share: Int, maximumLimit: Int) {
        self.pool = BudgetPool(pool)
        self.share = share
        self.maximumLimit = maximumLimit
    }

    /// The nominal share for a budget over `count` buckets.
    static func share(budget: Int, count: Int) -> Int {
        max(0, budget - manifestAllowance) / count
    }
}
