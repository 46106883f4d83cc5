import Foundation

// The reads of a `Cache`: memory, then disk with the key's stripe held, promoting a disk hit.

// Every keyed call reduces its key to bytes (in place when it can) and hashes them once; the
// `HashedKey` then picks the memory shard, the lock stripe and the disk bucket.

extension Cache {
    /// The value stored for `key`, or nil: absent, expired, evicted, or dropped as corrupt.
    ///
    /// Cost: a memory hit is one hash, one shard lock and a copy of the value. A miss reads disk
    /// (one `pread`, plus zstd decompression for compressed values) and promotes the value.
    /// - Throws: ``MagpieError/Code/keyTooLong``, disk I/O errors, ``MagpieError/Code/closed``.
    @inlinable
    public func value(forKey key: String) throws(MagpieError) -> [UInt8]? {
        try value(forKey: key.utf8)
    }

    /// `value(forKey:)` for a key of arbitrary bytes.
    @inlinable
    public func value(forKey key: some Sequence<UInt8>) throws(MagpieError) -> [UInt8]? {
        try readValue(key)
    }

    /// The value stored for `key`, the tier that answered and whether the value is fresh or stale (see
    /// ``EntryOptions/freshFor``); nil on a miss. For callers that count or time memory and disk hits
    /// apart (the `tiered` benchmark does), or serve stale values their own way.
    public func lookup(_ key: String) throws(MagpieError) -> CacheHit? {
        try lookup(key.utf8)
    }

    /// ``lookup(_:)-(String)`` for a key of arbitrary bytes.
    public func lookup(_ key: some Sequence<UInt8>) throws(MagpieError) -> CacheHit? {
        try readHit(key)
    }

    /// The value stored for `key` as `Data` (one copy, from the tier's storage into the `Data`).
    /// - Throws: as ``value(forKey:)-(String)``.
    public func data(forKey key: String) throws(MagpieError) -> Data? {
        try withHashedKey(key) { key throws(MagpieError) in try readData(key) }
    }

    /// ``data(forKey:)-(String)`` for a key of arbitrary bytes.
    public func data(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Data? {
        try withHashedKey(key) { key throws(MagpieError) in try readData(key) }
    }

    /// Whether `key` has a live value in either tier. Not counted as a read; does not promote.
    /// - Throws: ``MagpieError/Code/keyTooLong``, disk I/O errors, ``MagpieError/Code/closed``.
    public func contains(_ key: String) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try readContains(key) }
    }

    /// ``contains(_:)-(String)`` for a key of arbitrary bytes.
    public func contains(_ key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try readContains(key) }
    }

    /// The disk half of a read: look up, and promote a hit, with the key's stripe held. (Written without
    /// closures: the stripe and the logging each cost a retain and a release of the cache per read.)
    @usableFromInline
    func valueAfterMemoryMiss(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        guard let entry = try diskEntryAfterMemoryMiss(key, promotingNegative: false), !entry.placement.freshness.negative
        else { return nil }
        return entry.value
    }

    /// ``valueAfterMemoryMiss(_:)`` tried on an async caller's task: `.wouldBlock`, with nothing read or
    /// changed, when the key's stripe is held or the disk read would wait (``DiskTier/entryIfImmediate(_:)``);
    /// the caller then hops to an I/O thread.
    func valueAfterMemoryMissIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<[UInt8]?> {
        guard case .done(let found) = try diskEntryAfterMemoryMissIfImmediate(key, promotingNegative: false) else { return .wouldBlock }
        guard let entry = found, !entry.placement.freshness.negative else { return .done(nil) }
        return .done(entry.value)
    }

    /// ``storedEntryAfterMemoryMiss(_:)`` tried on an async caller's task, as
    /// ``valueAfterMemoryMissIfImmediate(_:)`` is (`lookup` and the loaders' reads).
    func storedEntryAfterMemoryMissIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<StoredEntry?> {
        guard case .done(let found) = try diskEntryAfterMemoryMissIfImmediate(key, promotingNegative: true) else { return .wouldBlock }
        guard let entry = found else { return .done(nil) }
        var stored = StoredEntry(value: entry.value, deadline: entry.expiry, freshness: entry.placement.freshness)
        stored.stamp = entry.placement.stamp
        return .done(stored)
    }

    /// ``diskEntryAfterMemoryMiss(_:promotingNegative:)`` that does not wait: the stripe by a bounded
    /// spin, the disk through ``DiskTier/entryIfImmediate(_:)``. A read done here is counted in
    /// `inlineDiskReads` and promoted as any disk hit.
    @inline(__always)
    private func diskEntryAfterMemoryMissIfImmediate(_ key: HashedKey, promotingNegative: Bool) throws(MagpieError)
        -> ImmediateRead<DiskEntry?>
    {
        guard let disk else { return .done(nil) }
        guard stripes.tryLock(for: key.hash) else { return .wouldBlock }
        defer { stripes.unlock(for: key.hash) }
        let read: ImmediateRead<DiskEntry?>
        do {
            read = try disk.entryIfImmediate(key)
        } catch {
            noteDiskFailure("read", error)
            throw error
        }
        guard case .done(let found) = read else { return .wouldBlock }
        counters.inlineDiskReads.add(1, ordering: .relaxed)
        if let entry = found, promotingNegative || !entry.placement.freshness.negative { promote(entry, for: key) }
        return .done(found)
    }

    /// The disk half of the loader API's read: the entry with its expiry and freshness, negative ones
    /// included, promoted like any disk hit.
    func storedEntryAfterMemoryMiss(_ key: HashedKey) throws(MagpieError) -> StoredEntry? {
        try diskEntryAfterMemoryMiss(key, promotingNegative: true).map {
            var entry = StoredEntry(value: $0.value, deadline: $0.expiry, freshness: $0.placement.freshness)
            entry.stamp = $0.placement.stamp
            return entry
        }
    }

    /// A disk read with the key's stripe held, promoting the hit; a negative entry only for the loader
    /// (a plain read, which treats it as a miss, would store it into memory again on every read).
    @inline(__always)
    private func diskEntryAfterMemoryMiss(_ key: HashedKey, promotingNegative: Bool) throws(MagpieError) -> DiskEntry? {
        guard let disk else { return nil }
        stripes.lock(for: key.hash)
        defer { stripes.unlock(for: key.hash) }
        let entry: DiskEntry?
        do {
            entry = try disk.entry(key)
        } catch {
            noteDiskFailure("read", error)
            throw error
        }
        guard let entry else { return nil }
        if promotingNegative || !entry.placement.freshness.negative { promote(entry, for: key) }
        return entry
    }

    /// Copies a disk hit into memory, with the memory expiry its record's policy gives and its freshness.
    private func promote(_ entry: DiskEntry, for key: HashedKey) {
        guard !entry.placement.diskOnly else { return }
        let now = clock.now()
        let deadline = EntryOptions.promotedDeadline(policy: entry.placement.memoryPolicy, diskDeadline: entry.expiry, now: now)
        guard deadline == 0 || deadline > now else { return }
        let stored = entry.value.withUnsafeBytes { value in
            memory.set(value, for: key, deadline: deadline, group: entry.group, freshness: entry.placement.freshness, stamp: entry.placement.stamp)
        }
        if case .success(true) = stored { counters.promotions.add(1, ordering: .relaxed) }
    }
}
