// The record-level read and write paths of DiskTier, shared by its public byte API and by `Cache`,
// which also stores a memory policy and a disk-only flag with each value (see `Format/Record.swift`).

/// What a read that must not wait found: its result, or that it would have had to wait.
package enum ImmediateRead<Value> {
    case done(Value)
    case wouldBlock
}

/// A value read from disk with what was stored beside it.
///
/// Every disk hit builds one and copies it a few times on its way out (the bucket's read, the tier, the
/// composer), so it is kept small: 93 bytes, the copy's version included (``EntryMetadata``'s field order;
/// the compressed frame described in 12 bytes rather than an optional length and an optional range).
package struct DiskEntry: Sendable {
    var value: [UInt8]
    /// The disk deadline in ms since 1970, 0 for never.
    var expiry: Int64
    /// What was stored beside the value (``EntryMetadata``).
    var placement: EntryMetadata
    /// The group's name, nil when it has none.
    var group: String?
    /// As read from its record, before ``DiskTier/entry(_:)`` decompresses it: the zstd frame `value` holds
    /// (or the read scratch does); nil when `value` is the value.
    var compressed: CompressedFrame? = nil
}

/// A verified zstd frame a disk read found, to be decompressed by ``DiskTier/entry(_:)``: the length of
/// the value it holds, and where it lies.
struct CompressedFrame {
    /// The value's length (a record holds at most 4 GiB, Format/Record.swift).
    var originalLength: UInt32
    /// Where in the reading thread's ``ReadScratch`` the frame lies, when `scratchEnd > 0` (the entry's
    /// `value` is then empty); else the frame is the entry's `value`. Valid only on that thread, until its
    /// next disk read: ``DiskTier/entry(_:)`` decompresses it right after the read, with no other read
    /// (and no suspension) in between.
    var scratchStart: UInt32 = 0
    var scratchEnd: UInt32 = 0

    init(originalLength: Int) {
        self.originalLength = UInt32(truncatingIfNeeded: originalLength)
    }

    /// The frame's range in the read scratch, if it lies there.
    var inReadScratch: Range<Int>? {
        scratchEnd > 0 ? Int(scratchStart)..<Int(scratchEnd) : nil
    }
}

// The tier's entry points for a key hashed once by its caller (`Cache`, or the public API below):
// the key's hash picks the bucket and is the index tag; nothing here hashes or converts it again.

extension DiskTier {
    /// The live record for `key`, decoded. Nil when absent, expired, or its record failed its checksum
    /// (counted and dropped).
    package func entry(_ key: HashedKey) throws(MagpieError) -> DiskEntry? {
        try checkKey(key)
        var failure: MagpieError? = nil
        let number = Self.bucket(of: key.hash, count: bucketCount)
        readHints.prefetch(bucket: number, tag: DiskSlot.tag(of: key.hash))  // see Disk/BucketReadHints.swift
        let found = unownedBuckets[number]._withUnsafeGuaranteedRef { bucket in
            bucket.withLock { (state: inout BucketState) -> DiskEntry? in
                do throws(MagpieError) {
                    try state.loadIfNeeded()
                    defer { readHints.noteIndex(bucket: number, state.index) }
                    return try state.readValue(key)
                } catch {
                    failure = error
                    return nil
                }
            }
        }
        if let failure { throw failure }
        // (Written out in both readers: passing the optional entry to a shared function copied it in and
        // out, value witnesses and reference counts, about 120 instructions per read.)
        guard let frame = found?.compressed else { return found }
        var entry = found.unsafelyUnwrapped
        return decompressFrame(&entry, frame, key) ? entry : nil
    }

