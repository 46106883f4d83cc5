// Eviction. See "Eviction" in ShardStorage.swift for the policy and its guarantees.

extension ShardStorage {
    /// Frees at least one block's charge, or (when every entry left in `small` was read) moves all of
    /// `small` to `main`. Returns false only when both queues are empty (nothing is charged).
    mutating func evictOne() -> Bool {
        // `small` first unless `main` is over its share (what `small`'s target leaves it).
        if small.count > 0 && (charged - smallCharged <= limit - smallTarget || main.count == 0) {
            while small.count > 0 && !evictFromSmall() {}
            return true
        }
        if main.count > 0 {
            evictFromMain()
            return true
        }
        return false
    }

    /// Pops `small`'s oldest block: frees it if dead, promotes it to `main` if it was read, else evicts
    /// it and remembers its hash in the small ghost. Returns whether a block was freed.
    private mutating func evictFromSmall() -> Bool {
        let block = small.popFirst()
        let header = EntryHeader(of: block)
        let charge = Self.charge(storedLength: header.storedLength)
        if header.isDead {
            releaseDead(block, charge: charge, fromSmall: true)
            return true
        }
        if header.frequency > 0 && main.push(block) {
            EntryHeader.setFrequency(block, 0)
            EntryHeader.setState(block, header.state & ~EntryHeader.queueMask | EntryHeader.main)
            smallCharged -= charge
            return false
        }
        let hash = hashOf(block)
        indexDelete(hash: hash, block: block)
        ghostRemember(hash: hash, charge: charge, fromMain: false)
        count -= 1
        counters.evictions &+= 1
        release(block, charge: charge, fromSmall: true)
        return true
    }

    /// Pops `main` until a block is freed: dead blocks are freed, read entries re-queued with
    /// frequency - 1 (so at most two passes with the cap of 1; an entry over twice the mean charge only
    /// by the size draw), and the first unread entry (or large one the draw refuses) evicted into the
    /// main ghost.
    private mutating func evictFromMain() {
        while main.count > 0 {
            let (block, tag) = main.popFirstTagged()
            let header = EntryHeader(of: block)
            let charge = Self.charge(storedLength: header.storedLength)
            if header.isDead {
                releaseDead(block, charge: charge, fromSmall: false)
                return
            }
            switch tag {
            case .admittedByMisses: admission.admittedReached(read: header.frequency > 0)
            case .admittedByGhost: ghostControl.admittedReached(read: header.frequency > 0, target: admission.target)
            case .none: admission.residentReached(read: header.frequency > 0)
            }
            // Re-queueing into the ring it was just popped from never needs more room. A large entry's
            // read counts by the size draw (ShardStorage+Sizing.swift).
            if header.frequency > 0 && sizeEarnsPlace(charge: charge) && main.push(block) {
                EntryHeader.setFrequency(block, header.frequency - 1)
                continue
            }
            let hash = hashOf(block)
            indexDelete(hash: hash, block: block)
            ghostRemember(hash: hash, charge: charge, fromMain: true)
            count -= 1
            counters.evictions &+= 1
            release(block, charge: charge, fromSmall: false)
            return
        }
    }
}

// Lending. See "Budget" in ShardStorage.swift and Support/BudgetPool.swift.

extension ShardStorage {
    /// Free room a shard keeps when it lends, and takes on top when it borrows.
    var slack: Int { budget / 16 }

    /// Whether an entry of `charge` is large: it borrows room rather than evict its shard's entries, and
    /// its block is freed as soon as it is removed.
    @inline(__always)
    func isLarge(_ charge: Int) -> Bool { charge > budget &>> 3 }  // budget ≥ 0: a shift, not a division

    /// Whether a store of `charge` that lacks room may go to the pool: a large entry, or a shard that
    /// lent. Otherwise (a small entry, a shard at or above its share) it evicts here without a call.
    @inline(__always)
    func mayBorrow(_ charge: Int) -> Bool { isLarge(charge) || limit < budget }

    /// Room for `charge` more (the caller found `charged + charge > limit` and ``mayBorrow(_:)``). A small
    /// entry (an eighth of the share or less) in a shard at its share evicts here, as in any sharded
    /// cache, without touching the pool; a shard that lent takes its room back from the pool first (up
    /// to its share); one that
    /// borrowed evicts as one at its share does (then repays: ``settleLoan(keeping:)``); a large entry
    /// takes what it needs; one over ``largestCharge`` takes nothing (the store then refuses it).
    /// Nil when the store may go ahead (evicting for what is still missing); else what is missing
    /// (nothing changed but the limit).
    mutating func reserveRoom(_ charge: Int) -> Shortfall? {
        let large = isLarge(charge)
        guard charge <= largestCharge, let pool else { return nil }
        let missing = charged + charge - limit
        limit += pool.take(upTo: large ? missing + slack : min(missing + slack, budget - limit))
        let still = charged + charge - limit
        guard still > 0, large || charge > limit else { return nil }
        return Shortfall(bytes: still + slack, fitsAlone: charge <= limit)
    }

    /// Takes `granted` bytes that other shards lent it (`withBorrowedRoom`) into its limit.
    @inline(__always)
    mutating func acceptGranted(_ granted: Int) {
        limit += granted
    }

    /// Lends up to `wanted` bytes of its limit (the caller hands them on): free room beyond the
    /// slack, never below half its share; with `evicting`, also by evicting down to half its share.
    /// Returns the bytes lent.
    mutating func lend(upTo wanted: Int, evicting: Bool) -> Int {
        let floor = budget / 2
        var lent = min(wanted, max(0, limit - max(floor, charged + slack)))
        limit -= lent
        if evicting && lent < wanted && limit > floor {
            let goal = max(floor, limit - (wanted - lent))
            while charged > goal && evictOne() {}
            let more = max(0, limit - max(goal, charged))
            limit -= more
            lent += more
        }
        return lent
    }

    /// Run by a store into a shard above its share, once it has made room for an entry of charge
    /// `needed` (not yet added): a small entry repays (``repayLoan(keeping:)``), then any free room
    /// beyond the slack goes back (``returnSurplus(keeping:)``).
    mutating func settleLoan(keeping needed: Int) {
        if !isLarge(needed) { repayLoan(keeping: needed) }
        returnSurplus(keeping: needed)
    }

    /// Run by a borrower storing a small entry of charge `needed` (room made, not yet added): what its
    /// limit holds beyond its share and its large entries' charges was borrowed for entries that are
    /// gone, and may have been filled since with small ones; it evicts up to a slack (or one entry) of
    /// them and gives that back, so a loan outlives its entry for a few stores only. Evicts before it
    /// gives: the bytes given are free ones.
    mutating func repayLoan(keeping needed: Int) {
        let entitled = budget + largeCharged
        guard limit > entitled, let pool else { return }
        let goal = max(entitled, limit - max(slack, needed))
        while charged + needed > goal && evictOne() {}
        let surplus = limit - max(goal, charged + needed)
        if surplus > 0 {
            pool.give(surplus)
            limit -= surplus
        }
    }

    /// Gives back to the pool what the limit holds above max(share, charge + `needed` + slack).
    mutating func returnSurplus(keeping needed: Int) {
        guard limit > budget, let pool else { return }
        let keep = max(budget, charged + needed + slack)
        if limit > keep {
            pool.give(limit - keep)
            limit = keep
        }
    }
}
