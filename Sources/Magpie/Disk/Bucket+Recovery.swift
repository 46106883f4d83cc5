import Glibc

// MARK: - Recovery: rebuilding a bucket's index from its file
//
// The file is read whole. Its header must name this bucket, count and seed (else the file is reset to
// empty, and counted); its region size says where the slots are. Every slot whose first bytes are a
// valid region header of this bucket starts a region; a region overlapping a newer one is a leftover and is
// ignored. Regions apply oldest first, and within a region records apply in file order (Format/
// OnDiskFormat.swift, "Validity"):
//  - a value replaces the key's earlier record (an expired value only removes it);
//  - a tombstone removes the key's record if that record's sequence number is below the tombstone's cover;
//  - a group tombstone removes, likewise, the group's values below its cover.
// A record counts only if it is valid, lies wholly inside its region, belongs to this bucket, and its
// sequence number is at least the region's first and above the previous record's. Damage is of two kinds:
//  - known: a value record whose first bytes verify (so its key is known) but whose payload does not. It
//    counts as one corrupt record, and its key is removed (the record replaced the key's earlier value,
//    which must not come back); the scan goes on after it. The region is emptied into the newest one once
//    the bucket has loaded (`damaged`), so the damage is counted once, not at every open.
//  - unknown: bytes that are no record of this region. The scan resyncs: it tries every following 8-byte
//    boundary of the region for a valid record. If none is found, the region's records end there (a torn
//    last write, zeros, or what a reused slot held before; counted as a torn tail when it looks like a
//    record of this region). If one is found, the bytes skipped count as one corrupt record, and since
//    they may have held a tombstone (or a newer value) for any key written before them, every entry
//    recovered so far is dropped (counted in `droppedForDamage`): damage costs misses, never a removed or
//    replaced value brought back. Such a region is left to be reclaimed in turn (emptying it out of turn
//    would drop the tombstones the damage hides).

//
// Free slots: Bucket+FreeSlots.swift.
extension BucketState {
    /// Opens (creating if needed) the bucket file, and nothing more: its index is loaded by
    /// ``loadIfNeeded()`` (at the bucket's first use, or by the tier's loader thread), so that opening a
    /// tier costs the same whatever it holds. Until then the file and its snapshot are untouched: a crash
    /// before the load finds both as the last close left them.
    ///
    /// Its limit is set from the file's size at once (a file larger than its share had borrowed: it keeps
    /// what it holds), so that the tier's ledger is whole from the open on and does not depend on when
    /// each bucket loads.
    ///
    /// The usual case, the bucket's own regular file, costs one `openat` and one `fstat`; anything else
    /// goes the careful way (``DiskTier/prepareBucketFile(_:hadManifest:)``, then an open that creates).
    /// Returns whether the file was missing or replaced although the directory had a MANIFEST.
    static func open(context: BucketContext, hadManifest: Bool) throws(MagpieError) -> (BucketState, recreated: Bool) {
        var state = BucketState(context: context)
        var recreated = false
        if let (fd, size) = try FileIO.openExistingRegular(context.directory.fd(.buckets), context.name, path: context.path) {
            state.layout.fd = fd
            state.layout.limit = max(state.layout.limit, size)
        } else {
            recreated = try DiskTier.prepareBucketFile(context, hadManifest: hadManifest)
            state.layout.fd = try context.directory.openOrCreate(.buckets, context.name)
            do throws(MagpieError) {
                state.layout.limit = max(state.layout.limit, try FileIO.size(state.layout.fd, path: context.path))
            } catch {
                state.close()
                throw error
            }
        }
        state.life.snapshotCharge = context.directory.size(.buckets, state.snapshotName)
        return (state, recreated)
    }

    /// Loads the index (from the snapshot a clean close left, else by scanning the file) if it is not
    /// loaded yet and the bucket is open. Every operation on a bucket calls it first, with the lock held.
    /// A failure leaves the bucket unloaded (the next operation tries again) and throws.
    @inline(__always)
    mutating func loadIfNeeded() throws(MagpieError) {
        if !life.loaded && !life.closed { try load() }
    }