    /// ``entry(_:)`` for a caller that must not wait: for the disk, or for another thread's work on the
    /// bucket (which may be waiting for the disk). `.wouldBlock`, with nothing changed, when the bucket's
    /// lock is held, its index not loaded yet, the file not mapped, a candidate record not all in the page
    /// cache, or a candidate damaged (healing writes); the caller then reads with ``entry(_:)`` on a
    /// thread that may wait. Decompressing is CPU work and done here (only a frame that fails to
    /// decompress, which a writer's bug alone can leave, is counted under the bucket's lock, waiting for it).
    package func entryIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<DiskEntry?> {
        try checkKey(key)
        var failure: MagpieError? = nil
        var blocked = false
        var found: DiskEntry? = nil
        let number = Self.bucket(of: key.hash, count: bucketCount)
        readHints.prefetch(bucket: number, tag: DiskSlot.tag(of: key.hash))
        let locked = unownedBuckets[number]._withUnsafeGuaranteedRef { bucket -> Bool in
            bucket.withLockIfAvailable { (state: inout BucketState) -> Bool in
                guard state.life.loaded else {
                    blocked = true  // loading reads the file
                    return true
                }
                do throws(MagpieError) {
                    defer { readHints.noteIndex(bucket: number, state.index) }
                    found = try state.readValueIfImmediate(key, blocked: &blocked)
                } catch {
                    failure = error
                }
                return true
            } ?? false
        }
        if let failure { throw failure }
        if !locked || blocked { return .wouldBlock }
        guard let frame = found?.compressed else { return .done(found) }
        var entry = found.unsafelyUnwrapped
        return .done(decompressFrame(&entry, frame, key) ? entry : nil)
    }

    /// Decompresses the zstd frame a read left in `entry` (in this thread's read scratch, or in
    /// `entry.value`) into `entry.value`. False when it does not decompress (counted and logged: its
    /// checksum matched, so the writer stored a bad frame; the read is then a miss).
    private func decompressFrame(_ entry: inout DiskEntry, _ frame: CompressedFrame, _ key: HashedKey) -> Bool {
        let originalLength = Int(frame.originalLength)
        do {
            if let range = frame.inReadScratch {
                // The read just verified the frame in this thread's scratch (allocated by that read), and this
                // thread has not read since.
                guard let scratch = ReadScratch.bytes(range.upperBound) else { return false }
                entry.value = try compression.decompress(UnsafeRawBufferPointer(rebasing: scratch[range]), originalLength: originalLength)
            } else {
                entry.value = try entry.value.withUnsafeBytes { raw in
                    Result { () throws(MagpieError) -> [UInt8] in try compression.decompress(raw, originalLength: originalLength) }
                }.get()
            }
            entry.compressed = nil
            return true
        } catch {
            _ = try? withBucket(for: key.hash) { $0.counters.corruptRecords += 1 }
            logs.undecompressible.record(key: key.hash, error: "\(error)")
            return false
        }
    }

    /// Stores `value` for `key` with `placement` beside it, replacing any previous value: into its bucket's
    /// memtable (see **Writes** above). The record is written once, unsealed, where it goes.
    package func store(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata
    ) throws(MagpieError) {
        try checkKey(key)
        try checkDirectoryIfDue()
        // A value is measured as stored (compressed, when it compresses): a longer one than a record
        // holds is refused below only if zstd is not offered it or does not shrink it. Past 4 GiB no
        // record could describe it at all.
        guard value.count <= Self.largestCompressibleValue else {
            throw MagpieError(.valueTooLarge, "value of \(value.count) bytes; this tier stores values up to \(largestStorableValue) bytes")
        }
        let now = configuration.clock.now()
        let deadline = expiry.deadline(now: now)
        if deadline != 0 && deadline <= now {
            _ = try remove(key)  // expired on arrival: the key must not keep an older value
            return
        }
        // Only a value too long to store raw is compressed here, to be measured as stored; every other one
        // is compressed, off this thread, when its memtable is written.
        var compressed: [UInt8]? = nil
        if value.count > largestStorableRecord - RecordHeader.size - key.count {
            if compresses && value.count >= configuration.minimumCompressibleLength && !Compressibility.looksIncompressible(value) {
                compressed = try compression.compress(value)
            }
            if compressed == nil {
                throw MagpieError(.valueTooLarge, "value of \(value.count) bytes; this tier stores values up to \(largestStorableValue) bytes")
            }
        }
        try withBytes((group ?? "").utf8) { group in
            Result { () throws(MagpieError) in
                guard group.count <= Self.maximumGroupLength else {
                    throw MagpieError(.keyTooLong, "group name of \(group.count) bytes; the limit is \(Self.maximumGroupLength)")
                }
                if let compressed {
                    try compressed.withUnsafeBytes { payload in
                        Result { () throws(MagpieError) in
                            try store(payload, codec: .zstd, of: value, for: key, deadline: deadline, group: group, placement: placement, now: now)
                        }
                    }.get()
                } else {
                    try store(value, codec: .raw, of: value, for: key, deadline: deadline, group: group, placement: placement, now: now)
                }
            }
        }.get()
    }

