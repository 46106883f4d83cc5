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

extension BucketState {
    /// Heals what the operation found (see above).
    mutating func healIfNeeded(now: Int64) {
        guard needsScrub || !damaged.isEmpty || !hiddenDamage.isEmpty else { return }
        do {
            if needsScrub {
                needsScrub = false
                try scrub()
            }
            if let deepest = hiddenDamage.max() { try reclaim(through: deepest, now: now) }
            let known = damaged
            for sequence in known {
                guard let position = regions.firstIndex(where: { $0.sequence == sequence }) else { continue }
                if try evacuate(at: position, reinsertingLive: true, allowingEviction: false, now: now) {
                    damaged.removeAll { $0 == sequence }
                }
            }
            if let deepest = hiddenDamage.max() { try reclaim(through: deepest, now: now) }  // found by an evacuation
        } catch {
            context.logs.healFailed.record(error: "\(error)", metadata: ["path": "\(context.path)"])
        }
    }

    /// Checks every region's bytes (see above): index slots that point at no verified record are dropped
    /// (counted corrupt), and each damaged region is noted as known or hidden damage (a region the file no
    /// longer holds whole is hidden damage: a short read).
    private mutating func scrub() throws(MagpieError) {
        settleFlight()  // regions' ends count a flight's records from their placing on (Bucket+Flight.swift)
        for region in regions {
            let low = start(of: region)
            let bytes = try readBytes(region.end, at: low, mapping: mapping)
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
            let high = low + capacity(of: region)
            let dropped = dropAll { !$0.isPending && $0.offset >= low && $0.offset < high && !records.contains($0.offset) }
            counters.corruptRecords += UInt64(dropped)
            if hidden {
                hiddenDamage.append(region.sequence)
            } else if broken || dropped > 0 {
                damaged.append(region.sequence)
            }
        }
    }

    /// Reclaims every region from the oldest through the one of `sequence`, oldest first, reinserting their
    /// live entries (see above).
    mutating func reclaim(through sequence: UInt64, now: Int64) throws(MagpieError) {
        settleFlight()  // regions change below (Bucket+Flight.swift)
        var batch = WriteBatch()
        var reclaimed: [Region] = []
        while let oldest = regions.first, oldest.sequence <= sequence {
            try takeEntries(of: oldest, now: now) { _, _ in true } keep: { slot, record in
                batch.append(record, origin: .reinserted(slot))
            }
            regions.removeFirst()
            reclaimed.append(oldest)
            counters.evacuations += 1
        }
        hiddenDamage.removeAll { $0 <= sequence }
        // Their slots are free for the copies (a copy placed there overwrites the old region's header); the
        // rest are zeroed after.
        for region in reclaimed {
            for slot in region.slot..<(region.slot + region.slots) { freeSlots[slot] = true }
            forget(region.sequence)
        }
        _ = try write(&batch, policy: .last, now: now)
        try zeroHeaders(of: reclaimed.map(\.slot))
    }
}
