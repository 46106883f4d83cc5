import Glibc

// MARK: - Regions: appending records, opening regions, reclaiming the oldest
//
// The layout is in Format/OnDiskFormat.swift, the policy at the top of Bucket.swift. Everything here runs
// under the bucket's lock (but for a seal's deferred write, which its caller writes without it: see
// Bucket+RecordWrite.swift).
//
// Appending (`write(_:policy:now:)`). A batch of records (a memtable's, sealed by Bucket+Seal.swift; a
// tombstone; entries reinserted or tombstones carried forward) is placed record by record at the newest
// region's end; a record that does not fit opens a new region, in a free slot, else in a slot the file
// grows by (within the bucket's limit, borrowed from the tier first: `reserveRoom`), else in the slot of
// the oldest region, reclaimed. A record is stamped with the bucket's next sequence number as it is
// placed, so sequence numbers increase in file order within a region and in region order across them.
// Placed records are written together (``RecordWrite``): one `pwrite` per run of contiguous records, before the next
// reclaim (which must see them in the index, and may reuse no slot a placed record is bound for) and at
// the end. Then their slots point into the file.
//
// Invariants, at the end of every operation:
//  - every slot of the file is free or held by exactly one region of `regions`; a free slot's first 64
//    bytes hold no valid region header (they are zeroed when a region is reclaimed, unless a new region's
//    header has already overwritten them);
//  - `regions` is in increasing sequence order, and each region's records end at its `end`;
//  - every index slot that is not pending points at a valid record inside some region's used part.
//
// Failures. A write that fails leaves the regions' ends where the failed write began (the next write
// goes over whatever it left); the memtable records it did not write are lost with their memtable (misses,
// Bucket+Seal.swift), reinserted ones are evicted; and what of it did reach the file is zeroed. If that fails too,
// the region is noted in `unindexedRegion`: its bytes may hold records no slot points at, so until that
// region is gone every removal and overwrite writes a tombstone whether or not the key is indexed.

/// A region of a bucket file (see Format/OnDiskFormat.swift): where it lies and how much of it is used.
struct Region: Equatable {
    /// Its first slot.
    var slot: Int
    /// Its slots (1, or more for a record longer than a slot).
    var slots: Int
    var sequence: UInt64
    /// No record in it has a lower sequence number.
    var firstRecordSequence: UInt64
    /// Bytes used from the region's start, its header included: the next record goes there.
    var end: Int
}

/// Records a bucket is about to write, in order, each sealed but for its sequence number (which placing
/// it stamps: `RecordHeader.seal`), in one buffer.
struct WriteBatch {
    enum Origin: Equatable {
        /// A record of the sealing memtable of `parity`, at `offset` there: written only if its key's slot
        /// still points at it; then the slot points at the copy in the file.
        case memtable(parity: Int, offset: Int, tag: UInt32)
        /// An entry reinserted by a reclaim: its slot (out of the index meanwhile) goes back in, pointing
        /// at the new copy.
        case reinserted(DiskSlot)
        /// A tombstone or group tombstone.
        case other
    }

    struct Item {
        var start: Int
        var length: Int
        var origin: Origin
    }

    var bytes: [UInt8] = []
    var items: [Item] = []

    var isEmpty: Bool { items.isEmpty }

    private static let zeros = [UInt8](repeating: 0, count: 64 * 1024)

    /// Appends a record (`length` bytes that `body` writes in place).
    mutating func append(length: Int, origin: Origin, _ body: (UnsafeMutableRawBufferPointer) -> Void) {
        let start = bytes.count
        // Zeroed room for it, copied from a zero page a chunk at a time (a memcpy each, in any build; a
        // generic sequence of zeros is a byte loop in a debug one, seconds for a value of 64 MiB).
        if bytes.capacity < start + length { bytes.reserveCapacity(Swift.max(start + length, 2 * bytes.capacity)) }
        var left = length
        while left > 0 {
            let chunk = Swift.min(left, WriteBatch.zeros.count)
            WriteBatch.zeros.withUnsafeBytes { bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: $0[0..<chunk])) }
            left -= chunk
        }
        bytes.withUnsafeMutableBytes { body(UnsafeMutableRawBufferPointer(rebasing: $0[start..<(start + length)])) }
        items.append(Item(start: start, length: length, origin: origin))
    }

    /// Appends a copy of `record`.
    mutating func append(_ record: UnsafeRawBufferPointer, origin: Origin) {
        append(length: record.count, origin: origin) { $0.copyMemory(from: record) }
    }
}