    /// ``store(_:for:expiry:group:placement:)`` for a caller that must not wait (an async caller's task): the
    /// record goes into its bucket's memtable here, with every guarantee of a store that waited, when that
    /// needs neither the file nor a wait (``BucketState/storeIfImmediate(_:key:)``: the bucket's lock free
    /// within a short spin, no record of the key in the file, room in the memtables at once); a full memtable
    /// it detached goes to the sealer. `.wouldBlock`, with nothing changed, otherwise, and for each store the
    /// waiting path treats apart: a value to compress before it can be measured, or longer than a memtable;
    /// an expiry already past (a removal); no write buffer or no background sealing (written before it
    /// returns); the directory's check due; a failure to report, a group name too long.
    package func storeIfImmediate(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata
    ) throws(MagpieError) -> ImmediateRead<Void> {
        try checkKey(key)
        guard shared.writeBuffer > 0, bucketSet.sealsInBackground, health.failure == nil, !directoryCheckIsDue,
            value.count <= shared.writeBuffer
        else { return .wouldBlock }
        let now = configuration.clock.now()
        let deadline = expiry.deadline(now: now)
        guard deadline == 0 || deadline > now else { return .wouldBlock }
        let number = Self.bucket(of: key.hash, count: bucketCount)
        let outcome = withBytes((group ?? "").utf8) { group -> DiskStoreOutcome? in
            guard group.count <= Self.maximumGroupLength else { return nil }
            let header = RecordHeader(
                kind: .value, codec: .raw, keyLength: key.count, groupLength: group.count, storedLength: value.count,
                originalLength: value.count, expiry: deadline, sequence: 0, keyHash: key.hash, flags: placement.flags.intersection(.all))
            guard header.recordLength <= largestStorableRecord else { return nil }
            let draft = RecordDraft(header: header, key: key.bytes, group: group, payload: value, metadata: placement)
            var outcome: DiskStoreOutcome? = nil
            _ = unownedBuckets[number]._withUnsafeGuaranteedRef { bucket in
                bucket.withLockIfAvailable { (state: inout BucketState) in outcome = state.storeIfImmediate(draft, key: key) }
            }
            return outcome
        }
        guard let outcome else { return .wouldBlock }
        // Background sealing (checked above): the hand-over queues the bucket for the sealer.
        if outcome == .storedAndDetached { try bucketSet.handOver(number) }
        return .done(())
    }

    /// Puts the record of `payload` (`value` encoded by `codec`) into the key's bucket's memtable; hands a
    /// memtable the store detached to the sealer (or, with no write buffer, writes it before returning).
    private func store(
        _ payload: UnsafeRawBufferPointer, codec: Codec, of value: UnsafeRawBufferPointer, for key: HashedKey,
        deadline: Int64, group: UnsafeRawBufferPointer, placement: EntryMetadata, now: Int64
    ) throws(MagpieError) {
        // A memory-only entry never reaches this tier; its flag would make the record unreadable.
        let flags = placement.flags.intersection(.all)
        let header = RecordHeader(
            kind: .value, codec: codec, keyLength: key.count, groupLength: group.count, storedLength: payload.count,
            originalLength: value.count, expiry: deadline, sequence: 0, keyHash: key.hash, flags: flags)
        guard header.recordLength <= largestStorableRecord else {
            let compressed = codec == .zstd ? " (\(payload.count) compressed)" : ""
            throw MagpieError(
                .valueTooLarge,
                "value of \(value.count) bytes\(compressed) with a \(key.count)-byte key and a \(group.count)-byte group; this tier stores values up to \(largestStorableValue) bytes, measured as stored")
        }
        let draft = RecordDraft(header: header, key: key.bytes, group: group, payload: payload, metadata: placement)
        let number = Self.bucket(of: key.hash, count: bucketCount)
        while true {
            let before = sealer.completed
            let outcome = try withRoom(number, now: now) { (state, policy) throws(MagpieError) -> RoomOutcome<DiskStoreOutcome> in
                try state.store(draft, key: key, now: now, policy: policy)
            }
            switch outcome {
            case .stored:
                return
            case .storedAndDetached:
                try bucketSet.handOver(number)
                return
            case .busy:
                bucketSet.sealOrWait(number, before: before)
            }
        }
    }

    /// Removes `key`, durably when its record is in the file (a tombstone is written). Returns whether it
    /// was present.
    package func remove(_ key: HashedKey) throws(MagpieError) -> Bool {
        try checkKey(key)
        try checkDirectoryIfDue()
        let now = configuration.clock.now()
        return try withRoom(Self.bucket(of: key.hash, count: bucketCount), now: now) { (state, policy) throws(MagpieError) in
            try state.remove(key, now: now, policy: policy)
        }
    }

