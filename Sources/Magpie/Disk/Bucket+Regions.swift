import Glibc

// MARK: - Regions: appending records, opening regions, reclaiming the oldest
//
// The layout is in Format/OnDiskFormat.swift, the policy at the top of Bucket.swift. Everything here runs
// under the bucket's lock.
//
// Appending (`write(_:policy:now:)`). A batch of records (a memtable's, sealed by Bucket+Seal.swift; a
// tombstone; entries reinserted or tombstones carried forward) is placed record by record at the newest
// region's end; a record that does not fit opens a new region, in a free slot, else in a slot the file
// grows by (within the bucket's limit, borrowed from the tier first: `reserveRoom`), else in the slot of
// the oldest region, reclaimed. A record is stamped with the bucket's next sequence number as it is
// placed, so sequence numbers increase in file order within a region and in region order across them.
// Placed records are written in *flights*: one `pwrite` per run of contiguous records, before the next
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

extension BucketState {
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

    /// New slots the batch's records would take from the newest region's end on, reclaiming nothing.
    private func slotsNeeded(_ batch: WriteBatch) -> Int {
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

    /// Writes `batch` (see the top of this file). With `.borrow`, reports a shortfall (nothing changed)
    /// when the file cannot grow enough within its limit and what the tier's pool lends; with `.evict`, it
    /// reclaims the oldest regions for what is missing. Memtable records whose key no longer points at
    /// them are left out. On a throw the records not written are gone (see the top of this file).
    mutating func write(_ batch: inout WriteBatch, policy: RoomPolicy, now: Int64) throws(MagpieError) -> RoomOutcome<Void> {
        guard !batch.isEmpty else { return .done(()) }
        let missing = slotsNeeded(batch) - freeSlotCount
        if missing > 0, let short = reserveRoom(missing * regionSize, policy: policy) {
            let largest = batch.items.map(\.length).max() ?? 0
            return .short(Shortfall(bytes: short.bytes, fitsAlone: BucketFileHeader.size + slotsFor(largest) * regionSize <= limit))
        }
        try beforeFileChange()
        var flight = Flight()
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
                if regions.last.map({ capacity(of: $0) - $0.end < item.length }) ?? true {
                    try openRegion(for: item.length, batch: &batch, flight: &flight, freed: &freed, now: now)
                }
                place(next, of: &batch, in: &flight)
                next += 1
            }
            try fly(&flight, batch: batch)
        } catch {
            abandon(batch, from: next, flight: flight)
            try? zeroHeaders(of: freed)
            throw error
        }
        try zeroHeaders(of: freed)
        return .done(())
    }

    /// Placed records not yet written: each item with its file offset.
    struct Flight {
        var placed: [(item: Int, offset: Int)] = []
    }

    /// Places item `n` at the end of the newest region: stamps it with the next sequence number and adds
    /// it to the flight.
    private mutating func place(_ n: Int, of batch: inout WriteBatch, in flight: inout Flight) {
        let last = regions.count - 1
        let offset = start(of: regions[last]) + regions[last].end
        let item = batch.items[n]
        maximumSequence &+= 1
        let sequence = maximumSequence
        batch.bytes.withUnsafeMutableBytes { raw in
            RecordHeader.seal(UnsafeMutableRawBufferPointer(rebasing: raw[item.start..<(item.start + item.length)]), sequence: sequence)
        }
        regions[last].end += item.length
        flight.placed.append((n, offset))
    }

    /// Writes the flight's records (one `pwrite` per contiguous run) and points their slots into the file.
    private mutating func fly(_ flight: inout Flight, batch: WriteBatch) throws(MagpieError) {
        guard !flight.placed.isEmpty else { return }
        var run: [UInt8] = []
        var runStart = 0
        var done = 0  // placed records written
        let path = context.path
        func writeRun(_ state: inout BucketState, upTo end: Int) throws(MagpieError) {
            guard !run.isEmpty else { return }
            var written = 0
            do {
                try run.withUnsafeBytes { bytes in
                    Result { () throws(MagpieError) in try FileIO.write(state.fd, bytes, at: runStart, path: path, done: &written) }
                }.get()
            } catch {
                // What the failed write did put in the file is zeroed (its pages exist: the overwrite needs no
                // new space), so that no record of it is left that no slot points at; if that fails too, the
                // region is noted (see the top of this file).
                let zeros = [UInt8](repeating: 0, count: written)
                if written > 0, (try? FileIO.write(state.fd, zeros, at: runStart, path: path, operation: "zero")) == nil,
                    let position = state.regionPosition(holding: state.slot(ofOffset: runStart))
                {
                    state.unindexedRegion = state.regions[position].sequence
                }
                throw error
            }
            state.counters.bytesWritten += UInt64(run.count)
            for k in done..<end { state.land(flight.placed[k], batch: batch) }
            done = end
            run.removeAll(keepingCapacity: true)
        }
        for (k, placed) in flight.placed.enumerated() {
            let item = batch.items[placed.item]
            if run.isEmpty || runStart + run.count != placed.offset {
                try writeRun(&self, upTo: k)
                runStart = placed.offset
            }
            batch.bytes.withUnsafeBytes { run.append(contentsOf: UnsafeRawBufferPointer(rebasing: $0[item.start..<(item.start + item.length)])) }
        }
        do {
            try writeRun(&self, upTo: flight.placed.count)
        } catch {
            flight.placed.removeFirst(done)
            throw error
        }
        flight = Flight()
        if let mapping, size > mapping.length { remap(length: min(context.ledger.maximumLimit, max(limit, 2 * mapping.length))) }
    }

    /// A written record's slot now points at it in the file.
    private mutating func land(_ placed: (item: Int, offset: Int), batch: WriteBatch) {
        let item = batch.items[placed.item]
        switch item.origin {
        case .memtable(let parity, let offset, let tag):
            guard let position = pendingPosition(tag: tag, parity: parity, offset: offset) else { return }
            let old = index[position].length
            index[position].place(at: placed.offset, length: item.length)
            pendingCount -= 1
            pendingBytes -= old
            liveBytes += item.length
        case .reinserted(var slot):
            slot.place(at: placed.offset, length: item.length)
            slot.credits = 0
            insert(slot)
        case .other:
            break
        }
    }

    /// After a failed write: each region ends before the first record of the flight that was not written
    /// (the next write goes over whatever the failed one left). The slots of the memtable records not
    /// written stay pending: the caller drops (and counts) them with their memtable (`abandonSeal`);
    /// reinserted entries not written are simply gone (evicted).
    private mutating func abandon(_ batch: WriteBatch, from next: Int, flight: Flight) {
        for placed in flight.placed {
            let slot = slot(ofOffset: placed.offset)
            guard let position = regionPosition(holding: slot) else { continue }
            regions[position].end = min(regions[position].end, placed.offset - start(of: regions[position]))
        }
    }

    /// Opens a region for a record of `length` bytes: in free slots, else in slots the file grows by
    /// (within its limit), else in the oldest region's, reclaimed (the flight is written first).
    private mutating func openRegion(
        for length: Int, batch: inout WriteBatch, flight: inout Flight, freed: inout [Int], now: Int64
    ) throws(MagpieError) {
        let count = slotsFor(length)
        var first: Int? = nil
        while first == nil {
            if let found = freeRun(of: count) {
                first = found
            } else if let grown = try grow(toFit: count) {
                first = grown
            } else {
                guard !regions.isEmpty else {
                    throw MagpieError(.valueTooLarge, "a \(length)-byte record does not fit the disk tier's budget", path: context.path)
                }
                try fly(&flight, batch: batch)  // the reclaim must see placed records in the index
                try reclaimOldest(into: &batch, freed: &freed, now: now)
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
            bucketIndex: context.number, slots: count, sequence: nextRegionSequence, firstRecordSequence: maximumSequence &+ 1)
        try FileIO.write(fd, header.encoded(hasher: context.hasher), at: BucketFileHeader.size + slot * regionSize, path: context.path)
        counters.bytesWritten += UInt64(RegionHeader.size)
        for s in slot..<(slot + count) { freeSlots[s] = false }
        freed.removeAll { $0 >= slot && $0 < slot + count }
        regions.append(Region(slot: slot, slots: count, sequence: nextRegionSequence, firstRecordSequence: maximumSequence &+ 1, end: RegionHeader.size))
        nextRegionSequence &+= 1
    }

    /// The first slot of `count` consecutive free slots, the lowest such run.
    private func freeRun(of count: Int) -> Int? {
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

    /// Gives the file (within its limit) `count` consecutive free slots at its end; returns the first.
    /// While the tier is in debt (its pool below zero: a directory that held more than the ledger was told,
    /// see DiskLedger.swift) the limit's unused part repays it first.
    private mutating func grow(toFit count: Int) throws(MagpieError) -> Int? {
        guard allocationCeiling == .max else { return nil }
        let debt = -context.ledger.pool.available
        if debt > 0 {
            let repaid = min(debt, max(0, limit - size))
            limit -= repaid
            context.ledger.pool.give(repaid)
        }
        var trailing = 0
        while trailing < freeSlots.count && freeSlots[freeSlots.count - 1 - trailing] { trailing += 1 }
        let adding = count - trailing
        guard size + adding * regionSize <= limit else { return nil }
        // Only counted: the file itself grows as its slots are written (so it holds no unwritten tail).
        slotCount += adding
        freeSlots += repeatElement(true, count: adding)
        if let mapping, size > mapping.length { remap(length: min(context.ledger.maximumLimit, max(limit, 2 * mapping.length))) }
        return slotCount - count
    }

    /// Zeroes the headers of freed slots (the region header, so that recovery never finds it again).
    mutating func zeroHeaders(of slots: [Int]) throws(MagpieError) {
        let zeros = [UInt8](repeating: 0, count: RegionHeader.size)
        for slot in slots where slot < slotCount && freeSlots[slot] {
            try FileIO.write(fd, zeros, at: BucketFileHeader.size + slot * regionSize, path: context.path)
        }
    }

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
    private mutating func reclaimOldest(into batch: inout WriteBatch, freed: inout [Int], now: Int64) throws(MagpieError) {
        let victim = regions[0]
        let meanLength = fileEntryCount == 0 ? 0 : liveBytes / fileEntryCount
        var budget = capacity(of: victim) * 3 / 4
        try takeEntries(of: victim, now: now) { state, slot in
            guard state.reinserts(slot, meanLength: meanLength), slot.length <= budget else { return false }
            budget -= slot.length
            return true
        } keep: { slot, record in
            batch.append(record, origin: .reinserted(slot))
        }
        regions.removeFirst()
        for s in victim.slot..<(victim.slot + victim.slots) { freeSlots[s] = true }
        freed.append(victim.slot)
        forget(victim.sequence)
        counters.reclaims += 1
    }

    /// Drops every live entry of `region` from the index: expired ones (counted); those `wants` (their
    /// record then read and verified, and given to `keep` — or, if it does not verify, counted corrupt);
    /// and the rest, evicted, unread.
    mutating func takeEntries(
        of region: Region, now: Int64, wants: (inout BucketState, DiskSlot) -> Bool, keep: (DiskSlot, UnsafeRawBufferPointer) -> Void
    ) throws(MagpieError) {
        let low = start(of: region)
        let high = low + capacity(of: region)
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

    /// A region that is gone: nothing of it is to be healed or watched any more.
    mutating func forget(_ sequence: UInt64) {
        if unindexedRegion == sequence { unindexedRegion = nil }
        hiddenDamage.removeAll { $0 == sequence }
        damaged.removeAll { $0 == sequence }
    }

    /// Empties the region at `position` out of turn: its live entries are reinserted (`reinsertingLive`:
    /// to heal damage) or evicted (to give room back), its tombstones carried forward when older regions
    /// remain (with their covers: see Format/OnDiskFormat.swift, "Tombstones"); then its slots are freed
    /// and its header zeroed. Without `allowingEviction`, it does nothing (returns false) when that would
    /// take a reclaim.
    @discardableResult
    mutating func evacuate(at position: Int, reinsertingLive: Bool, allowingEviction: Bool, now: Int64) throws(MagpieError) -> Bool {
        let region = regions[position]
        var batch = WriteBatch()
        if position > 0 {
            // Tombstones: read from the region's bytes (they are in no index). Unknown damage may hide one:
            // then the region stays (see Bucket+Recovery.swift).
            let bytes = try readBytes(region.end, at: start(of: region), mapping: mapping)
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
                if !hiddenDamage.contains(region.sequence) { hiddenDamage.append(region.sequence) }
                return false
            }
        }
        if !allowingEviction {
            // Room check before anything changes: the entries and tombstones must fit the newest region, free
            // slots, or growth within the limit (no other region is reclaimed for a heal).
            let low = start(of: region)
            let high = low + capacity(of: region)
            var entriesLength = 0
            for slot in index.slots where !slot.isEmpty && !slot.isPending && slot.offset >= low && slot.offset < high {
                entriesLength += slot.length
            }
            let newest = position == regions.count - 1 ? nil : regions.last
            let room = newest.map { capacity(of: $0) - $0.end } ?? 0
            let needed = entriesLength + batch.bytes.count
            if needed > room {
                let slots = slotsFor(needed)
                guard freeSlotCount >= slots || size + slots * regionSize <= limit else { return false }
            }
        }
        try takeEntries(of: region, now: now) { _, _ in reinsertingLive } keep: { slot, record in
            batch.append(record, origin: .reinserted(slot))
        }
        // Out of the list first, so that nothing is appended to it; its slots stay taken until the batch is
        // written (nothing may be placed there while its tombstones are still needed).
        regions.remove(at: position)
        do {
            switch try write(&batch, policy: .evict, now: now) {
            case .done: break
            case .short: break  // `.evict` never reports a shortfall
            }
        } catch {
            // The region's records stay in the file, and its tombstones with them: keep it (its entries are
            // out of the index now, evicted: their records may still be found by a recovery).
            regions.insert(region, at: min(position, regions.count))
            regions.sort { $0.sequence < $1.sequence }
            unindexedRegion = region.sequence
            throw error
        }
        for s in region.slot..<(region.slot + region.slots) { freeSlots[s] = true }
        try zeroHeaders(of: [region.slot])
        forget(region.sequence)
        counters.evacuations += 1
        return true
    }

    // MARK: Tombstones

    /// Writes a tombstone for `key` at once (see the top of Bucket.swift).
    /// The caller first sets the credits of the key's slot in the file, if it has one, to zero: a reclaim
    /// this write makes must not copy that record forward (the copy would get a newer sequence number than
    /// the tombstone's cover, and come back after a crash); with no credits it is evicted, not reinserted.
    mutating func writeTombstone(for key: HashedKey, policy: RoomPolicy, now: Int64) throws(MagpieError) -> RoomOutcome<Void> {
        let header = RecordHeader(
            kind: .tombstone, codec: .raw, keyLength: key.count, groupLength: 0, storedLength: 0, originalLength: 0,
            expiry: 0, sequence: 0, keyHash: key.hash)
        let none = UnsafeRawBufferPointer(start: nil, count: 0)
        return try writeSingle(RecordDraft(header: header, key: key.bytes, group: none, payload: none), policy: policy, now: now)
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
