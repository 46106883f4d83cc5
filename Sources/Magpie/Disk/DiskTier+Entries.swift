// The record-level read and write paths of DiskTier, shared by its public byte API and by `Cache`,
// which also stores a memory policy and a disk-only flag with each value (see `Format/Record.swift`).

/// A value read from disk with what was stored beside it.
package struct DiskEntry: Sendable {
    var value: [UInt8]
    /// The disk deadline in ms since 1970, 0 for never.
    var expiry: Int64
    /// What was stored beside the value (``EntryMetadata``).
    var placement: EntryMetadata
    /// The group's name, nil when it has none.
    var group: String?
    /// As read from its record, before ``DiskTier/entry(_:)`` decompresses it: the value's length when
    /// `value` holds its zstd frame; nil when `value` is the value.
    var compressedLength: Int? = nil
}

// The tier's entry points for a key hashed once by its caller (`Cache`, or the public API below):
// the key's hash picks the bucket and is the index tag; nothing here hashes or converts it again.

extension DiskTier {
    /// The live record for `key`, decoded. Nil when absent, expired, or its record failed its checksum
    /// (counted and dropped).
    package func entry(_ key: HashedKey) throws(MagpieError) -> DiskEntry? {
        try checkKey(key)
        var failure: MagpieError? = nil
        let found = unownedBuckets[Self.bucket(of: key.hash, count: bucketCount)]._withUnsafeGuaranteedRef { bucket in
            bucket.withLock { (state: inout BucketState) -> DiskEntry? in
                do throws(MagpieError) {
                    try state.loadIfNeeded()
                    return try state.readValue(key)
                } catch {
                    failure = error
                    return nil
                }
            }
        }
        if let failure { throw failure }
        guard let originalLength = found?.compressedLength else { return found }
        var entry = found.unsafelyUnwrapped
        // The checksum matched, so a failure here means the writer stored a bad frame: still a miss.
        do {
            entry.value = try entry.value.withUnsafeBytes { raw in
                Result { () throws(MagpieError) -> [UInt8] in try compression.decompress(raw, originalLength: originalLength) }
            }.get()
            entry.compressedLength = nil
            return entry
        } catch {
            _ = try? withBucket(for: key.hash) { $0.counters.corruptRecords += 1 }
            logs.undecompressible.record(key: key.hash, error: "\(error)")
            return nil
        }
    }

