import Synchronization

// MARK: - Index snapshots: fast reopen after a clean close
//
// `close()` writes each bucket's index to `buckets/<name>.index` (format in Format/OnDiskFormat.swift).
// A load uses a snapshot only if it is intact, names this bucket, count and seed, and the bucket file
// still has the size it records. A snapshot used is then kept while it describes the file exactly: it
// is deleted (``BucketState/beforeFileChange()``) before anything changes the file — the first write of
// a record or region header, a growth, a reclaim, an emptying — and meanwhile by the loader thread once it has loaded the bucket
// (IndexLoader.swift), so that a get that loads a bucket pays no `unlink` and a crash can never bring
// back an index older than the file. A snapshot not used is deleted at the load. Even a snapshot that
// passes these checks is not trusted with data: every read still verifies the record's checksum, key
// and liveness.

/// The SIZES file a clean close left (see Format/OnDiskFormat.swift and DiskTier.swift, "Reopening"),
/// while the open that read it has not deleted it yet: it is deleted, once, before any bucket file first
/// changes, so that a crash finds SIZES only while every size in it is still true.
final class SizesFile: Sendable {
    /// Whether SIZES is still there; read without the lock on every change to a bucket file.
    private let present: Atomic<Bool>
    /// The same, changed only with the lock held (so that one thread deletes it, once). A pthread lock:
    /// Thread Sanitizer sees it (it cannot see `Mutex`'s), and stores and the sealer thread retire SIZES
    /// concurrently.
    private let removal: Locked<Bool>
    private let directory: CacheDirectory
    private let ledger: DiskLedger
    /// Its bytes, charged to the tier's budget while it is there.
    let charge: Int

    init(present: Bool, charge: Int, directory: CacheDirectory, ledger: DiskLedger) {
        self.present = Atomic(present)
        self.removal = Locked(present)
        self.charge = present ? charge : 0
        self.directory = directory
        self.ledger = ledger
    }

    /// The bytes it holds in the directory now.
    var heldBytes: Int { present.load(ordering: .acquiring) ? charge : 0 }

    /// Deletes SIZES if it is still there (one atomic load otherwise) and frees its charge. A failure
    /// throws, and SIZES stays.
    @inline(__always)
    func retire() throws(MagpieError) {
        guard present.load(ordering: .acquiring) else { return }
        try removal.withLock { (isPresent: inout Bool) throws(MagpieError) in
            guard isPresent else { return }
            try directory.unlink(.buckets, BucketSizes.fileName)
            isPresent = false
            present.store(false, ordering: .releasing)
            ledger.pool.give(charge)
        }
    }
}

extension BucketState {
    var snapshotName: String { context.name + ".index" }

    /// The bytes of this bucket's snapshot now.
    var snapshotLength: Int { IndexSnapshot.length(slotCount: index.slots.count, regionCount: layout.regions.count) }

    /// What a bucket not loaded holds in the directory: its file's size and its snapshot's (0: none) —
    /// as SIZES recorded them if the open did not open the file, else measured.
    var unloadedSizes: (file: Int, snapshot: Int) {
        guard layout.fd >= 0 else { return (life.recordedFileSize, life.snapshotCharge) }
        return ((try? FileIO.size(layout.fd, path: context.path)) ?? 0, context.directory.size(.buckets, snapshotName))
    }

    /// The bytes the bucket holds in the directory now: its file and the snapshot it still has.
    var heldBytes: Int {
        guard life.loaded else {
            let (file, snapshot) = unloadedSizes
            return file + snapshot
        }
        return layout.size + (life.keepsSnapshot ? life.snapshotCharge : 0)
    }

    /// Writes the index snapshot (after every memtable was written and the file flushed, on close) and
    /// returns the bytes of the snapshot the bucket then has in the directory (the one written; if that
    /// failed, what is there). Best effort: a failure only means the next open scans the file.
    func writeSnapshot() -> Int {
        // Only an index of records all in the file; and none while a failed write may have left records
        // that no slot points at (`unindexedRegion`, Bucket+Regions.swift): the snapshot cannot say so,
        // and a bucket loaded from it would write no tombstone for a key it does not hold. The next open
        // scans instead, and the scan sees those records with every tombstone written since.
        guard tally.pendingCount == 0, damage.unindexedRegion == nil else { return life.keepsSnapshot ? life.snapshotCharge : 0 }
        let snapshot = IndexSnapshot(
            bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed,
            fileSize: (try? FileIO.size(layout.fd, path: context.path)) ?? layout.size,
            liveBytes: tally.liveBytes, maximumSequence: layout.maximumSequence, regionSize: layout.regionSize, slotCount: layout.slotCount,
            nextRegionSequence: layout.nextRegionSequence, regions: layout.regions, slots: index.slots, liveCount: index.count)
        let bytes = snapshot.encoded()
        do {
            try context.directory.writeAtomically(.buckets, snapshotName, bytes)
            return bytes.count
        } catch {
            return context.directory.size(.buckets, snapshotName)
        }
    }

    /// Deletes what describes the file as it is, before anything changes it: SIZES, if the tier still
    /// has it, and the snapshot the bucket was loaded from. A failure throws, and the change does not
    /// happen.
    @inline(__always)
    mutating func beforeFileChange() throws(MagpieError) {
        settleDeferredWrite()  // nothing is written behind a deferred write before it is complete (Bucket+RecordWrite.swift)
        try context.sizesFile.retire()
        try retireSnapshot()
        if life.closedLength > 0 { try forgetClosedLength() }
        if life.headerMissing { try writeMissingHeader() }
    }