    /// Opens the file of a bucket the open did not open (it had SIZES: see DiskTier.swift, "Reopening"),
    /// which says the last close left a regular file at its name. If that is not one of ours now
    /// (removed or replaced since), it goes the careful way the open would have gone, and counts as
    /// recreated. Its size is checked against the limit after the load (below), as every bucket's is.
    private mutating func openRecordedFile() throws(MagpieError) {
        if let (fd, _) = try FileIO.openExistingRegular(context.directory.fd(.buckets), context.name, path: context.path) {
            layout.fd = fd
            return
        }
        let recreated = try DiskTier.prepareBucketFile(context, hadManifest: true)
        layout.fd = try context.directory.openOrCreate(.buckets, context.name)
        if recreated {
            context.health.noteBucketFileRecreated()
            context.logs.bucketRecreated.record(metadata: ["path": "\(context.path)"])
        }
    }

    private mutating func load() throws(MagpieError) {
        if let failure = context.health.failure { throw failure }
        if layout.fd < 0 { try openRecordedFile() }
        remap()
        let now = context.clock.now()
        do throws(MagpieError) {
            try recover(now: now)
        } catch {
            // As before the load: nothing indexed, nothing counted; the file as the failed step left it.
            index = BucketIndex()
            forgetRegions()
            layout.maximumSequence = 0
            layout.nextRegionSequence = 1
            counters = BucketCounters()
            context.logs.bucketLoadFailed.record(error: "\(error)", metadata: ["path": "\(context.path)"])
            throw error
        }
        if life.snapshotCharge > 0 && !life.keepsSnapshot {
            // A recovery that did not use the snapshot has deleted it: its bytes are free.
            context.ledger.pool.give(life.snapshotCharge)
            life.snapshotCharge = 0
        }
        if life.recordedFileSize > 0 {
            // Opened from SIZES: a file smaller than it said gives back what it no longer needs.
            returnSurplus(keeping: 0)
            life.recordedFileSize = 0
        }
        if layout.size > layout.limit {
            // Only if the file grew since the open (it cannot, unless someone else wrote it): charged to
            // the pool, which may then go below zero; buckets repay as they give back room.
            context.ledger.pool.give(layout.limit - layout.size)
            layout.limit = layout.size
        }
        // The mapping made above covers max(share, limit); only a limit raised since needs a new one.
        if let mapping = layout.mapping, layout.limit > mapping.length { remap() }
        life.loaded = true
        if counters.corruptRecords > 0 || counters.truncatedTails > 0 {
            context.logs.bucketRecovered.record(
                metadata: [
                    "path": "\(context.path)", "corrupt_records": "\(counters.corruptRecords)",
                    "truncated_tails": "\(counters.truncatedTails)",
                ])
        }
        healIfNeeded(now: now)  // the damaged regions leave the file
    }

    /// The header this bucket's file must have (with `regionSize`; its closed length aside).
    func expectedHeader(regionSize: Int, closedLength: Int = 0) -> BucketFileHeader {
        BucketFileHeader(
            bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed, regionSize: regionSize,
            closedLength: closedLength)
    }