/// Where a bucket's records lie (see the top of this file): its file, cut into slots of `regionSize` bytes
/// after its header, the regions that hold them oldest first, the free ones, the sequence numbers the next
/// region and record take, and the limit the file may grow to (Bucket+Room.swift).
struct BucketLayout {
    var fd: Int32 = -1
    /// The file's mapping for reads (see FileMapping.swift); nil: reads use `pread`.
    var mapping: FileMapping? = nil
    /// The size of this file's slots: its header's (the tier's for a new or emptied file).
    var regionSize: Int
    /// Slots in the file: it takes `BucketFileHeader.size + slotCount × regionSize` bytes of the budget
    /// (`size`), and is as long as what was written of them, no longer (its last slot may be written in
    /// part only, and a free slot past the end of what was written is not in it).
    var slotCount = 0
    /// The file's regions, oldest first; records are appended to the last.
    var regions: [Region] = []
    /// Per slot: whether no region holds it.
    var freeSlots: [Bool] = []
    /// Regions open only in slots below this (while the file shrinks: Bucket+Room.swift).
    var allocationCeiling = Int.max
    /// The sequence number of the next region opened.
    var nextRegionSequence: UInt64 = 1
    /// The highest record sequence number written; the bucket stamps its next record with the one after.
    var maximumSequence: UInt64 = 0
    /// The most bytes the file may hold now: its share, plus what it borrowed, less what it lent.
    var limit: Int

    init(regionSize: Int, limit: Int) {
        self.regionSize = regionSize
        self.limit = limit
    }

    /// Bytes of the budget the file takes: its header and its slots (the file itself may be shorter).
    var size: Int { BucketFileHeader.size + slotCount * regionSize }

    /// The file offset of `region`'s first byte.
    func start(of region: Region) -> Int { BucketFileHeader.size + region.slot * regionSize }

    /// The bytes `region` spans.
    func capacity(of region: Region) -> Int { region.slots * regionSize }

    /// The slot of the file that `offset` lies in.
    func slot(ofOffset offset: Int) -> Int { (offset - BucketFileHeader.size) / regionSize }

    /// The slots a region that opens with a record of `length` bytes takes.
    func slotsFor(_ length: Int) -> Int { max(1, (RegionHeader.size + length + regionSize - 1) / regionSize) }

    /// Free slots.
    var freeSlotCount: Int { freeSlots.reduce(0) { $0 + ($1 ? 1 : 0) } }

    /// The position in `regions` of the region holding slot `slot`, if any.
    func regionPosition(holding slot: Int) -> Int? {
        regions.firstIndex { slot >= $0.slot && slot < $0.slot + $0.slots }
    }

    /// New slots the batch's records would take from the newest region's end on, reclaiming nothing.
    func slotsNeeded(_ batch: WriteBatch) -> Int {
        var room = regions.last.map { capacity(of: $0) - $0.end } ?? 0
        var slots = 0
        for item in batch.items {
            if item.length <= room {
                room -= item.length
            } else {
                let count = slotsFor(item.length)
                slots += count
                room = count * regionSize - RegionHeader.size - item.length
            }
        }
        return slots
    }

    /// The first slot of `count` consecutive free slots, the lowest such run (below `allocationCeiling`).
    func freeRun(of count: Int) -> Int? {
        var runStart = 0
        var runLength = 0
        for slot in 0..<min(freeSlots.count, allocationCeiling) {
            if freeSlots[slot] {
                if runLength == 0 { runStart = slot }
                runLength += 1
                if runLength == count { return runStart }
            } else {
                runLength = 0
            }
        }
        return nil
    }

    /// After a failed write: the region holding `offset` ends there at the latest (the next write goes over
    /// whatever the failed one left).
    mutating func endRegion(before offset: Int) {
        guard let position = regionPosition(holding: slot(ofOffset: offset)) else { return }
        regions[position].end = min(regions[position].end, offset - start(of: regions[position]))
    }
}

