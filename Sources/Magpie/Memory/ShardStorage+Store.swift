import Glibc

// A shard's store: room made before the entry goes in, then a new block (a published block never
// changes: lock-free readers may be copying it; see "Budget" and "Removal: dead blocks" in
// ShardStorage.swift).

extension ShardStorage {
    /// Stores `value` for `key`, replacing any previous value, with an optional deadline (ms since
    /// 1970, 0 = none) and group hash (0 = none). Makes room first; refuses (leaving the key absent)
    /// when the entry cannot fit the shard's limit (after borrowing, see "Budget") or memory runs out.
    /// With `.borrow`, a large entry that does not fit changes nothing and returns `.short` (see "Budget").
    mutating func store(
        hash: UInt64, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, deadline: Int64 = 0,
        group: UInt64 = 0, freshness: Freshness = .none, stamp: Int64 = 0, version: UInt64 = 0, policy: RoomPolicy = .evict
    ) -> StoreOutcome {
        storeEntry(
            hash: hash, key: key, value: value, deadline: deadline, group: group, freshness: freshness, stamp: stamp, version: version,
            placeholderLength: nil, policy: policy)
    }

    /// Trace replay's store (MemoryTier+Simulation.swift): a placeholder for a key just found absent
    /// (lock held since), charged as a value of `valueLength` bytes without holding them.
    mutating func storePlaceholder(hash: UInt64, key: UnsafeRawBufferPointer, valueLength: Int, policy: RoomPolicy)
        -> StoreOutcome
    {
        storeEntry(
            hash: hash, key: key, value: UnsafeRawBufferPointer(start: nil, count: 0), deadline: 0, group: 0,
            freshness: .none, stamp: 0, version: 0, placeholderLength: valueLength, policy: policy)
    }

    /// The body of `store` and `storePlaceholder`, inlined into each: with `placeholderLength` a constant
    /// nil, the serving store's placeholder branches fold away. A placeholder's key is known absent.
    @inline(__always)
    private mutating func storeEntry(
        hash: UInt64, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, deadline: Int64, group: UInt64,
        freshness: Freshness, stamp: Int64, version: UInt64, placeholderLength: Int?, policy: RoomPolicy
    ) -> StoreOutcome {
        let flags = (deadline != 0 ? EntryHeader.expiryFlag : 0) | (group != 0 ? EntryHeader.groupFlag : 0)
            | (placeholderLength != nil ? EntryHeader.placeholderFlag : 0)
            | (freshness.freshUntil != 0 ? EntryHeader.freshnessFlag : 0) | (freshness.negative ? EntryHeader.negativeFlag : 0)
            | (stamp != 0 ? EntryHeader.stampFlag : 0)
        let valueLength = placeholderLength ?? value.count
        let storedLength = EntryHeader.extrasLength(flags: flags) + key.count + valueLength
        var queue = EntryHeader.small
        var tag = RingTag.none
        var frequency: UInt8 = 0
        var isUpdate = false
        var previous: (position: Int, block: UnsafeMutableRawPointer)? = nil
        let peeked = sketch.peek(hash)  // read now: its cache misses overlap the lookup's
        if placeholderLength == nil, let found = find(hash: hash, key: key) { previous = found }
        let charge = Self.charge(storedLength: storedLength)
        if charged + charge > limit, mayBorrow(charge), let shortfall = reserveRoom(charge), policy == .borrow {
            return .short(shortfall)  // nothing changed: the previous value is still there
        }
        if let previous {
            let header = EntryHeader(of: previous.block)
            queue = header.queue
            frequency = min(header.frequency &+ 1, Self.frequencyCap)
            isUpdate = true
            unlink(position: previous.position, block: previous.block)
        }
        guard charge <= limit else { return refuse(droppedPrevious: isUpdate) }
        while charged + charge > limit {
            // Cannot fail while anything is charged; the guard keeps a broken invariant from spinning.
            guard evictOne() else { return refuse(droppedPrevious: isUpdate) }
        }
        if limit > budget { settleLoan(keeping: charge) }
        if !isUpdate {
            let misses = sketch.add(peeked)
            if let hit = ghostTake(hash: hash) {
                tuneSmallShare(hit)
                // A large key's ghost hit admits it only by the size draw (ShardStorage+Sizing.swift).
                if sizeEarnsPlace(charge: charge) {
                    queue = EntryHeader.main
                    tag = .admittedByGhost
                }
            } else if misses > 1
                && admission.admits(previousMisses: misses - 1, charge: charge, charged: liveCharged, count: count)
            {
                queue = EntryHeader.main
                tag = .admittedByMisses
            }
        }

        // Out of memory anywhere below is a refusal, never a trap; nothing taken is leaked.
        let blockLength = Self.headerSize + storedLength - (placeholderLength ?? 0)
        guard let block = retired.takeSpare(blockLength) ?? malloc(blockLength) else {
            return refuse(droppedPrevious: isUpdate)
        }
        // Bits 0-1 clear: a ring's tag (EntryRing); always so for malloc's 16-byte alignment.
        guard UInt(bitPattern: block) < (1 << 48), UInt(bitPattern: block) & EntryRing.tagMask == 0, ensureIndexRoom() else {
            free(block)
            return refuse(droppedPrevious: isUpdate)
        }
        let header = EntryHeader(
            valueLength: UInt32(valueLength), keyLength: UInt16(key.count), frequency: frequency, state: queue | flags)
        header.write(to: block)
        writeExtras(block, deadline: deadline, group: group, freshness: freshness)
        if stamp != 0 {
            block.storeBytes(of: stamp, toByteOffset: header.stampOffset, as: Int64.self)
            block.storeBytes(of: version, toByteOffset: header.stampOffset + 8, as: UInt64.self)
        }
        copyBytes(key, to: block + header.keyOffset)
        if placeholderLength == nil { copyBytes(value, to: block + header.keyOffset + key.count) }
        let pushed = queue == EntryHeader.small ? small.push(block) : main.push(block, tag: tag)
        guard pushed, indexInsert(hash: hash, block: block) else {
            // In a ring but not indexed: taken out again (the newest, found at once), never left dead.
            if pushed { _ = queue == EntryHeader.small ? small.remove(block) : main.remove(block) }
            free(block)
            return refuse(droppedPrevious: isUpdate)
        }
        addCharge(charge, queue: queue)
        count += 1
        switch tag {
        case .admittedByMisses: counters.admittedByMisses &+= 1
        case .admittedByGhost: counters.admittedByGhost &+= 1
        case .none: break
        }
        if isUpdate { counters.updates &+= 1 } else { counters.inserts &+= 1 }
        return isUpdate ? .updated : .inserted
    }

    /// Writes the deadline, group hash and freshness a block's flags announce.
    @inline(__always)
    private func writeExtras(_ block: UnsafeMutableRawPointer, deadline: Int64, group: UInt64, freshness: Freshness) {
        var offset = Self.headerSize
        if deadline != 0 {
            block.storeBytes(of: deadline, toByteOffset: offset, as: Int64.self)
            offset += 8
        }
        if group != 0 {
            block.storeBytes(of: group, toByteOffset: offset, as: UInt64.self)
            offset += 8
        }
        if freshness.freshUntil != 0 {
            block.storeBytes(of: freshness.freshUntil, toByteOffset: offset, as: Int64.self)
            block.storeBytes(of: freshness.loadedAt, toByteOffset: offset + 8, as: Int64.self)
        }
    }
}
