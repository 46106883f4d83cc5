// MARK: - Room: a bucket's limit, borrowing from the tier, lending to it
//
// The rules are in DiskLedger.swift. Everything here runs under the bucket's lock; the pool is the only
// shared state touched (atomically). A bucket never takes another bucket's lock: gathering room from the
// others is the tier's job (`DiskTier.withRoom`), done while holding no bucket lock.

extension BucketState {
    /// Free room a bucket keeps when it lends, and takes on top when it borrows, so that neither
    /// borrows again at its very next region.
    var slack: Int { context.share / 8 }

    /// Room for `length` more bytes of file: nothing to do if they fit under the limit, else the limit
    /// is raised from the tier's pool. While the tier is in debt, the limit's free room repays it first, and
    /// the growth needs room beyond what is still owed. Nil when the growth may go ahead (with `.evict`, the
    /// bucket reclaims regions for what is still missing); else, with `.borrow`, what is missing, the debt
    /// included (nothing changed but the limit): the tier gathers it from the other buckets, whose free
    /// room is what the debt claims.
    mutating func reserveRoom(_ length: Int, policy: RoomPolicy) -> Shortfall? {
        let owed = repayDebt()
        let missing = layout.size + length - layout.limit
        guard missing > 0 else { return nil }
        let taken = context.ledger.pool.take(upTo: min(missing + slack, context.ledger.maximumLimit - layout.limit))
        if taken > 0 {
            layout.limit += taken
            remapIfPastMapping(layout.limit)
        }
        let still = layout.size + length - layout.limit
        guard still > 0, policy == .borrow else { return nil }
        return Shortfall(bytes: still + slack + owed, fitsAlone: length + BucketFileHeader.size <= layout.limit)
    }

    /// While the tier is in debt (its pool below zero, see DiskLedger.swift), gives the limit's free room
    /// to the pool, up to the debt: a file grows only within a limit the debt does not claim. Returns what
    /// is still owed (0 when the tier is not in debt). One relaxed load when it is not.
    mutating func repayDebt() -> Int {
        let debt = -context.ledger.pool.available
        guard debt > 0 else { return 0 }
        let repaid = min(debt, max(0, layout.limit - layout.size))
        layout.limit -= repaid
        context.ledger.pool.give(repaid)
        return debt - repaid
    }

    /// Takes `granted` bytes that other buckets lent it (`withBorrowedRoom`) into its limit, up to the
    /// largest limit (its index addresses no more); the rest, and all of it for a bucket closed or not
    /// loaded (its limit is set at its load), goes to the pool.
    mutating func acceptGranted(_ granted: Int) {
        guard granted > 0 else { return }
        let taken = isOpen && life.loaded ? min(granted, max(0, context.ledger.maximumLimit - layout.limit)) : 0
        context.ledger.pool.give(granted - taken)
        guard taken > 0 else { return }
        layout.limit += taken
        remapIfPastMapping(layout.limit)
    }

    /// Lends up to `wanted` bytes of its limit to the tier (the caller hands them on): its free
    /// room beyond the slack, however far below its share that takes the limit (so a store evicts nothing
    /// while the tier has room anywhere, a value as large as ``DiskTier/largestStorableValue`` included);
    /// with `evicting`, also by giving up its last slots down to half a share — their regions emptied out
    /// of turn, their entries evicted. Returns the bytes lent.
    mutating func lend(upTo wanted: Int, evicting: Bool, now: Int64) -> Int {
        guard isOpen, context.health.failure == nil else { return 0 }
        let floor = context.share / 2
        var lent = min(wanted, max(0, layout.limit - (layout.size + slack)))
        layout.limit -= lent
        if evicting && lent < wanted && layout.limit > floor {
            let goal = max(floor, layout.limit - (wanted - lent))
            // A failure (no room below the cut for what an evacuation carries) only lends less.
            try? shrink(toAtMost: goal - slack / 2, now: now)
            let more = max(0, layout.limit - max(goal, layout.size))
            layout.limit -= more
            lent += more
        }
        return lent
    }

    /// Gives back to the pool what the limit holds above max(share, size + `needed` + slack).
    mutating func returnSurplus(keeping needed: Int) {
        let keep = max(context.share, layout.size + needed + slack)
        if layout.limit > keep {
            context.ledger.pool.give(layout.limit - keep)
            layout.limit = keep
        }
    }

    /// Cuts the file's last slots until it is at most `target` bytes (or has none): a free slot goes at
    /// once, a region holding one is emptied out of turn first (its entries evicted, its tombstones
    /// carried forward: `evacuate`).
    mutating func shrink(toAtMost target: Int, now: Int64) throws(MagpieError) {
        let keep = max(0, (target - BucketFileHeader.size) / layout.regionSize)
        guard keep < layout.slotCount else { return }
        do {
            // What the evacuations carry forward must be written below the cut.
            layout.allocationCeiling = keep
            defer { layout.allocationCeiling = .max }
            while let position = layout.regions.lastIndex(where: { $0.slot + $0.slots > keep }) {
                // A region that cannot be emptied out of turn (damage may hide its tombstones) stays, and the
                // file keeps its slots.
                guard try evacuate(at: position, reinsertingLive: false, allowingEviction: true, now: now) else { break }
            }
        }
        var cut = layout.slotCount
        while cut > keep && layout.freeSlots[cut - 1] { cut -= 1 }
        guard cut < layout.slotCount else { return }
        let end = BucketFileHeader.size + cut * layout.regionSize
        if try FileIO.size(layout.fd, path: context.path) > end {
            try beforeFileChange()
            try FileIO.truncate(layout.fd, to: end, path: context.path)
        }
        layout.slotCount = cut
        context.ledger.noteFileCut()
        layout.freeSlots.removeLast(layout.freeSlots.count - cut)
    }
}