extension BucketState {
    /// The position in the index of the pending slot of a memtable record (tag, parity, offset), if its
    /// key still points at it.
    func pendingPosition(tag: UInt32, parity: Int, offset: Int) -> Int? {
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            let slot = index[next]
            if slot.isPending && slot.memtableParity == parity && slot.memtableOffset == offset { return next }
            position = index.next(next)
        }
        return nil
    }

    // MARK: Writing a batch

    /// Writes `batch` (see the top of this file). With `.borrow`, reports a shortfall (nothing changed)
    /// when the file cannot grow enough within its limit and what the tier's pool lends; with `.evict`, it
    /// reclaims the oldest regions for what is missing (a record that would not fit the limit even alone is
    /// still reported short); with `.last`, such a record is refused (`valueTooLarge`). Memtable records
    /// whose key no longer points at them are left out. On a throw the records not written are gone (see
    /// the top of this file).
    mutating func write(_ batch: inout WriteBatch, policy: RoomPolicy, now: Int64) throws(MagpieError) -> RoomOutcome<Void> {
        switch try write(&batch, policy: policy, now: now, deferring: false) {
        case .done: return .done(())
        case .short(let short): return .short(short)
        }
    }

    /// ``write(_:policy:now:)``; with `deferring`, a write that leaves no freed header to zero and reinserts
    /// no entry leaves its last records' `pwrite` to the caller, as a deferred write (Bucket+RecordWrite.swift),
    /// which it returns: noted in `memtables.deferredWrite` until it is settled, its records placed but their
    /// slots still pending.
    mutating func write(_ batch: inout WriteBatch, policy: RoomPolicy, now: Int64, deferring: Bool) throws(MagpieError)
        -> RoomOutcome<RecordWrite?>
    {
        guard !batch.isEmpty else { return .done(nil) }
        let missing = layout.slotsNeeded(batch) - layout.freeSlotCount
        let largest = batch.items.map(\.length).max() ?? 0
        if missing > 0, let short = reserveRoom(missing * layout.regionSize, policy: policy) {
            return .short(Shortfall(bytes: short.bytes, fitsAlone: BucketFileHeader.size + layout.slotsFor(largest) * layout.regionSize <= layout.limit))
        }
        // `.evict` was chosen when the record fitted the limit alone; the room may have been lent since (a
        // bucket's free room is another's to borrow between two attempts). Evicting every region here would
        // not make it fit: report what is missing instead, nothing changed, and the tier gathers it.
        // `.last` refuses it here, before anything changes (reclaiming every region would not help).
        if policy != .borrow {
            let alone = BucketFileHeader.size + layout.slotsFor(largest) * layout.regionSize
            if alone > layout.limit, let short = reserveRoom(alone - layout.size, policy: .borrow) {
                guard policy == .evict else {
                    throw MagpieError(.valueTooLarge, "a \(largest)-byte record does not fit the disk tier's budget", path: context.path)
                }
                return .short(Shortfall(bytes: short.bytes, fitsAlone: false))
            }
        }
        try beforeFileChange()
        var placed = PlacedRecords()
        var freed: [Int] = []  // reclaimed slots whose headers are still to be zeroed
        var next = 0
        do {
            while next < batch.items.count {
                let item = batch.items[next]
                if case .memtable(let parity, let offset, let tag) = item.origin,
                    pendingPosition(tag: tag, parity: parity, offset: offset) == nil
                {
                    next += 1  // replaced or removed since it was stored: never written
                    continue
                }
                if layout.regions.last.map({ layout.capacity(of: $0) - $0.end < item.length }) ?? true {
                    try openRegion(for: item.length, batch: &batch, placed: &placed, freed: &freed, now: now)
                }
                place(next, of: &batch, in: &placed)
                next += 1
            }
            // Deferred only when no freed header is left to zero after the records and no reinserted entry
            // waits, out of the index, for its copy to be written (see Bucket+RecordWrite.swift).
            if deferring && freed.isEmpty && !placed.records.isEmpty
                && !placed.records.contains(where: { if case .reinserted = batch.items[$0.item].origin { true } else { false } })
            {
                let deferred = recordWrite(of: placed, batch: batch)
                memtables.deferredWrite = deferred
                return .done(deferred)
            }
            try writePlaced(&placed, batch: batch)
        } catch {
            abandon(placed)
            try? zeroHeaders(of: freed)
            throw error
        }
        try zeroHeaders(of: freed)
        return .done(nil)
    }

    /// Placed records not yet written: each item with its file offset.
    struct PlacedRecords {
        var records: [(item: Int, offset: Int)] = []
    }

    /// Places item `n` at the end of the newest region: stamps it with the next sequence number and adds
    /// it to `placed`.
    private mutating func place(_ n: Int, of batch: inout WriteBatch, in placed: inout PlacedRecords) {
        let last = layout.regions.count - 1
        let offset = layout.start(of: layout.regions[last]) + layout.regions[last].end
        let item = batch.items[n]
        layout.maximumSequence &+= 1
        let sequence = layout.maximumSequence
        batch.bytes.withUnsafeMutableBytes { raw in
            RecordHeader.seal(UnsafeMutableRawBufferPointer(rebasing: raw[item.start..<(item.start + item.length)]), sequence: sequence)
        }
        layout.regions[last].end += item.length
        placed.records.append((n, offset))
    }

    /// The placed records, as a ``RecordWrite`` to write from `batch`'s bytes.
    private func recordWrite(of placed: PlacedRecords, batch: WriteBatch) -> RecordWrite {
        let records = placed.records.map { placed in
            let item = batch.items[placed.item]
            return RecordWrite.Record(start: item.start, length: item.length, offset: placed.offset, origin: item.origin)
        }
        return RecordWrite(fd: layout.fd, path: context.path, records: records)
    }

    /// Writes the placed records here, under the lock (one `pwrite` per run contiguous in the file and in
    /// the batch, Bucket+RecordWrite.swift), and points their slots into the file. On a failure, `placed`
    /// keeps the records not written (for `abandon`).
    private mutating func writePlaced(_ placed: inout PlacedRecords, batch: WriteBatch) throws(MagpieError) {
        guard !placed.records.isEmpty else { return }
        let write = recordWrite(of: placed, batch: batch)
        let outcome = write.write(from: batch.bytes)
        settle(write, outcome)
        if let failure = outcome.failure {
            placed.records.removeFirst(outcome.written)
            throw failure
        }
        placed = PlacedRecords()
    }

    /// A record of `origin` written at `fileOffset`: its slot now points at it in the file.
    mutating func pointSlot(of origin: WriteBatch.Origin, at fileOffset: Int, length: Int) {
        switch origin {
        case .memtable(let parity, let offset, let tag):
            guard let position = pendingPosition(tag: tag, parity: parity, offset: offset) else { return }
            let old = index[position].length
            index[position].place(at: fileOffset, length: length)
            tally.settle(pendingLength: old, length: length)
        case .reinserted(var slot):
            slot.place(at: fileOffset, length: length)
            slot.credits = 0
            insert(slot)
        case .other:
            break
        }
    }

    /// After a failed write: each region ends before the first placed record that was not written (the
    /// next write goes over whatever the failed one left). The slots of the memtable records not written
    /// stay pending: the caller drops (and counts) them with their memtable (`abandonSeal`); reinserted
    /// entries not written are simply gone (evicted).
    private mutating func abandon(_ placed: PlacedRecords) {
        for record in placed.records { layout.endRegion(before: record.offset) }
    }

    /// Opens a region for a record of `length` bytes: in free slots, else in slots the file grows by
    /// (within its limit), else in the oldest region's, reclaimed (the records placed are written first).
    private mutating func openRegion(
        for length: Int, batch: inout WriteBatch, placed: inout PlacedRecords, freed: inout [Int], now: Int64
    ) throws(MagpieError) {
        let count = layout.slotsFor(length)
        var first: Int? = nil
        while first == nil {
            if let found = layout.freeRun(of: count) {
                first = found
            } else if let grown = try grow(toFit: count) {
                first = grown
            } else {
                guard !layout.regions.isEmpty else {
                    throw MagpieError(.valueTooLarge, "a \(length)-byte record does not fit the disk tier's budget", path: context.path)
                }
                try writePlaced(&placed, batch: batch)  // the reclaim must see placed records in the index
                try reclaimOldest(into: &batch, freed: &freed, now: now)  // Bucket+Reclaim.swift
            }
        }
        let slot = first!
        // Regions reclaimed for it whose slots it does not take lose their headers first: it may overwrite a
        // newer reclaimed region's (a record longer than a slot spans several), and a crash must never
        // leave an older region behind a newer one that went (the newer one's tombstones may cover the
        // older one's records). Reclaims take the oldest regions, whose live entries are in `batch`: a crash
        // after this costs those entries, nothing else.
        let others = freed.filter { $0 < slot || $0 >= slot + count }
        if !others.isEmpty {
            try zeroHeaders(of: others)
            freed.removeAll { $0 < slot || $0 >= slot + count }
        }
        let header = RegionHeader(
            bucketIndex: context.number, slots: count, sequence: layout.nextRegionSequence, firstRecordSequence: layout.maximumSequence &+ 1)
        try FileIO.write(layout.fd, header.encoded(hasher: context.hasher), at: BucketFileHeader.size + slot * layout.regionSize, path: context.path)
        counters.bytesWritten += UInt64(RegionHeader.size)
        for s in slot..<(slot + count) { layout.freeSlots[s] = false }
        freed.removeAll { $0 >= slot && $0 < slot + count }
        layout.regions.append(Region(slot: slot, slots: count, sequence: layout.nextRegionSequence, firstRecordSequence: layout.maximumSequence &+ 1, end: RegionHeader.size))
        layout.nextRegionSequence &+= 1
    }

    /// Gives the file (within its limit) `count` consecutive free slots at its end; returns the first.
    /// While the tier is in debt (see DiskLedger.swift) the limit's unused part repays it first: the room
    /// request before the write (`reserveRoom`) has done so, and gathered what the growth needs beyond the
    /// debt; this repays only a debt that arose since.
    private mutating func grow(toFit count: Int) throws(MagpieError) -> Int? {
        guard layout.allocationCeiling == .max else { return nil }
        _ = repayDebt()
        var trailing = 0
        while trailing < layout.freeSlots.count && layout.freeSlots[layout.freeSlots.count - 1 - trailing] { trailing += 1 }
        let adding = count - trailing
        guard layout.size + adding * layout.regionSize <= layout.limit else { return nil }
        let first = layout.slotCount - trailing
        // With huge pages, as many more free slots as complete the 2 MiB range these end in (if it fits),
        // and the file extended over them, that range cached as one folio (Bucket+HugePages.swift).
        // Otherwise only counted: the file itself grows as its slots are written.
        let huge = hugePageSlots(adding: adding)
        let extra = huge ?? 0
        let oldSize = layout.size
        let wasEmpty = layout.slotCount == 0
        layout.slotCount += adding + extra
        layout.freeSlots += repeatElement(true, count: adding + extra)
        remapIfGrown()
        if huge != nil { try populateHugePages(from: oldSize, wasEmpty: wasEmpty) }
        return first
    }

    /// Maps the file anew once it has grown past its mapping (to the limit, at least twice the old length,
    /// within the tier's largest limit), so that reads reach the slots it grew by.
    mutating func remapIfGrown() {
        remapIfPastMapping(layout.size)
    }

    /// Maps the file anew when `length` (its size, or its limit) is past its mapping: to the limit, at least
    /// twice the old length, within the tier's largest limit.
    mutating func remapIfPastMapping(_ length: Int) {
        if let mapping = layout.mapping, length > mapping.length {
            remap(length: min(context.ledger.maximumLimit, max(layout.limit, 2 * mapping.length)))
        }
    }

    /// Zeroes the headers of freed slots (the region header, so that recovery never finds it again).
    /// If that fails, a free slot keeps a valid header: a scan would take it for a region again, whose
    /// records no slot points at (their entries were evicted or copied). `unindexedRegion` then says so
    /// for as long as the bucket is open (`.max` names no region, so no reclaim clears it).
    mutating func zeroHeaders(of slots: [Int]) throws(MagpieError) {
        let zeros = [UInt8](repeating: 0, count: RegionHeader.size)
        for slot in slots where slot < layout.slotCount && layout.freeSlots[slot] {
            do throws(MagpieError) {
                try FileIO.write(layout.fd, zeros, at: BucketFileHeader.size + slot * layout.regionSize, path: context.path)
            } catch {
                damage.unindexedRegion = .max
                throw error
            }
        }
    }
}