    /// Stores `value` for `key` with `placement` beside it, replacing any previous value. The record is
    /// written once, where it lands, by the bucket (see `RecordDraft`).
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
        var compressed: [UInt8]? = nil
        // Noise-like values are not offered to zstd (see Compressibility.swift).
        if compresses && value.count >= configuration.minimumCompressibleLength && !Compressibility.looksIncompressible(value) {
            compressed = try compression.compress(value)
        }
        if compressed == nil && value.count > largestStorableRecord {
            throw MagpieError(.valueTooLarge, "value of \(value.count) bytes; this tier stores values up to \(largestStorableValue) bytes")
        }
        let stored = try withBytes((group ?? "").utf8) { group in
            Result { () throws(MagpieError) -> Int in
                guard group.count <= Self.maximumGroupLength else {
                    throw MagpieError(.keyTooLong, "group name of \(group.count) bytes; the limit is \(Self.maximumGroupLength)")
                }
                if let compressed {
                    return try compressed.withUnsafeBytes { payload in
                        Result { () throws(MagpieError) -> Int in
                            try store(payload, codec: .zstd, of: value, for: key, deadline: deadline, group: group, placement: placement, now: now)
                        }
                    }.get()
                }
                return try store(value, codec: .raw, of: value, for: key, deadline: deadline, group: group, placement: placement, now: now)
            }
        }.get()
        originalBytes.add(UInt64(value.count), ordering: .relaxed)
        storedBytes.add(UInt64(stored), ordering: .relaxed)
    }

    /// Appends the value record of `payload` (`value` encoded by `codec`) to the key's bucket. Returns
    /// the payload's length.
    private func store(
        _ payload: UnsafeRawBufferPointer, codec: Codec, of value: UnsafeRawBufferPointer, for key: HashedKey,
        deadline: Int64, group: UnsafeRawBufferPointer, placement: EntryMetadata, now: Int64
    ) throws(MagpieError) -> Int {
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
        try withRoom(Self.bucket(of: key.hash, count: bucketCount), now: now) { (state, policy) throws(MagpieError) in
            try state.store(draft, key: key, now: now, policy: policy)
        }
        return payload.count
    }

    /// Removes `key`, durably (a tombstone is appended). Returns whether it was present.
    package func remove(_ key: HashedKey) throws(MagpieError) -> Bool {
        try checkKey(key)
        try checkDirectoryIfDue()
        let header = RecordHeader(
            kind: .tombstone, codec: .raw, keyLength: key.count, groupLength: 0, storedLength: 0, originalLength: 0,
            expiry: 0, sequence: 0, keyHash: key.hash)
        let none = UnsafeRawBufferPointer(start: nil, count: 0)
        let tombstone = RecordDraft(header: header, key: key.bytes, group: none, payload: none)
        let now = configuration.clock.now()
        return try withRoom(Self.bucket(of: key.hash, count: bucketCount), now: now) { (state, policy) throws(MagpieError) in
            try state.remove(key, tombstone: tombstone, now: now, policy: policy)
        }
    }

    /// Removes `key` if the index holds it (durably, with a tombstone); writes nothing when it does not.
    /// For `Cache`'s memory-only stores, which must not leave an older disk value behind. Unindexed
    /// records of the key in the file are dead-marked or compacted away (see `makeRoom`), so recovery
    /// cannot bring one back.
    package func removeIfPresent(_ key: HashedKey) throws(MagpieError) -> Bool {
        try checkKey(key)
        let present = try buckets[Self.bucket(of: key.hash, count: bucketCount)].withLock {
            (state: inout BucketState) throws(MagpieError) -> Bool in
            try state.checkOpen()
            try state.loadIfNeeded()
            return state.index.positions(tag: DiskSlot.tag(of: key.hash)).isEmpty == false
        }
        return present ? try remove(key) : false
    }

    /// Whether `key` has a live, unexpired record. Not counted as a read; leaves the clock's credits alone.
    package func contains(_ key: HashedKey) throws(MagpieError) -> Bool {
        try checkKey(key)
        let now = configuration.clock.now()
        return try buckets[Self.bucket(of: key.hash, count: bucketCount)].withLock {
            (state: inout BucketState) throws(MagpieError) -> Bool in
            try state.checkOpen()
            try state.loadIfNeeded()
            defer { state.healIfNeeded() }
            guard let (_, found) = try state.find(tag: DiskSlot.tag(of: key.hash), key: key.bytes) else { return false }
            return (found.header.expiry == 0 || found.header.expiry > now) && !found.header.flags.contains(.negative)
        }
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
    /// the budget (at least 1/16 of it whatever the bucket count, up to 2 GiB). A value up to it is
    /// stored even into a full tier, by evicting; while the tier has room a store evicts nothing.
    public var largestStorableValue: Int {
        (largestStorableRecord & ~7) - RecordHeader.recordLength(key: 0, group: 0, stored: 0)
    }

    /// The longest value a store considers: a record's length fields are 32-bit (a longer value could
    /// never be described, however well it compresses).
    static let largestCompressibleValue = Int(UInt32.max)

    /// The longest record: what a bucket's limit can reach, less its file header.
    var largestStorableRecord: Int {
        let reachable = bucketBudget + (bucketCount - 1) * (bucketBudget - bucketBudget / 2)
        return min(ledger.maximumLimit, reachable) - BucketFileHeader.size
    }

    /// Runs `operation` on bucket `number` with room for what it appends: the bucket borrows from the
    /// pool; if that is short, the other buckets lend their free room (one at a time, holding no other
    /// bucket's lock) and the operation runs again; only when no bucket has room does the bucket evict its
    /// own entries (or, for a record larger than it could hold alone, the others evict to lend).
    func withRoom<R>(
        _ number: Int, now: Int64, _ operation: (inout BucketState, RoomPolicy) throws(MagpieError) -> RoomOutcome<R>
    ) throws(MagpieError) -> R {
        try withBorrowedRoom { (policy) throws(MagpieError) in
            try buckets[number].withLock { (state: inout BucketState) throws(MagpieError) in
                try state.loadIfNeeded()
                return try operation(&state, policy)
            }
        } gather: { (bytes, evicting) throws(MagpieError) in
            try gatherRoom(bytes, for: number, evicting: evicting, now: now)
        }
    }

    /// Asks the buckets other than `number`, one at a time, to lend up to `bytes` into the pool (see
    /// `BucketState.lend`). Returns what they lent.
    func gatherRoom(_ bytes: Int, for number: Int, evicting: Bool, now: Int64) throws(MagpieError) -> Int {
        var gathered = 0
        defer { ledger.pool.give(gathered) }
        var step = 1
        while step < bucketCount && gathered < bytes {
            let wanted = bytes - gathered
            gathered += try buckets[(number + step) & (bucketCount - 1)].withLock {
                (state: inout BucketState) throws(MagpieError) -> Int in
                // Its room is known once its index is; a bucket that cannot load lends nothing (its own
                // operations report the failure), rather than failing a store into another bucket.
                do { try state.loadIfNeeded() } catch { return 0 }
                return try state.lend(upTo: wanted, evicting: evicting, now: now)
            }
            step += 1
        }
        return gathered
    }
}
