import Glibc

// MARK: - Room: a bucket's limit, borrowing from the tier, lending to it, evicting and compacting
//
// The rules are in DiskLedger.swift. Everything here runs under the bucket's lock; the pool is the only
// shared state touched (atomically). A bucket never takes another bucket's lock: gathering room from the
// others is the tier's job (`DiskTier.withRoom`), done while holding no bucket lock.

extension BucketState {
    /// Free room a bucket keeps when it lends, and takes on top when it borrows, so that neither
    /// borrows again at its very next append.
    var slack: Int { context.share / 8 }

    /// Room for an append of `length` bytes: nothing to do if it fits under the limit, else the limit
    /// is raised from the tier's pool. Nil when the append may go ahead (with `.evict`, `append` evicts
    /// and compacts for what is still missing); else, with `.borrow`, what is missing (nothing changed
    /// but the limit).
    mutating func reserveRoom(_ length: Int, policy: RoomPolicy) -> Shortfall? {
        let missing = size + length - limit
        guard missing > 0 else { return nil }
        let taken = context.ledger.pool.take(upTo: min(missing + slack, context.ledger.maximumLimit - limit))
        if taken > 0 {
            limit += taken
            if let mapping, limit > mapping.length { remap(length: min(context.ledger.maximumLimit, max(limit, 2 * mapping.length))) }
        }
        let still = size + length - limit
        guard still > 0, policy == .borrow else { return nil }
        return Shortfall(bytes: still + slack, fitsAlone: length + BucketFileHeader.size <= limit)
    }

    /// Evicts until the live records and `needed` fit in 3/4 of the limit, compacts, and returns what
    /// the bucket no longer needs above its share.
    mutating func makeRoom(for needed: Int, now: Int64) throws(MagpieError) {
        try evictAndCompact(liveTarget: max(0, limit * 3 / 4 - needed - BucketFileHeader.size), now: now)
        returnSurplus(keeping: needed)
    }

    /// Lends up to `wanted` bytes of its limit to the tier (the caller puts them in the pool): its free
    /// room beyond the slack, however far below its share that takes the limit (so a store evicts nothing
    /// while the tier has room anywhere, a value as large as ``DiskTier/largestStorableValue`` included);
    /// with `evicting`, also by evicting and compacting down to half a share. Returns the bytes lent.
    mutating func lend(upTo wanted: Int, evicting: Bool, now: Int64) throws(MagpieError) -> Int {
        guard isOpen, context.health.failure == nil else { return 0 }
        let floor = context.share / 2
        var lent = min(wanted, max(0, limit - (size + slack)))
        limit -= lent
        if evicting && lent < wanted && limit > floor {
            let goal = max(floor, limit - (wanted - lent))
            if size > goal - slack / 2 {
                try evictAndCompact(liveTarget: max(0, goal * 3 / 4 - BucketFileHeader.size), now: now)
            }
            let more = max(0, limit - max(goal, size))
            limit -= more
            lent += more
        }
        return lent
    }

    /// Gives back to the pool what the limit holds above max(share, size + `needed` + slack).
    mutating func returnSurplus(keeping needed: Int) {
        let keep = max(context.share, size + needed + slack)
        if limit > keep {
            context.ledger.pool.give(limit - keep)
            limit = keep
        }
    }

    /// Evicts until the live records are at most `liveTarget` bytes — and at most what the compaction's
    /// temporary file may hold (the headroom, plus what the pool lends for the compaction's duration) —
    /// then compacts. Unread entries first, then by the clock (see the top of Bucket.swift).
    mutating func evictAndCompact(liveTarget: Int, now: Int64) throws(MagpieError) {
        try beforeFileChange()  // evicted records may be marked dead in the file
        let headroom = context.ledger.share - BucketFileHeader.size
        let reserved = context.ledger.pool.take(upTo: max(0, min(liveTarget, liveBytes) - headroom))
        defer { context.ledger.pool.give(reserved) }
        let target = min(liveTarget, headroom + reserved)
        var evicted: [DiskSlot] = []
        // The unread entries step 1 keeps (a tenth of the target at most), which the clock then passes
        // over, as S3-FIFO's main queue never evicts from its small one.
        var spared = Set<UInt32>()
        if liveBytes > target { _ = removeExpired(now: now) }  // what has expired goes before anything live
        if liveBytes > target {
            // Unread entries (no credits) first, as S3-FIFO's small queue: the oldest first, down to what
            // the read entries leave of the target, and no further than a tenth of the target while the
            // read ones take more than the rest (then the clock below evicts read entries only).
            var unread: [DiskSlot] = []
            var unreadBytes = 0
            for slot in index.slots where !slot.isEmpty && slot.credits == 0 {
                unread.append(slot)
                unreadBytes += slot.length
            }
            let readBytes = liveBytes - unreadBytes
            let keep = max(target - readBytes, min(unreadBytes, target / 10))
            unread.sort { $0.offset8 < $1.offset8 }  // the order they were stored in (compactions keep it)
            var next = 0
            while next < unread.count && liveBytes > target && unreadBytes > keep {
                let slot = unread[next]
                next += 1
                if let position = index.positions(tag: slot.tag).first(where: { index[$0].offset8 == slot.offset8 }) {
                    evicted.append(slot)
                    drop(at: position)
                    unreadBytes -= slot.length
                    counters.evictions += 1
                }
            }
            if liveBytes > target { spared = Set(unread[next...].map(\.offset8)) }
        }
        // Spared entries are at most a tenth of the target, so evicting every other entry reaches it; a
        // hand that went round four times (credits are at most three) without evicting stops sparing.
        var idle = 0
        while liveBytes > target && index.count > 0 {
            let position = index.hand % index.capacity
            var slot = index[position]
            if idle > 4 * index.capacity && !spared.isEmpty { spared.removeAll() }
            if slot.isEmpty {
                index.hand = position + 1
                idle += 1
            } else if spared.contains(slot.offset8) && !slot.isExpired(nowMilliseconds: now) {
                index.hand = position + 1
                idle += 1
            } else if slot.credits > 0 && !slot.isExpired(nowMilliseconds: now) {
                slot.credits -= 1
                index[position] = slot
                index.hand = position + 1
                idle += 1
            } else {
                idle = 0
                evicted.append(slot)
                drop(at: position)  // the hand stays: a later slot may have shifted into this position
                counters.evictions += 1
            }
        }
        let compactions = counters.compactions
        do {
            try compactUnderLock()
        } catch {
            // If the old file is still the bucket, the evicted records stay in it: mark them dead so
            // recovery cannot revive one over a later write that never reached disk (say, a `Cache`
            // store kept in memory only). After the rename their offsets mean nothing: leave them.
            if counters.compactions == compactions { for slot in evicted { markDead(slot) } }
            throw error
        }
    }

    /// A compaction without eviction (to heal damage), if the live records fit the headroom and what the
    /// pool can lend; else nothing happens now (the damage stays skipped until the next compaction).
    mutating func compactWithinHeadroom() throws(MagpieError) {
        let headroom = context.ledger.share - BucketFileHeader.size
        let reserved = context.ledger.pool.take(upTo: max(0, liveBytes - headroom))
        defer { context.ledger.pool.give(reserved) }
        guard liveBytes <= headroom + reserved else { return }
        try compactUnderLock()
    }

    /// `compact()` holding the tier-wide compaction lock (one temporary file at a time).
    private mutating func compactUnderLock() throws(MagpieError) {
        try context.compaction.withLock { (begun: inout UInt64) throws(MagpieError) in
            begun &+= 1
            try compact()
        }
    }
}
