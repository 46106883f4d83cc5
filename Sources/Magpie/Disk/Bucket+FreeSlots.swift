// MARK: - Free slots: what they still hold, checked against what recovery found
//
// A slot whose first bytes are no valid region header is free, but may still hold records:
// those of a region reclaimed or emptied (its header zeroed), the tail of a jumbo record, or those of a
// region whose header was damaged. Every record found there (each free slot scanned from its start) counts
// toward the sequence numbers (a region opened there later must start above them), and is checked against
// what the regions recovered: a value drops a recovered record of its key older than itself; a tombstone
// or group tombstone, what its cover removes. For a slot the tier freed this drops nothing: regions are
// reclaimed oldest first; one emptied out of turn carries its tombstones forward, and its live entries are
// copied (newer) or evicted; an overwrite's tombstone covers the older value wherever it lies. What it does
// drop is what a region with a damaged header would have removed or replaced: counted (a corrupt record
// per such slot; the entries dropped in `droppedForDamage`), and made to last by a tombstone per dropped
// record, written before the bucket serves anything (the slot may be reused, and its records gone, before
// the older regions are). A damaged header over records that are damaged too hides them for good: two
// faults in one place, not guarded against.
/// What free slots' records dropped from a recovered index: the slots, and each dropped record's key, key
/// hash and sequence number.
struct HiddenRecords {
    var slots: [Int] = []
    var dropped: [(key: [UInt8], hash: UInt64, sequence: UInt64)] = []
}

extension BucketState {
    /// Each free slot's records, from its start (a record starting in it is read whole, into the free
    /// slots after it), count toward `maximumSequence` and are checked against what the regions recovered.
    /// Returns the slots whose records dropped recovered entries, and the records they dropped.
    mutating func checkFreeSlots(
        _ file: UnsafeRawBufferPointer, groups: inout [[UInt8]: [UInt32]], now: Int64
    ) -> HiddenRecords {
        var hidden = HiddenRecords()
        var slot = 0
        while slot < layout.slotCount {
            guard layout.freeSlots[slot] else {
                slot += 1
                continue
            }
            var end = slot + 1
            while end < layout.slotCount && layout.freeSlots[end] { end += 1 }
            let high = min(file.count, BucketFileHeader.size + end * layout.regionSize)
            for free in slot..<end {
                let low = BucketFileHeader.size + free * layout.regionSize
                guard low + RegionHeader.size + RecordHeader.size <= high else { continue }
                let bytes = UnsafeRawBufferPointer(rebasing: file[low..<high])
                let before = (count: index.count, slots: index.slots)  // the slots copied only if one is dropped
                // Up to the next slot's first 64 bytes: its own scan starts after them (a record there is
                // this run's, not a header).
                _ = Self.forEachRecord(inRegion: bytes, firstSequence: 0, stop: layout.regionSize + RegionHeader.size, context: context) { event in
                    switch event {
                    case .record(let offset, let header), .brokenValue(let offset, let header):
                        layout.maximumSequence = max(layout.maximumSequence, header.sequence)
                        let record = UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + header.recordLength)])
                        if header.kind == .value {
                            // Whatever became of this value, an older record of its key is outdated by it.
                            let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
                            removeRecovered(keyHash: header.keyHash, key: key, below: header.sequence, file: file)
                        } else {
                            apply(header, record, at: low + offset, groups: &groups, file: file, now: now)
                        }
                    case .unknownDamage:
                        break
                    }
                }
                guard index.count < before.count else { continue }
                hidden.slots.append(free)
                let kept = Set(index.slots.lazy.filter { !$0.isEmpty }.map(\.offset))
                for slot in before.slots where !slot.isEmpty && !kept.contains(slot.offset) {
                    let record = UnsafeRawBufferPointer(rebasing: file[slot.offset...])
                    guard let header = RecordHeader.decode(record) else { continue }
                    hidden.dropped.append((Array(record[header.keyOffset..<header.groupOffset]), header.keyHash, header.sequence))
                }
            }
            slot = end
        }
        return hidden
    }

    /// What a damaged header hid is made to last: a tombstone per record `hidden` dropped, covering it and
    /// nothing newer, written before the bucket serves anything (else a later scan, once the free slot is
    /// reused, would find the dropped records again). Counted once: with the tombstones in, the next scan
    /// drops nothing.
    mutating func makeLast(_ hidden: HiddenRecords, now: Int64) throws(MagpieError) {
        counters.corruptRecords += UInt64(hidden.slots.count)
        counters.droppedForDamage += UInt64(hidden.dropped.count)
        var batch = WriteBatch()
        for record in hidden.dropped {
            record.key.withUnsafeBytes { key in Self.appendTombstone(for: key, hash: record.hash, covering: record.sequence &+ 1, to: &batch) }
        }
        // Not into the slots whose records did the dropping (nor the free ones after them, which their
        // records may run into): a region opened there would hide them from a scan before its
        // tombstones are written. Until the write is done, a crash or a failure (the load fails; the
        // next operation tries again) leaves them to be found again.
        var held: [Int] = []
        for slot in hidden.slots {
            var free = slot
            while free < layout.slotCount && layout.freeSlots[free] {
                layout.freeSlots[free] = false
                held.append(free)
                free += 1
            }
        }
        defer { for slot in held { layout.freeSlots[slot] = true } }
        _ = try write(&batch, policy: .last, now: now)
    }
}
