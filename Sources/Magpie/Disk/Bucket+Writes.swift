import Glibc

// MARK: - Writes: stores, removals, group removals, emptying, expiry (the policy is at the top of
// Bucket.swift; records reach the file through Bucket+Regions.swift and Bucket+Seal.swift)

extension BucketState {
    /// Stores `draft` for `key` in the active memtable and points the index at it; a previous record of
    /// the key in the file gets a tombstone first (written at once), one still in a memtable is simply
    /// replaced. On `.short` (room for that tombstone) or `.busy` nothing changed.
    mutating func store(_ draft: RecordDraft, key: HashedKey, now: Int64, policy: RoomPolicy) throws(MagpieError)
        -> RoomOutcome<DiskStoreOutcome>
    {
        try checkOpen()
        // The bucket's last memtable write failed (say, the disk is full): its stores are lost, and the next
        // store learns it (this one is not stored). The next `flush` would have, had no store come first.
        if let failure = memtables.sealFailure {
            memtables.sealFailure = nil
            throw failure
        }
        defer { healIfNeeded(now: now) }
        // Room in the memtables first, so that a busy store has written nothing.
        // A memtable detached here is handed to the sealer by the store that returns `.storedAndDetached`
        // (`BucketMemtables.makeRoom` notes it in `sealingNotHandedOver`): this one, or, if this one returns `.short`
        // or throws (its tombstone needed room), the next.
        guard memtables.makeRoom(for: draft.length, writeBuffer: context.writeBuffer) else { return .done(.busy) }
        var earned = 0  // the reads the key earned, kept by the new value (writeTombstone zeroes them)
        var existing = try position(of: key)
        // A record of the key in a deferred write is about to be in the file: it is settled first, and gets its tombstone.
        if let found = existing, memtables.isInDeferredWrite(index[found]) {
            settleDeferredWrite()
            existing = try position(of: key)
        }
        if let position = existing {
            earned = index[position].credits
            if !index[position].isPending {
                index[position].credits = 0  // see writeTombstone
                if case .short(let short) = try writeTombstone(for: key, policy: policy, now: now) { return .short(short) }
            }
        } else if damage.unindexedRegion != nil {
            // A failed write may have left a record of the key in the file that nothing points at.
            if case .short(let short) = try writeTombstone(for: key, policy: policy, now: now) { return .short(short) }
        }
        // (Found again: writing a tombstone may have reclaimed a region, which moves slots.)
        let credits = max(earned, try position(of: key).map { take(at: $0).credits } ?? 0)
        guard let memtable = memtables.active else { throw MagpieError(.ioFailure, "out of memory for a memtable", path: context.path) }
        return .done(append(draft, key: key, credits: credits, to: memtable))
    }

    /// ``store(_:key:now:policy:)`` for a caller that must not wait (an async caller's task, through
    /// `DiskTier.storeIfImmediate`): the same store when it needs neither the file nor a wait — the bucket
    /// loaded, with nothing to heal and no failed write to report; no record of the key in the file (its
    /// tombstone would be written) and none in a deferred write (which would be waited for); room in the memtables
    /// at once — else nil, with nothing changed. `draft` fits a memtable (the caller checks).
    mutating func storeIfImmediate(_ draft: RecordDraft, key: HashedKey) -> DiskStoreOutcome? {
        guard isOpen, life.loaded, context.health.failure == nil, memtables.sealFailure == nil, damage.unindexedRegion == nil,
            !damage.needsHealing, context.writeBuffer > 0, draft.length <= context.writeBuffer
        else { return nil }
        guard case .done(let existing) = pendingPosition(of: key) else { return nil }
        if let found = existing, memtables.isInDeferredWrite(index[found]) { return nil }
        // The last step that may refuse (a memtable it detached before refusing is owed to the sealer by
        // `sealingNotHandedOver`, which the next store's outcome pays).
        guard memtables.makeRoom(for: draft.length, writeBuffer: context.writeBuffer), let memtable = memtables.active else { return nil }
        let credits = existing.map { take(at: $0).credits } ?? 0
        return append(draft, key: key, credits: credits, to: memtable)
    }

    /// Appends `draft` to `memtable` (the active one, with room) and points the index at it, keeping the
    /// reads the key earned (`credits`: an overwrite keeps them); says whether a detached memtable waits
    /// for the sealer.
    @inline(__always)
    private mutating func append(_ draft: RecordDraft, key: HashedKey, credits: Int, to memtable: Memtable) -> DiskStoreOutcome {
        let offset = memtable.append(draft)
        var slot = DiskSlot(
            hash: key.hash, memtableParity: memtable.parity, offset: offset, length: draft.length,
            expiryMilliseconds: draft.header.expiry)
        slot.credits = credits
        insert(slot)
        counters.writes += 1
        var outcome = memtables.sealingNotHandedOver ? DiskStoreOutcome.storedAndDetached : .stored
        memtables.sealingNotHandedOver = false
        // A record longer than the write buffer has a memtable of its own, and no write buffer means every
        // store is written before it returns: detach it now (the sealing slot is free, see `BucketMemtables.makeRoom`).
        if (draft.length > context.writeBuffer || context.writeBuffer == 0) && memtables.sealing == nil {
            memtables.detach()
            outcome = .storedAndDetached
        }
        return outcome
    }

