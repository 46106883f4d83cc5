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