    /// Removes `key` if the index holds it (durably, with a tombstone when its record is in the file);
    /// writes nothing when it does not. For `Cache`'s memory-only stores, which must not leave an older
    /// disk value behind. (The same as ``remove(_:)``: no valid record of a key the index does not hold is
    /// left in a file, see `Disk/Bucket+Regions.swift`.)
    package func removeIfPresent(_ key: HashedKey) throws(MagpieError) -> Bool {
        try remove(key)
    }

    /// Whether `key` has a live, unexpired record. Not counted as a read; leaves the clock's credits alone.
    package func contains(_ key: HashedKey) throws(MagpieError) -> Bool {
        try checkKey(key)
        let now = configuration.clock.now()
        return try buckets[Self.bucket(of: key.hash, count: bucketCount)].withLock {
            (state: inout BucketState) throws(MagpieError) -> Bool in
            try state.checkOpen()
            try state.loadIfNeeded()
            defer { state.healIfNeeded(now: now) }
            guard let (_, header) = try state.find(tag: DiskSlot.tag(of: key.hash), key: key.bytes) else { return false }
            return (header.expiry == 0 || header.expiry > now) && !header.flags.contains(.negative)
        }
    }

    /// ``contains(_:)`` for a caller that must not wait, as ``entryIfImmediate(_:)`` is: `.wouldBlock`,
    /// with nothing changed, when the bucket's lock is held, its index not loaded, or a candidate record
    /// not all in the page cache or damaged (``BucketState/containsIfImmediate(_:now:)``).
    package func containsIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<Bool> {
        try checkKey(key)
        let now = configuration.clock.now()
        var failure: MagpieError? = nil
        var found: Bool? = nil
        unownedBuckets[Self.bucket(of: key.hash, count: bucketCount)]._withUnsafeGuaranteedRef { bucket in
            _ = bucket.withLockIfAvailable { (state: inout BucketState) in
                guard state.life.loaded else { return }  // loading reads the file
                do throws(MagpieError) {
                    found = try state.containsIfImmediate(key, now: now)
                } catch {
                    failure = error
                }
            }
        }
        if let failure { throw failure }
        return found.map { .done($0) } ?? .wouldBlock
    }

    func checkKey(_ key: HashedKey) throws(MagpieError) {
        guard key.count <= Self.maximumKeyLength else {
            throw MagpieError(.keyTooLong, "key of \(key.count) bytes; the limit is \(Self.maximumKeyLength)")
        }
    }
}

extension DiskTier {
    /// The longest value this tier stores (with an empty key, no group and no memory policy; a key, a
    /// group or a `Cache`'s memory policy take their bytes from it, and a compressible value is
    /// measured compressed): one bucket's share plus half a share from every other bucket, about half
    /// the budget (at least 1/16 of it whatever the bucket count, up to 2 GiB), less a region's header.
    /// A value up to it is stored even into a full tier, by evicting; while the tier has room a store
    /// evicts nothing.
    public var largestStorableValue: Int {
        (largestStorableRecord & ~7) - RecordHeader.recordLength(key: 0, group: 0, stored: 0)
    }

    /// The longest value a store considers: a record's length fields are 32-bit (a longer value could
    /// never be described, however well it compresses).
    static let largestCompressibleValue = Int(UInt32.max)

    /// The longest record: what a region as large as a bucket's limit can reach holds, less the region's
    /// header (and a bucket file's slots are of the size a new file gets: an older file's differ a little).
    var largestStorableRecord: Int {
        let reachable = min(ledger.maximumLimit, bucketBudget + (bucketCount - 1) * (bucketBudget - bucketBudget / 2))
        let slots = (reachable - BucketFileHeader.size) / shared.regionSize
        return min(DiskSlot.maximumLength, slots * shared.regionSize - RegionHeader.size)
    }

    /// Runs `operation` on bucket `number` with room for what it appends (``BucketSet/withRoom(_:now:_:)``).
    @inline(__always)
    func withRoom<R>(
        _ number: Int, now: Int64, _ operation: (inout BucketState, RoomPolicy) throws(MagpieError) -> RoomOutcome<R>
    ) throws(MagpieError) -> R {
        try bucketSet.withRoom(number, now: now, operation)
    }
}
