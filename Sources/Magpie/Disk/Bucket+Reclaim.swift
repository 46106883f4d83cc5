import Glibc

// MARK: - Reclaiming, evacuating and tombstones: what makes room in a bucket's regions (Bucket+Regions.swift
// writes the records; the policy is described at the top of Bucket.swift)

extension BucketState {
    // MARK: Reclaiming and evacuating

    /// Whether a reclaim reinserts an entry (see the top of Bucket.swift): read since written, and often
    /// enough for its size against the mean record.
    func reinserts(_ slot: DiskSlot, meanLength: Int) -> Bool {
        slot.credits > 0 && slot.credits * meanLength >= context.shared.reinsertionThreshold * slot.length
    }

    /// Reclaims the oldest region: its expired entries go, those read often enough for their size are
    /// copied into `batch` (at most three quarters of the region's bytes, so that every reclaim frees a
    /// quarter at least), the rest are evicted; its tombstones go too
    /// (everything they cover is older). Its slots become free (their header is zeroed unless a new region
    /// reuses them first: `freed`).
    mutating func reclaimOldest(into batch: inout WriteBatch, freed: inout [Int], now: Int64) throws(MagpieError) {
        let victim = layout.regions[0]
        let meanLength = fileEntryCount == 0 ? 0 : tally.liveBytes / fileEntryCount
        var budget = layout.capacity(of: victim) * 3 / 4
        try takeEntries(of: victim, now: now) { state, slot in
            guard state.reinserts(slot, meanLength: meanLength), slot.length <= budget else { return false }
            budget -= slot.length
            return true
        } keep: { slot, record in
            batch.append(record, origin: .reinserted(slot))
        }
        layout.regions.removeFirst()
        for s in victim.slot..<(victim.slot + victim.slots) { layout.freeSlots[s] = true }
        freed.append(victim.slot)
        damage.forget(victim.sequence)
        counters.reclaims += 1
    }

    /// Drops every live entry of `region` from the index: expired ones (counted); those `wants` (their
    /// record then read and verified, and given to `keep` — or, if it does not verify, counted corrupt);
    /// and the rest, evicted, unread.
    mutating func takeEntries(
        of region: Region, now: Int64, wants: (inout BucketState, DiskSlot) -> Bool, keep: (DiskSlot, UnsafeRawBufferPointer) -> Void
    ) throws(MagpieError) {
        let low = layout.start(of: region)
        let high = low + layout.capacity(of: region)
        var position = 0
        while position < index.slots.count {
            let slot = index[position]
            guard !slot.isEmpty, !slot.isPending, slot.offset >= low, slot.offset < high else {
                position += 1
                continue
            }
            drop(at: position)  // a later slot may shift into `position`: look at it again
            if slot.isExpired(nowMilliseconds: now) {
                counters.expired += 1
                continue
            }
            guard wants(&self, slot) else {
                counters.evictions += 1
                continue
            }
            let record = try readRecord(slot)
            let intact = record.withUnsafeBytes { raw in
                RecordHeader.validate(raw).map { $0.recordLength == slot.length && $0.kind == .value } ?? false
            }
            if intact {
                record.withUnsafeBytes { keep(slot, $0) }
                counters.reinsertions += 1
                counters.reinsertedBytes += UInt64(slot.length)
            } else {
                counters.corruptRecords += 1
            }
        }
    }