    /// Sets the file header's closed length back to 0: the file may change (and shrink) from now on.
    mutating func forgetClosedLength() throws(MagpieError) {
        try FileIO.write(layout.fd, expectedHeader(regionSize: layout.regionSize).encoded(), at: 0, path: context.path)
        life.closedLength = 0
    }

    /// At a clean close, after the flush: the file header records the file's length, which the next
    /// load checks (a file found shorter lost its end). Best effort: a failure only leaves it 0.
    mutating func recordClosedLength() {
        settleDeferredWrite()
        guard let length = try? FileIO.size(layout.fd, path: context.path), length != life.closedLength, length >= BucketFileHeader.size else { return }
        let header = expectedHeader(regionSize: layout.regionSize, closedLength: length)
        if (try? FileIO.write(layout.fd, header.encoded(), at: 0, path: context.path)) != nil {
            life.closedLength = length
            life.headerMissing = false
        }
    }

    /// Deletes the snapshot the bucket was loaded from, if it is still in the directory, and frees its
    /// charge.
    mutating func retireSnapshot() throws(MagpieError) {
        guard life.keepsSnapshot else { return }
        try context.directory.unlink(.buckets, snapshotName)
        life.keepsSnapshot = false
        if life.snapshotCharge > 0 {
            context.ledger.pool.give(life.snapshotCharge)
            life.snapshotCharge = 0
        }
    }

    /// Whether the file still is as `snapshot` describes it. The file's size alone does not tell (records
    /// go into slots it already has), so every slot's first bytes are read: each region's header must be
    /// there with its sequence number, no other slot may hold a valid region header, and no record of a
    /// newer sequence number may follow the newest region's records. Every change to a file is one of
    /// these: an append (to the newest region, or to a region opened in a free slot), a reclaim or an
    /// evacuation (a region's header overwritten or zeroed), an emptying (a new file). A few hundred bytes
    /// read per bucket, with `pread` (a fresh mapping would fault each page in).
    private func matchesFile(_ snapshot: IndexSnapshot) -> Bool {
        // Plain arrays, no hashed collections: a bucket's first load is a reopen's first get, and the
        // first Dictionary of a new element type costs the process a few hundred microseconds of runtime
        // type instantiation (measured: 0.30 ms of a 0.55 ms first get).
        let regionSize = snapshot.regionSize
        // Slots from the end of the file on hold nothing (and are never read: through the mapping, a read
        // past the end of a mapped file is a SIGBUS); a region cannot start there.
        let written = min(snapshot.slotCount, (snapshot.fileSize - BucketFileHeader.size + regionSize - 1) / regionSize)
        let byFirstSlot = snapshot.regions.sorted { $0.slot < $1.slot }
        guard byFirstSlot.last.map({ $0.slot < written }) ?? true else { return false }
        var next = 0  // the first region (by slot) not yet passed
        var slot = 0
        while slot < written {
            let at = BucketFileHeader.size + slot * regionSize
            var header: RegionHeader? = nil
            if at + RegionHeader.size <= snapshot.fileSize {
                guard let head = try? readBytes(RegionHeader.size, at: at), head.count == RegionHeader.size else { return false }
                header = head.withUnsafeBytes { RegionHeader.decode($0, hasher: context.hasher) }
            }
            if next < byFirstSlot.count && byFirstSlot[next].slot == slot {
                let region = byFirstSlot[next]
                guard let header, header.sequence == region.sequence, header.slots == region.slots,
                    header.firstRecordSequence == region.firstRecordSequence
                else { return false }
                next += 1
                slot += region.slots  // its other slots are its data
            } else {
                if header != nil { return false }
                slot += 1
            }
        }
        guard let newest = snapshot.regions.last, newest.end + RecordHeader.size <= newest.slots * snapshot.regionSize else { return true }
        let at = BucketFileHeader.size + newest.slot * snapshot.regionSize + newest.end
        guard at + RecordHeader.size <= snapshot.fileSize else { return true }  // nothing can follow: the file ends
        guard let next = try? readBytes(RecordHeader.size, at: at) else { return false }
        let appended = next.withUnsafeBytes { RecordHeader.decode($0) }.map { $0.sequence > snapshot.maximumSequence } ?? false
        return !appended
    }

    /// Loads the snapshot if it fits the bucket file of `fileSize` bytes and `regionSize`. True if loaded
    /// (the caller then keeps it, see above); false leaves it for the caller to delete.
    mutating func loadSnapshot(fileSize: Int, regionSize: Int) -> Bool {
        guard let bytes = (try? context.directory.readFile(.buckets, snapshotName)) ?? nil else { return false }
        guard let snapshot = IndexSnapshot.decode(bytes), snapshot.bucketIndex == context.number,
            snapshot.bucketCount == context.bucketCount, snapshot.seed == context.hasher.seed, snapshot.fileSize == fileSize,
            snapshot.regionSize == regionSize, matchesFile(snapshot)
        else { return false }
        index = BucketIndex(slots: snapshot.slots, count: snapshot.liveCount)
        // It stays (see above): charged at its real length, whatever SIZES said of it.
        context.ledger.pool.give(life.snapshotCharge - bytes.count)
        life.snapshotCharge = bytes.count
        tally = IndexTally(liveBytes: snapshot.liveBytes)
        layout.maximumSequence = snapshot.maximumSequence
        layout.regionSize = regionSize
        layout.slotCount = snapshot.slotCount
        layout.regions = snapshot.regions
        layout.freeSlots = [Bool](repeating: true, count: layout.slotCount)
        for region in layout.regions {
            for slot in region.slot..<(region.slot + region.slots) { layout.freeSlots[slot] = false }
        }
        layout.nextRegionSequence = snapshot.nextRegionSequence
        return true
    }
}