    private mutating func recover(now: Int64) throws(MagpieError) {
        if index.capacity == 0 { index = BucketIndex() }
        let fileSize = try FileIO.size(layout.fd, path: context.path)
        life.closedLength = 0
        if fileSize >= BucketFileHeader.size, let header = try fileHeader(), fileSize >= header.closedLength,
            loadSnapshot(fileSize: fileSize, regionSize: header.regionSize)
        {
            // Kept until the loader thread or the file's next change deletes it (Bucket+Snapshot.swift).
            counters.openedFromSnapshot = true
            life.keepsSnapshot = true
            life.closedLength = header.closedLength
            return
        }
        // Unusable: never let it be read later (a failure fails the load, as the scan may change the file).
        try context.directory.unlink(.buckets, snapshotName)
        let bytes = try readBytes(fileSize, at: 0)
        let header = bytes.withUnsafeBytes { BucketFileHeader.decode($0) }
        // Shorter than at the last clean close: its end was cut off since (not by a crash: nothing is written
        // after the close sets the length). A tombstone may have gone with it, and any record before could
        // be one it removed: nothing in the file is trusted.
        let cut = header.map { $0.closedLength > bytes.count } ?? false
        guard let header, header.isSameFile(as: expectedHeader(regionSize: header.regionSize)), !cut else {
            // With huge pages, a file of zeros holds nothing: what a crash leaves between a new file's
            // extension and its header's write (Bucket+HugePages.swift). Without, it is damage, as any file
            // without a header.
            if context.hugePages ? bytes.contains(where: { $0 != 0 }) : !bytes.isEmpty { counters.corruptRecords += 1 }
            if cut { counters.truncatedTails += 1 }
            try context.sizesFile.retire()  // SIZES goes before the file changes
            try FileIO.truncate(layout.fd, to: 0, path: context.path)
            try FileIO.write(layout.fd, expectedHeader(regionSize: context.shared.regionSize).encoded(), at: 0, path: context.path)
            life.headerMissing = false
            layout.regionSize = context.shared.regionSize
            layout.slotCount = 0
            layout.freeSlots = []
            return
        }
        life.closedLength = header.closedLength
        layout.regionSize = header.regionSize
        // The last slot may be written in part only: it counts whole.
        layout.slotCount = (bytes.count - BucketFileHeader.size + layout.regionSize - 1) / layout.regionSize
        layout.freeSlots = [Bool](repeating: true, count: layout.slotCount)
        let ignored = bytes.withUnsafeBytes { file in findRegions(in: file) }
        var tornTail = false
        var groups: [[UInt8]: [UInt32]] = [:]  // group name -> offset8 of its values, in file order
        bytes.withUnsafeBytes { file in
            for position in layout.regions.indices {
                let region = layout.regions[position]
                let low = layout.start(of: region)
                let bytes = UnsafeRawBufferPointer(rebasing: file[low..<min(file.count, low + layout.capacity(of: region))])
                let scan = Self.forEachRecord(inRegion: bytes, firstSequence: region.firstRecordSequence, context: context) { event in
                    switch event {
                    case .record(let offset, let header):
                        let record = UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + header.recordLength)])
                        apply(header, record, at: low + offset, groups: &groups, file: file, now: now)
                        layout.maximumSequence = max(layout.maximumSequence, header.sequence)
                    case .brokenValue(let offset, let header):
                        // Its key's earlier value was replaced by it: gone too.
                        let key = UnsafeRawBufferPointer(rebasing: bytes[(offset + header.keyOffset)..<(offset + header.groupOffset)])
                        removeRecovered(keyHash: header.keyHash, key: key, below: .max, file: file)
                        layout.maximumSequence = max(layout.maximumSequence, header.sequence)
                        counters.corruptRecords += 1
                        damage.noteKnown(region.sequence)
                    case .unknownDamage:
                        counters.corruptRecords += 1
                        counters.droppedForDamage += UInt64(index.count)
                        _ = dropAll { _ in true }
                        groups = [:]
                        damage.noteHidden(region.sequence)
                    }
                }
                layout.regions[position].end = scan.end
                if position == layout.regions.count - 1 { tornTail = scan.torn }
            }
        }
        if tornTail, let newest = layout.regions.last {
            // What the torn write left is zeroed (up to the end of the region, or of the file), so that it is
            // counted once, not at every scan until the next write goes over it.
            counters.truncatedTails += 1
            let from = layout.start(of: newest) + newest.end
            let to = min(bytes.count, layout.start(of: newest) + layout.capacity(of: newest))
            if to > from {
                try context.sizesFile.retire()
                try FileIO.write(layout.fd, [UInt8](repeating: 0, count: to - from), at: from, path: context.path)
            }
        }
        if let newest = layout.regions.last {
            layout.maximumSequence = max(layout.maximumSequence, newest.firstRecordSequence &- 1)
            layout.nextRegionSequence = newest.sequence &+ 1
        }
        // What free slots still hold (Bucket+FreeSlots.swift): counted toward the sequence numbers, and
        // checked against what the regions recovered.
        let hidden = bytes.withUnsafeBytes { file in checkFreeSlots(file, groups: &groups, now: now) }
        // Leftover headers outside every region (overlapped by a newer one): zeroed, so that they stay
        // free slots' headers (a leftover inside a region's bytes is that region's data, and stays).
        let leftovers = ignored.filter { layout.freeSlots[$0] }
        if !leftovers.isEmpty {
            try context.sizesFile.retire()
            let zeros = [UInt8](repeating: 0, count: RegionHeader.size)
            for slot in leftovers { try FileIO.write(layout.fd, zeros, at: BucketFileHeader.size + slot * layout.regionSize, path: context.path) }
        }
        if !hidden.slots.isEmpty { try makeLast(hidden, now: now) }
    }

    /// Fills `regions` (oldest first) and `freeSlots` from the region headers in `file`; returns the slots
    /// of valid headers that were left out (overlapping a newer region).
    private mutating func findRegions(in file: UnsafeRawBufferPointer) -> [Int] {
        var found: [Region] = []
        for slot in 0..<layout.slotCount {
            let at = BucketFileHeader.size + slot * layout.regionSize
            guard at + RegionHeader.size <= file.count,
                let header = RegionHeader.decode(UnsafeRawBufferPointer(rebasing: file[at..<(at + RegionHeader.size)]), hasher: context.hasher),
                header.bucketIndex == context.number, header.slots <= layout.slotCount - slot
            else { continue }
            found.append(
                Region(slot: slot, slots: header.slots, sequence: header.sequence, firstRecordSequence: header.firstRecordSequence,
                    end: RegionHeader.size))
        }
        // Newest first: a region whose slots another (newer) one already holds is a leftover.
        found.sort { $0.sequence > $1.sequence }
        var ignored: [Int] = []
        var kept: [Region] = []
        for region in found {
            let slots = region.slot..<(region.slot + region.slots)
            if slots.allSatisfy({ layout.freeSlots[$0] }) && !kept.contains(where: { $0.sequence == region.sequence }) {
                for slot in slots { layout.freeSlots[slot] = false }
                kept.append(region)
            } else {
                ignored.append(region.slot)
            }
        }
        layout.regions = kept.reversed()
        return ignored
    }

    /// What a region's scan meets (see the top of this file): a record (its offset from the region's
    /// start, its header), a value whose payload does not verify, or unknown damage skipped.
    enum ScanEvent {
        case record(Int, RecordHeader)
        case brokenValue(Int, RecordHeader)
        case unknownDamage
    }

    /// Calls `body` with what the scan of `region`'s bytes meets, in order (see the top of this file).
    /// Returns where the records end and whether they end at what looks like a torn record of this region.
    /// (`stop`: no record starting at or past this offset is looked for; one starting before it is read
    /// whole, wherever it ends.)
    static func forEachRecord(
        inRegion region: UnsafeRawBufferPointer, firstSequence: UInt64, stop: Int = .max, context: BucketContext,
        _ body: (ScanEvent) -> Void
    ) -> (end: Int, torn: Bool) {
        var offset = RegionHeader.size
        var end = offset
        var previous: UInt64? = nil
        // A record here whose first bytes verify: inside the region, of this bucket, and in sequence; with
        // whether its payload verifies too.
        func record(at offset: Int) -> (RecordHeader, intact: Bool)? {
            guard offset + RecordHeader.size <= region.count,
                UInt32(littleEndian: region.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) == RecordHeader.magic,
                let header = RecordHeader.validatePrefix(UnsafeRawBufferPointer(rebasing: region[offset...])),
                header.sequence >= firstSequence, previous.map({ header.sequence > $0 }) ?? true,
                offset + header.recordLength <= region.count,
                belongsHere(header, UnsafeRawBufferPointer(rebasing: region[offset...]), context: context)
            else { return nil }
            let payload = UnsafeRawBufferPointer(
                rebasing: region[(offset + header.payloadOffset)..<(offset + header.payloadOffset + header.storedLength)])
            return (header, RecordHeader.payloadMatches(payload, header))
        }
        var torn = false
        while offset + RecordHeader.size <= region.count && offset < stop {
            if let (header, intact) = record(at: offset) {
                // A tombstone has no payload to break: its hash is in its verified first bytes.
                body(intact || header.kind != .value ? .record(offset, header) : .brokenValue(offset, header))
                previous = header.sequence
                offset += header.recordLength
                end = offset
                continue
            }
            // Something of this region's that failed: torn or damaged.
            let head = RecordHeader.decode(UnsafeRawBufferPointer(rebasing: region[offset...]))
            let looksOurs = head.map { header in header.sequence >= firstSequence && (previous.map { header.sequence > $0 } ?? true) } ?? false
            var next = offset + 8
            while next + RecordHeader.size <= region.count && next < stop && record(at: next) == nil { next += 8 }
            if next + RecordHeader.size > region.count || next >= stop {
                torn = looksOurs
                break  // nothing valid after: the region's records end here
            }
            body(.unknownDamage)
            offset = next
        }
        return (end, torn)
    }

    /// Whether the bucket file starts with this bucket's header; the header, nil if not.
    private func fileHeader() throws(MagpieError) -> BucketFileHeader? {
        let bytes = try readBytes(BucketFileHeader.size, at: 0)
        guard let header = bytes.withUnsafeBytes({ BucketFileHeader.decode($0) }), header.isSameFile(as: expectedHeader(regionSize: header.regionSize))
        else { return nil }
        return header
    }

    /// A valid record may still be foreign: its key must hash to its key hash, and that to this bucket.
    private static func belongsHere(_ header: RecordHeader, _ record: UnsafeRawBufferPointer, context: BucketContext) -> Bool {
        if header.kind == .groupTombstone { return header.keyHash == 0 }
        let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
        return context.hasher.hash(key) == header.keyHash
            && DiskTier.bucket(of: header.keyHash, count: context.bucketCount) == context.number
    }

    /// The sequence number of the record at `offset` in `file`.
    private static func sequence(at offset: Int, in file: UnsafeRawBufferPointer) -> UInt64 {
        UInt64(littleEndian: file.loadUnaligned(fromByteOffset: offset + 32, as: UInt64.self))
    }

    mutating func apply(
        _ header: RecordHeader, _ record: UnsafeRawBufferPointer, at offset: Int, groups: inout [[UInt8]: [UInt32]],
        file: UnsafeRawBufferPointer, now: Int64
    ) {
        switch header.kind {
        case .value:
            let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
            removeRecovered(keyHash: header.keyHash, key: key, below: .max, file: file)
            if header.expiry != 0 && header.expiry <= now {
                counters.expired += 1
                return
            }
            insert(DiskSlot(hash: header.keyHash, offset: offset, length: header.recordLength, expiryMilliseconds: header.expiry))
            if header.groupLength > 0 {
                groups[Array(record[header.groupOffset..<header.groupEnd]), default: []].append(UInt32(offset / 8))
            }
        case .tombstone:
            let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
            removeRecovered(keyHash: header.keyHash, key: key, below: header.covers, file: file)
        case .groupTombstone:
            let name = Array(record[header.groupOffset..<header.groupEnd])
            guard let members = groups[name] else { return }
            var kept: [UInt32] = []
            for offset8 in members {
                let memberOffset = Int(offset8) * 8
                guard Self.sequence(at: memberOffset, in: file) < header.covers else {
                    kept.append(offset8)  // written after what this tombstone removes
                    continue
                }
                // The member's own record gives its tag; the slot still points at it unless replaced.
                let tag = DiskSlot.tag(of: UInt64(littleEndian: file.loadUnaligned(fromByteOffset: memberOffset + 40, as: UInt64.self)))
                if let position = index.positions(tag: tag).first(where: { index[$0].offset8 == offset8 }) {
                    drop(at: position)
                }
            }
            groups[name] = kept.isEmpty ? nil : kept
        }
    }

    /// Removes the recovered slot of `key` if its record's sequence number is below `cover`, comparing
    /// keys against the file in memory.
    mutating func removeRecovered(keyHash: UInt64, key: UnsafeRawBufferPointer, below cover: UInt64, file: UnsafeRawBufferPointer) {
        for position in index.positions(tag: DiskSlot.tag(of: keyHash)) {
            let slotRecord = UnsafeRawBufferPointer(rebasing: file[index[position].offset...])
            guard let header = RecordHeader.decode(slotRecord), header.keyLength == key.count else { continue }
            if key.isEmpty || memcmp(slotRecord.baseAddress! + header.keyOffset, key.baseAddress!, key.count) == 0 {
                if header.sequence < cover { drop(at: position) }
                return
            }
        }
    }
}
