import Glibc

// MARK: - Recovery: rebuilding a bucket's index from its file
//
// The file is read whole and scanned from the end of its header. A record counts only if it is valid
// (see Format/OnDiskFormat.swift) and lies wholly inside the file. Records apply in file order:
//  - a value replaces the key's previous record (an expired value only removes it);
//  - a tombstone removes the key;
//  - a group tombstone removes the group's values written before it.
// Dead records (superseded or removed, see Format/OnDiskFormat.swift) are stepped over.
// At an invalid record the scan resyncs: it tries every following 8-byte boundary for a valid record.
// If one is found, the bytes skipped count as one corrupt record; if none, the rest of the file is a
// torn tail (an append cut short by a crash) or trailing garbage, and is truncated. A file whose
// header is missing or belongs elsewhere (another bucket, count or seed) is reset to empty and counted.
// A file in which corrupt records were skipped is then rewritten without them (healed, by a compaction),
// so the damage is counted once, not at every open.

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
            state.fd = fd
            state.limit = max(state.limit, size)
        } else {
            recreated = try DiskTier.prepareBucketFile(context, hadManifest: hadManifest)
            state.fd = try context.directory.openOrCreate(.buckets, context.name)
            do throws(MagpieError) {
                state.limit = max(state.limit, try FileIO.size(state.fd, path: context.path))
            } catch {
                state.close()
                throw error
            }
        }
        state.snapshotCharge = context.directory.size(.buckets, state.snapshotName)
        return (state, recreated)
    }

    /// Loads the index (from the snapshot a clean close left, else by scanning the file) if it is not
    /// loaded yet and the bucket is open. Every operation on a bucket calls it first, with the lock held.
    /// A failure leaves the bucket unloaded (the next operation tries again) and throws.
    @inline(__always)
    mutating func loadIfNeeded() throws(MagpieError) {
        if !loaded && !closed { try load() }
    }

    /// Opens the file of a bucket the open did not open (it had SIZES: see DiskTier.swift, "Reopening"),
    /// which says the last close left a regular file at its name. If that is not one of ours now
    /// (removed or replaced since), it goes the careful way the open would have gone, and counts as
    /// recreated. Its size is checked against the limit after the load (below), as every bucket's is.
    private mutating func openRecordedFile() throws(MagpieError) {
        if let (fd, _) = try FileIO.openExistingRegular(context.directory.fd(.buckets), context.name, path: context.path) {
            self.fd = fd
            return
        }
        let recreated = try DiskTier.prepareBucketFile(context, hadManifest: true)
        fd = try context.directory.openOrCreate(.buckets, context.name)
        if recreated {
            context.health.noteBucketFileRecreated()
            context.logs.bucketRecreated.record(metadata: ["path": "\(context.path)"])
        }
    }

    private mutating func load() throws(MagpieError) {
        if let failure = context.health.failure { throw failure }
        if fd < 0 { try openRecordedFile() }
        remap()
        let now = context.clock.now()
        do throws(MagpieError) {
            try recover(now: now)
        } catch {
            // As before the load: nothing indexed, nothing counted; the file as the failed step left it.
            index = BucketIndex()
            liveBytes = 0
            written = BucketFileHeader.size
            maximumSequence = 0
            counters = BucketCounters()
            context.logs.bucketLoadFailed.record(error: "\(error)", metadata: ["path": "\(context.path)"])
            throw error
        }
        if snapshotCharge > 0 && !keepsSnapshot {
            // A recovery that did not use the snapshot has deleted it: its bytes are free.
            context.ledger.pool.give(snapshotCharge)
            snapshotCharge = 0
        }
        if recordedFileSize > 0 {
            // Opened from SIZES: a file smaller than it said gives back what it no longer needs.
            returnSurplus(keeping: 0)
            recordedFileSize = 0
        }
        if size > limit {
            // Only if the file grew since the open (it cannot, unless someone else wrote it): charged to
            // the pool, which may then go below zero; buckets repay as they compact.
            context.ledger.pool.give(limit - size)
            limit = size
            remap()
        }
        loaded = true
        if counters.corruptRecords > 0 || counters.truncatedTails > 0 {
            context.logs.bucketRecovered.record(
                metadata: [
                    "path": "\(context.path)", "corrupt_records": "\(counters.corruptRecords)",
                    "truncated_tails": "\(counters.truncatedTails)",
                ])
        }
    }

    private mutating func recover(now: Int64) throws(MagpieError) {
        if index.capacity == 0 { index = BucketIndex() }
        let fileSize = try FileIO.size(fd, path: context.path)
        if fileSize >= BucketFileHeader.size, try headerMatches(), loadSnapshot(fileSize: fileSize) {
            // Kept until the loader thread or the file's next change deletes it (Bucket+Snapshot.swift).
            counters.openedFromSnapshot = true
            keepsSnapshot = true
            return
        }
        // Unusable: never let it be read later (a failure fails the load, as the scan may change the file).
        try context.directory.unlink(.buckets, snapshotName)
        let bytes = try readBytes(fileSize, at: 0)
        let read = bytes.count
        let fd = self.fd
        let path = context.path
        let expected = BucketFileHeader(bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed)
        let header = bytes.withUnsafeBytes { BucketFileHeader.decode($0) }
        guard header == expected else {
            if read > 0 { counters.corruptRecords += 1 }
            try context.sizesFile.retire()  // SIZES goes before the file changes
            try FileIO.truncate(fd, to: 0, path: path)
            try FileIO.write(fd, expected.encoded(), at: 0, path: path)
            written = BucketFileHeader.size
            return
        }
        let end = bytes.withUnsafeBytes { scan($0, now: now) }
        written = end
        if end < fileSize {
            counters.truncatedTails += 1
            try context.sizesFile.retire()
            try FileIO.truncate(fd, to: end, path: path)
        }
        if counters.corruptRecords > 0 { heal() }  // the skipped bytes leave the file
    }

    /// Whether the file starts with this bucket's header.
    private func headerMatches() throws(MagpieError) -> Bool {
        let header = try readBytes(BucketFileHeader.size, at: 0)
        let expected = BucketFileHeader(bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed)
        return header.withUnsafeBytes { BucketFileHeader.decode($0) } == expected
    }

    /// Applies every valid record; returns the end of the last one.
    private mutating func scan(_ file: UnsafeRawBufferPointer, now: Int64) -> Int {
        var offset = BucketFileHeader.size
        var end = offset
        var groups: [[UInt8]: [UInt32]] = [:]  // group name -> offset8 of its values, in file order
        while offset + RecordHeader.size <= file.count {
            guard let header = validRecord(file, at: offset) else {
                var next = offset + 8
                while next + RecordHeader.size <= file.count && validRecord(file, at: next) == nil { next += 8 }
                if next + RecordHeader.size > file.count { break }  // nothing valid after: a tail
                counters.corruptRecords += 1
                offset = next
                continue
            }
            let record = UnsafeRawBufferPointer(rebasing: file[offset..<(offset + header.recordLength)])
            if header.isDead {
                // Superseded or removed: stepped over, never applied.
            } else if belongsHere(header, record) {
                apply(header, record, at: offset, groups: &groups, file: file, now: now)
            } else {
                counters.corruptRecords += 1
            }
            maximumSequence = max(maximumSequence, header.sequence)
            offset += header.recordLength
            end = offset
        }
        return end
    }

    private func validRecord(_ file: UnsafeRawBufferPointer, at offset: Int) -> RecordHeader? {
        guard let header = RecordHeader.validate(UnsafeRawBufferPointer(rebasing: file[offset...])),
            offset + header.recordLength <= file.count
        else { return nil }
        return header
    }

    /// A valid record may still be foreign: its key must hash to its key hash, and that to this bucket.
    private func belongsHere(_ header: RecordHeader, _ record: UnsafeRawBufferPointer) -> Bool {
        if header.kind == .groupTombstone { return header.keyHash == 0 }
        let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
        return context.hasher.hash(key) == header.keyHash
            && DiskTier.bucket(of: header.keyHash, count: context.bucketCount) == context.number
    }

    private mutating func apply(
        _ header: RecordHeader, _ record: UnsafeRawBufferPointer, at offset: Int, groups: inout [[UInt8]: [UInt32]],
        file: UnsafeRawBufferPointer, now: Int64
    ) {
        switch header.kind {
        case .value:
            let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
            removeRecovered(keyHash: header.keyHash, key: key, file: file)
            if header.expiry != 0 && header.expiry <= now {
                counters.expired += 1
                return
            }
            index.insert(DiskSlot(hash: header.keyHash, offset: offset, length: header.recordLength, expiryMilliseconds: header.expiry))
            liveBytes += header.recordLength
            if header.groupLength > 0 {
                groups[Array(record[header.groupOffset..<header.groupEnd]), default: []].append(UInt32(offset / 8))
            }
        case .tombstone:
            let key = UnsafeRawBufferPointer(rebasing: record[header.keyOffset..<header.groupOffset])
            removeRecovered(keyHash: header.keyHash, key: key, file: file)
        case .groupTombstone:
            let name = Array(record[header.groupOffset..<header.groupEnd])
            for offset8 in groups.removeValue(forKey: name) ?? [] {
                // The member's own record gives its tag; the slot still points at it unless replaced.
                let member = UnsafeRawBufferPointer(rebasing: file[(Int(offset8) * 8)...])
                guard let memberHeader = RecordHeader.decode(member) else { continue }
                let tag = DiskSlot.tag(of: memberHeader.keyHash)
                if let position = index.positions(tag: tag).first(where: { index[$0].offset8 == offset8 }) {
                    drop(at: position)
                }
            }
        }
    }

    /// Removes the recovered slot of `key`, comparing keys against the file in memory.
    private mutating func removeRecovered(keyHash: UInt64, key: UnsafeRawBufferPointer, file: UnsafeRawBufferPointer) {
        for position in index.positions(tag: DiskSlot.tag(of: keyHash)) {
            let slotRecord = UnsafeRawBufferPointer(rebasing: file[index[position].offset...])
            guard let header = RecordHeader.decode(slotRecord), header.keyLength == key.count else { continue }
            if key.isEmpty || memcmp(slotRecord.baseAddress! + header.keyOffset, key.baseAddress!, key.count) == 0 {
                drop(at: position)
                return
            }
        }
    }
}
