import Glibc

// Removals: by key, by group, by expiry, and all. A removed entry leaves the index at once; its block is
// marked dead and freed when its ring pops it (see "Removal: dead blocks" in ShardStorage.swift).

extension ShardStorage {
    /// Removes every live entry matching `predicate` (given its block and header); returns how many.
    mutating func removeAll(where predicate: (UnsafeMutableRawPointer, EntryHeader) -> Bool) -> Int {
        // Collected first: unlinking may compact the rings being walked.
        var matches: [UnsafeMutableRawPointer] = []
        for ring in [small, main] {
            ring.forEach { block in
                let header = EntryHeader(of: block)
                if !header.isDead && predicate(block, header) { matches.append(block) }
            }
        }
        for block in matches {
            let hash = hashOf(block)
            if let position = indexPosition(hash: hash, block: block) { unlink(position: position, block: block) }
        }
        returnSurplus(keeping: 0)
        retired.reclaim()  // a bulk removal is rare: free what no reader holds now, not at the next batch
        return matches.count
    }

    /// Removes the entries of the group whose hash is `group`; returns how many.
    mutating func removeGroup(_ group: UInt64) -> Int {
        let removed = removeAll { block, header in
            header.hasGroup && block.loadUnaligned(fromByteOffset: header.groupOffset, as: UInt64.self) == group
        }
        counters.removals &+= UInt64(removed)
        return removed
    }

    /// Removes the entries whose deadline has passed; returns how many.
    mutating func removeExpired() -> Int {
        let now = clock.now()
        let removed = removeAll { block, header in Self.isExpired(block, header, now: now) }
        counters.expirations &+= UInt64(removed)
        return removed
    }

    /// Removes `key`; returns whether it was present.
    mutating func remove(hash: UInt64, key: UnsafeRawBufferPointer) -> Bool {
        guard let (position, block) = find(hash: hash, key: key) else { return false }
        unlink(position: position, block: block)
        counters.removals &+= 1
        returnSurplus(keeping: 0)
        return true
    }

    /// Removes every entry and returns the arrays to their initial sizes. Counters are kept.
    mutating func removeAll() {
        counters.removals &+= UInt64(count)
        // The index goes first (a new, empty table), then the blocks, which readers may still hold.
        // All three arrays are replaced, or none: the sketch is sized with the index.
        let newTable = IndexTable.allocate(buckets: Self.initialBuckets)
        let newGhost = allocateZeroed(UInt32.self, Self.initialBuckets)
        let newSketch = FrequencySketch(buckets: Self.initialBuckets)
        if let newTable, let newGhost, let newSketch {
            replaceTable(with: newTable)
            free(ghost)
            ghost = newGhost
            sketch.release()
            sketch = newSketch
        } else {
            free(newTable); free(newGhost); newSketch?.release()
            // Out of memory for the smaller arrays: the current ones are kept and cleared.
            for position in 0...indexMask { setBucket(position, 0) }
            memset(ghost, 0, (ghostMask + 1) * MemoryLayout<UInt32>.stride)
            sketch.reset()
        }
        small.retireAllBlocks(into: &retired)
        main.retireAllBlocks(into: &retired)
        small.removeAll()
        main.removeAll()
        smallGhost = GhostWindow()
        mainGhost = GhostWindow()
        admission = AdmissionControl()
        ghostControl = GhostWindowControl(budgetUnits: Self.ghostBudgetUnits(budget: budget, shift: ghostShift))
        smallShare = SmallShareControl(budget: budget)
        charged = 0
        deadCharged = 0
        smallCharged = 0
        largeCharged = 0
        count = 0
        returnSurplus(keeping: 0)
        retired.reclaim()
        retired.freeSpares()
    }
}

// Dead blocks: marked by `unlink`, freed when their ring pops them (ShardStorage+Eviction.swift) or
// compacts them; `deadCharged` follows them, so the policy's mean charge is over live entries.

extension ShardStorage {
    /// Takes a live entry out of the index and marks its block dead; the block (and its charge) stays
    /// until its ring pops it or is compacted. A large entry's block is taken out of its ring and freed
    /// at once (see "Removal: dead blocks"); the caller returns any surplus limit once its own
    /// operation is done.
    mutating func unlink(position: Int, block: UnsafeMutableRawPointer) {
        indexDelete(at: position)
        count -= 1
        let header = EntryHeader(of: block)
        let fromSmall = header.queue == EntryHeader.small
        let charge = Self.charge(storedLength: header.storedLength)
        if isLarge(charge) && (fromSmall ? small.remove(block) : main.remove(block)) {
            // Freed now rather than when its ring pops it: the room it borrowed can go back at once.
            release(block, charge: charge, fromSmall: fromSmall)
            return
        }
        EntryHeader.setState(block, header.state | EntryHeader.deadFlag)
        deadCharged += charge
        if fromSmall {
            small.dead += 1
            if small.needsCompaction { releaseCompacted(small.compact(retiringInto: &retired), fromSmall: true) }
        } else {
            main.dead += 1
            if main.needsCompaction { releaseCompacted(main.compact(retiringInto: &retired), fromSmall: false) }
        }
    }

    /// Releases a dead block its ring has popped.
    @inline(__always)
    mutating func releaseDead(_ block: UnsafeMutableRawPointer, charge: Int, fromSmall: Bool) {
        if fromSmall { small.dead -= 1 } else { main.dead -= 1 }
        deadCharged -= charge
        release(block, charge: charge, fromSmall: fromSmall)
    }

    /// Takes the charge of the dead blocks a ring's compaction released (`freed`) off the shard's.
    private mutating func releaseCompacted(_ freed: Int, fromSmall: Bool) {
        charged -= freed
        deadCharged -= freed
        if fromSmall { smallCharged -= freed }
    }
}