    /// Empties the region at `position` out of turn: its live entries are reinserted (`reinsertingLive`:
    /// to heal damage) or evicted (to give room back), its tombstones carried forward when older regions
    /// remain (with their covers: see Format/OnDiskFormat.swift, "Tombstones"); then its slots are freed
    /// and its header zeroed. Without `allowingEviction`, it does nothing (returns false) when that would
    /// take a reclaim.
    @discardableResult
    mutating func evacuate(at position: Int, reinsertingLive: Bool, allowingEviction: Bool, now: Int64) throws(MagpieError) -> Bool {
        settleDeferredWrite()  // its bytes are read up to the region's end (Bucket+RecordWrite.swift)
        let region = layout.regions[position]
        var batch = WriteBatch()
        if position > 0 {
            // Tombstones: read from the region's bytes (they are in no index). Unknown damage may hide one:
            // then the region stays (see Bucket+Recovery.swift).
            let bytes = try readBytes(region.end, at: layout.start(of: region), mapping: layout.mapping)
            var hidden = false
            _ = bytes.withUnsafeBytes { raw in
                Self.forEachRecord(inRegion: raw, firstSequence: region.firstRecordSequence, context: context) { event in
                    switch event {
                    case .record(let offset, let header) where header.kind != .value:
                        batch.append(UnsafeRawBufferPointer(rebasing: raw[offset..<(offset + header.recordLength)]), origin: .other)
                    case .unknownDamage:
                        hidden = true
                    default:
                        break
                    }
                }
            }
            if hidden {
                damage.noteHidden(region.sequence)
                return false
            }
        }
        if !allowingEviction {
            // Room check before anything changes: the entries and tombstones must fit the newest region, free
            // slots, or growth within the limit (no other region is reclaimed for a heal).
            let low = layout.start(of: region)
            let high = low + layout.capacity(of: region)
            var entriesLength = 0
            for slot in index.slots where !slot.isEmpty && !slot.isPending && slot.offset >= low && slot.offset < high {
                entriesLength += slot.length
            }
            let newest = position == layout.regions.count - 1 ? nil : layout.regions.last
            let room = newest.map { layout.capacity(of: $0) - $0.end } ?? 0
            let needed = entriesLength + batch.bytes.count
            if needed > room {
                let slots = layout.slotsFor(needed)
                guard layout.freeSlotCount >= slots || layout.size + slots * layout.regionSize <= layout.limit else { return false }
            }
        }
        try takeEntries(of: region, now: now) { _, _ in reinsertingLive } keep: { slot, record in
            batch.append(record, origin: .reinserted(slot))
        }
        // Out of the list first, so that nothing is appended to it; its slots stay taken until the batch is
        // written (nothing may be placed there while its tombstones are still needed).
        layout.regions.remove(at: position)
        do {
            switch try write(&batch, policy: .last, now: now) {
            case .done: break
            case .short: break  // `.last` never reports a shortfall
            }
        } catch {
            // The region's records stay in the file, and its tombstones with them: keep it (its entries are
            // out of the index now, evicted: their records may still be found by a recovery).
            layout.regions.insert(region, at: min(position, layout.regions.count))
            layout.regions.sort { $0.sequence < $1.sequence }
            damage.noteUnindexed(region.sequence)
            throw error
        }
        for s in region.slot..<(region.slot + region.slots) { layout.freeSlots[s] = true }
        try zeroHeaders(of: [region.slot])
        damage.forget(region.sequence)
        counters.evacuations += 1
        return true
    }

    // MARK: Tombstones

    /// Writes a tombstone for `key` at once (see the top of Bucket.swift).
    /// The caller first sets the credits of the key's slot in the file, if it has one, to zero: a reclaim
    /// this write makes must not copy that record forward (the copy would get a newer sequence number than
    /// the tombstone's cover, and come back after a crash); with no credits it is evicted, not reinserted.
    mutating func writeTombstone(for key: HashedKey, policy: RoomPolicy, now: Int64) throws(MagpieError) -> RoomOutcome<Void> {
        var batch = WriteBatch()
        Self.appendTombstone(for: key.bytes, hash: key.hash, covering: 0, to: &batch)
        return try write(&batch, policy: policy, now: now)
    }

    /// Appends a tombstone for the key `key` (of hash `hash`) that removes its records below `cover` (0:
    /// below the tombstone's own sequence number) to `batch`.
    static func appendTombstone(for key: UnsafeRawBufferPointer, hash: UInt64, covering cover: UInt64, to batch: inout WriteBatch) {
        let header = RecordHeader(
            kind: .tombstone, codec: .raw, keyLength: key.count, groupLength: 0, storedLength: 0, originalLength: 0,
            expiry: Int64(bitPattern: cover), sequence: 0, keyHash: hash)
        let none = UnsafeRawBufferPointer(start: nil, count: 0)
        let draft = RecordDraft(header: header, key: key, group: none, payload: none)
        batch.append(length: draft.length, origin: .other) { raw in
            draft.write(into: raw)
            RecordHeader.sealPayload(raw)
        }
    }

    /// Writes a group tombstone for `group` at once.
    mutating func writeGroupTombstone(_ group: UnsafeRawBufferPointer, policy: RoomPolicy, now: Int64) throws(MagpieError)
        -> RoomOutcome<Void>
    {
        let header = RecordHeader(
            kind: .groupTombstone, codec: .raw, keyLength: 0, groupLength: group.count, storedLength: 0, originalLength: 0,
            expiry: 0, sequence: 0, keyHash: 0)
        let none = UnsafeRawBufferPointer(start: nil, count: 0)
        return try writeSingle(RecordDraft(header: header, key: none, group: group, payload: none), policy: policy, now: now)
    }

    private mutating func writeSingle(_ draft: RecordDraft, policy: RoomPolicy, now: Int64) throws(MagpieError) -> RoomOutcome<Void> {
        var batch = WriteBatch()
        batch.append(length: draft.length, origin: .other) { raw in
            draft.write(into: raw)
            RecordHeader.sealPayload(raw)
        }
        return try write(&batch, policy: policy, now: now)
    }
}
