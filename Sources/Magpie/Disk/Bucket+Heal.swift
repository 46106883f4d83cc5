// MARK: - Healing: damage found in a bucket file leaves it, and is counted once
//
// Damage is found by recovery (Bucket+Recovery.swift, which sorts it into the two kinds below) or by a read
// whose record does not verify (`dropCorrupt`): the read's record is dropped, and when the operation ends
// the bucket checks every region (`scrub`: each one's bytes read and scanned as recovery would), since a
// file damaged in one place (a disk error, a truncation or a write by something that ignored LOCK) may be
// damaged in others. Then:
//  - a region whose only damage is *known* — values whose payloads do not verify, their keys dropped — is
//    emptied into the newest region (its other entries reinserted, its tombstones carried forward:
//    `evacuate`), when that needs no eviction; else it stays until it is reclaimed in turn;
//  - a region whose damage may hide a tombstone — bytes that are no record, or records gone (a file cut
//    short) — goes with every region older than it, oldest first: a tombstone lost there may have covered
//    any older record, which a recovery would bring back. Their live entries are reinserted: the index
//    says what is live (recovery has already dropped what damage it met may have removed, see
//    Bucket+Recovery.swift), and a reinserted copy is newer than anything the damage hid. Damage costs
//    misses, never a removed or replaced value brought back.
// A failure is logged; the damage then stays skipped.
//
// A write that failed may also leave records in the file that no slot points at (`unindexedRegion`,
// Bucket+Regions.swift): not damage, but known to be wrong in the same way, and forgotten with the region.

/// What a bucket knows is wrong with its file and has not yet mended (see above).
struct BucketDamage {
    /// Regions (by sequence) whose damage is known (a value whose payload does not verify), to be emptied
    /// into the newest region when the operation that found it ends (not at once: it may still hold index
    /// positions).
    var known: [UInt64] = []
    /// Regions whose damage may hide tombstones: they go with every older region.
    var hidden: [UInt64] = []
    /// A read met damage: every region is to be checked.
    var needsScrub = false
    /// A write that failed may have left records in the file that no slot points at (the sequence of its
    /// region; `.max` after a freed region's header could not be zeroed, see `zeroHeaders`): until that
    /// region is gone, removals and overwrites of keys that are not indexed write a tombstone all the
    /// same, and the close writes no snapshot.
    var unindexedRegion: UInt64? = nil

    /// Whether there is damage to heal (`healIfNeeded` has work).
    var needsHealing: Bool { needsScrub || !known.isEmpty || !hidden.isEmpty }

    /// A region that is gone: nothing of it is to be healed or watched any more.
    mutating func forget(_ sequence: UInt64) {
        if unindexedRegion == sequence { unindexedRegion = nil }
        hidden.removeAll { $0 == sequence }
        known.removeAll { $0 == sequence }
    }

    /// Notes that region `sequence` may hold records no slot points at (see `unindexedRegion` and
    /// Bucket+Regions.swift). One region is named; a second one (or a free slot's header, `.max`) makes it
    /// `.max`, which no reclaim clears: replacing the name would let the first region's records be
    /// forgotten while they are still in the file.
    mutating func noteUnindexed(_ sequence: UInt64) {
        unindexedRegion = unindexedRegion == nil || unindexedRegion == sequence ? sequence : .max
    }

    /// Notes hidden damage in region `sequence` (once).
    mutating func noteHidden(_ sequence: UInt64) {
        if !hidden.contains(sequence) { hidden.append(sequence) }
    }

    /// Notes known damage in region `sequence` (once).
    mutating func noteKnown(_ sequence: UInt64) {
        if !known.contains(sequence) { known.append(sequence) }
    }
}

extension BucketState {
    /// Heals what the operation found (see above).
    mutating func healIfNeeded(now: Int64) {
        guard damage.needsHealing else { return }
        do {
            if damage.needsScrub {
                damage.needsScrub = false
                try scrub()
            }
            if let deepest = damage.hidden.max() { try reclaim(through: deepest, now: now) }
            let known = damage.known
            for sequence in known {
                guard let position = layout.regions.firstIndex(where: { $0.sequence == sequence }) else { continue }
                if try evacuate(at: position, reinsertingLive: true, allowingEviction: false, now: now) {
                    damage.known.removeAll { $0 == sequence }
                }
            }
            if let deepest = damage.hidden.max() { try reclaim(through: deepest, now: now) }  // found by an evacuation
        } catch {
            context.logs.healFailed.record(error: "\(error)", metadata: ["path": "\(context.path)"])
        }
    }

    /// Checks every region's bytes (see above): index slots that point at no verified record are dropped
    /// (counted corrupt), and each damaged region is noted as known or hidden damage (a region the file no
    /// longer holds whole is hidden damage: a short read).
    private mutating func scrub() throws(MagpieError) {
        settleDeferredWrite()  // regions' ends count a deferred write's records from their placing on (Bucket+RecordWrite.swift)
        for region in layout.regions {
            let low = layout.start(of: region)
            let bytes = try readBytes(region.end, at: low, mapping: layout.mapping)
            var records = Set<Int>()  // offsets of the verified records
            var hidden = bytes.count < region.end
            var broken = false
            let scan = bytes.withUnsafeBytes { raw in
                Self.forEachRecord(inRegion: raw, firstSequence: region.firstRecordSequence, context: context) { event in
                    switch event {
                    case .record(let offset, _): records.insert(low + offset)
                    case .brokenValue: broken = true
                    case .unknownDamage: hidden = true
                    }
                }
            }
            // Bytes the region had written that no longer scan as its records: whatever they held is lost.
            if scan.end < region.end { hidden = true }
            let high = low + layout.capacity(of: region)
            let dropped = dropAll { !$0.isPending && $0.offset >= low && $0.offset < high && !records.contains($0.offset) }
            counters.corruptRecords += UInt64(dropped)
            if hidden {
                damage.hidden.append(region.sequence)
            } else if broken || dropped > 0 {
                damage.known.append(region.sequence)
            }
        }
    }

    /// Reclaims every region from the oldest through the one of `sequence`, oldest first, reinserting their
    /// live entries (see above).
    mutating func reclaim(through sequence: UInt64, now: Int64) throws(MagpieError) {
        settleDeferredWrite()  // regions change below (Bucket+RecordWrite.swift)
        var batch = WriteBatch()
        var reclaimed: [Region] = []
        while let oldest = layout.regions.first, oldest.sequence <= sequence {
            try takeEntries(of: oldest, now: now) { _, _ in true } keep: { slot, record in
                batch.append(record, origin: .reinserted(slot))
            }
            layout.regions.removeFirst()
            reclaimed.append(oldest)
            counters.evacuations += 1
        }
        damage.hidden.removeAll { $0 <= sequence }
        // Their slots are free for the copies (a copy placed there overwrites the old region's header); the
        // rest are zeroed after.
        for region in reclaimed {
            for slot in region.slot..<(region.slot + region.slots) { layout.freeSlots[slot] = true }
            damage.forget(region.sequence)
        }
        _ = try write(&batch, policy: .last, now: now)
        try zeroHeaders(of: reclaimed.map(\.slot))
    }
}