    /// Removes `key`. A record of it in the file gets a tombstone (written at once, so the removal
    /// survives a restart); one still in a memtable is simply forgotten. Returns whether it was live.
    mutating func remove(_ key: HashedKey, now: Int64, policy: RoomPolicy) throws(MagpieError) -> RoomOutcome<Bool> {
        try checkOpen()
        defer { healIfNeeded(now: now) }
        let tag = DiskSlot.tag(of: key.hash)
        var found = try find(tag: tag, key: key.bytes)
        // A record of the key in a deferred write is about to be in the file: it is settled first, and gets its tombstone.
        if let (position, _) = found, memtables.isInDeferredWrite(index[position]) {
            settleDeferredWrite()
            found = try find(tag: tag, key: key.bytes)
        }
        if found == nil && damage.unindexedRegion == nil { return .done(false) }
        if found.map({ !index[$0.0].isPending }) ?? true {
            if let (position, _) = found { index[position].credits = 0 }  // see writeTombstone
            if case .short(let short) = try writeTombstone(for: key, policy: policy, now: now) { return .short(short) }
        }
        guard let (position, _) = try find(tag: tag, key: key.bytes) else { return .done(found != nil) }
        drop(at: position)
        counters.removals += 1
        return .done(true)
    }

    /// Removes every live entry whose group is `group`; a group tombstone is written at once when any of
    /// them is in the file. Returns the number of live entries removed.
    mutating func removeGroup(_ group: UnsafeRawBufferPointer, now: Int64, policy: RoomPolicy) throws(MagpieError)
        -> RoomOutcome<Int>
    {
        try checkOpen()
        defer { healIfNeeded(now: now) }
        var members = try groupMembers(group)
        // Members whose records are in a deferred write are about to be in the file: they are settled first (and are
        // covered by the group tombstone).
        if members.contains(where: { memtables.isInDeferredWrite($0) }) {
            settleDeferredWrite()
            members = try groupMembers(group)
        }
        guard !members.isEmpty || damage.unindexedRegion != nil else { return .done(0) }
        if members.contains(where: { !$0.isPending }) || damage.unindexedRegion != nil {
            // No member may be copied forward past the group tombstone by a reclaim during its write (see
            // writeTombstone): with no credits they are evicted instead.
            for member in members where !member.isPending {
                if let position = index.positions(tag: member.tag).first(where: { index[$0] == member }) { index[position].credits = 0 }
            }
            if case .short(let short) = try writeGroupTombstone(group, policy: policy, now: now) { return .short(short) }
            members = try groupMembers(group)  // a reclaim may have evicted some, and moved slots
        }
        for member in members {
            if let position = index.positions(tag: member.tag).first(where: { index[$0] == member }) { drop(at: position) }
        }
        counters.removals += UInt64(members.count)
        return .done(members.count)
    }

    /// The live slots whose record's group is `group` (each record's first bytes read and verified; a
    /// corrupt one is left to the read that meets it).
    private mutating func groupMembers(_ group: UnsafeRawBufferPointer) throws(MagpieError) -> [DiskSlot] {
        var members: [DiskSlot] = []
        for slot in index.slots where !slot.isEmpty {
            guard let (header, prefix) = try recordPrefix(slot), header.groupLength == group.count, !group.isEmpty else { continue }
            let inGroup = prefix.withUnsafeBytes { raw in
                memcmp(raw.baseAddress! + header.groupOffset, group.baseAddress!, group.count) == 0
            }
            if inGroup { members.append(slot) }
        }
        return members
    }

    /// Forgets what the bucket knew of its file's regions: none, no slot, no live byte, no damage to heal
    /// and no region that slots miss. For an emptied file, and after a load that failed (the next load
    /// learns it all again from the file).
    mutating func forgetRegions() {
        tally.liveBytes = 0
        if layout.slotCount > 0 { context.ledger.noteFileCut() }
        layout.slotCount = 0
        layout.regions = []
        layout.freeSlots = []
        damage = BucketDamage()
    }

    /// Empties the bucket: the file keeps only its header (with the tier's region size now), the
    /// memtables are dropped.
    mutating func removeAll() throws(MagpieError) {
        try checkOpen()
        try beforeFileChange()
        let header = BucketFileHeader(
            bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed,
            regionSize: context.shared.regionSize)
        try FileIO.truncate(layout.fd, to: 0, path: context.path)
        try FileIO.write(layout.fd, header.encoded(), at: 0, path: context.path)
        life.headerMissing = false
        life.closedLength = 0
        counters.removals += UInt64(index.count)
        index.removeAll()
        tally = IndexTally()
        memtables.active = nil
        if !memtables.sealingClaimed { memtables.sealing = nil }  // a claimed one finds nothing live when it is written
        layout.regionSize = context.shared.regionSize
        forgetRegions()
        memtables.sealFailure = nil  // the stores it lost are removed anyway
        remap()
        returnSurplus(keeping: 0)
    }

    /// Drops entries whose expiry has passed; returns how many.
    mutating func removeExpired(now: Int64) -> Int {
        let removed = dropAll { $0.isExpired(nowMilliseconds: now) }
        counters.expired += UInt64(removed)
        return removed
    }

    /// Drops every indexed slot for which `condition` holds, in one pass; returns how many.
    mutating func dropAll(where condition: (DiskSlot) -> Bool) -> Int {
        var removed = 0
        var position = 0
        while position < index.slots.count {
            if !index[position].isEmpty && condition(index[position]) {
                drop(at: position)  // a later slot may shift into `position`: look at it again
                removed += 1
            } else {
                position += 1
            }
        }
        return removed
    }
}
