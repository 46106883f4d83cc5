import Glibc

// The disk tier's operations on every bucket: group removal, remove all, expiry sweeps, flush, the
// memtable writes, close.

extension DiskTier {
    /// Removes every entry stored with `group`, durably: each bucket with a member in its file gets a
    /// group tombstone, so none of them comes back after a restart. Costs a read of every live record's
    /// first bytes. The empty group is no group (a store with group "" has none): removing it removes
    /// nothing and writes nothing.
    /// - Returns: the number of live entries removed.
    /// - Throws: ``MagpieError/Code/keyTooLong`` for a name over ``maximumGroupLength`` UTF-8 bytes; I/O
    ///   errors; ``MagpieError/Code/closed``.
    @discardableResult
    public func removeAll(inGroup group: String) throws(MagpieError) -> Int {
        let name = Array(group.utf8)
        guard !name.isEmpty else {
            try checkOpen()
            return 0
        }
        guard name.count <= Self.maximumGroupLength else {
            throw MagpieError(.keyTooLong, "group names are 1 to \(Self.maximumGroupLength) bytes, not \(name.count)")
        }
        try checkDirectoryIfDue()
        let now = configuration.clock.now()
        var removed = 0
        for number in 0..<bucketCount {
            removed += try name.withUnsafeBytes { group in
                Result { () throws(MagpieError) -> Int in
                    try withRoom(number, now: now) { (state, policy) throws(MagpieError) in
                        try state.removeGroup(group, now: now, policy: policy)
                    }
                }
            }.get()
        }
        return removed
    }

    /// Removes every entry (bucket by bucket; see the durability note above).
    public func removeAll() throws(MagpieError) {
        try checkDirectoryIfDue()
        for bucket in buckets {
            try bucket.withLock { (state: inout BucketState) throws(MagpieError) in
                try state.loadIfNeeded()
                try state.removeAll()
            }
        }
    }

    /// Drops every expired entry from the index now (their records go when their region is reclaimed).
    /// Expired entries are misses at once whether or not this runs.
    /// - Returns: the number dropped.
    @discardableResult
    public func removeExpired() throws(MagpieError) -> Int {
        let now = configuration.clock.now()
        var removed = 0
        for bucket in buckets {
            removed += try bucket.withLock { (state: inout BucketState) throws(MagpieError) -> Int in
                try state.checkOpen()
                try state.loadIfNeeded()
                return state.removeExpired(now: now)
            }
        }
        return removed
    }

    /// Makes everything stored so far durable: every memtable written (``writeBuffers()``), then fsync of
    /// every bucket file and of the directories.
    /// - Throws: ``MagpieError/Code/directoryReplaced`` (checked first) if the directory, `buckets/` or a
    ///   bucket file was removed or replaced while open (a bucket file from when its bucket opened it: see
    ///   ``DiskTier``, **Reopening**); I/O errors; ``MagpieError/Code/closed``.
    public func flush() throws(MagpieError) {
        try writeBuffers()
        for bucket in buckets {
            try bucket.withLock { (state: inout BucketState) throws(MagpieError) in
                try state.checkOpen()
                if state.life.loaded { try state.flush() }  // a bucket not loaded has not been written since the open
            }
        }
        try syncJournal()
        try directory.sync(.buckets)
        try directory.sync(.root)
    }

    /// Writes every bucket's memtables to its file (compressing them on this thread, or waiting for the
    /// background thread where it has one): everything stored so far has then reached the kernel's page
    /// cache and survives the process being killed (not a power loss: that is ``flush()``). A `Cache`
    /// calls it every ``Cache/Configuration/diskBufferWriteInterval``.
    /// - Throws: the first bucket's failure (every bucket is still tried; the stores a failed memtable
    ///   held become misses, see ``DiskTierStatistics/lostBufferedStores``), ``MagpieError/Code/closed``,
    ///   ``MagpieError/Code/directoryReplaced`` (checked first, see ``flush()``).
    public func writeBuffers() throws(MagpieError) {
        try verifyDirectory()
        try checkOpen()
        var failure: MagpieError? = nil
        for number in 0..<bucketCount {
            do { try bucketSet.writeMemtables(number) } catch { failure = failure ?? error }
        }
        if let failure { throw failure }
    }

    /// Removes what `buckets/` holds besides bucket files, snapshots and SIZES, holding the stray lock.
    /// Whether it succeeded.
    private func removeStraysAtClose() -> Bool {
        strayLock.withLock { _ in
            (try? Self.removeStrays(in: directory, count: bucketCount, keepingSizes: true)) != nil
        }
    }

    /// Flushes, then closes every file and releases the directory. Later calls throw
    /// ``MagpieError/Code/closed``. Closing twice is harmless.
    public func close() throws(MagpieError) {
        sealer.stop()  // after the seal it is in: the flush below writes the rest on this thread
        sealer.setWork(nil)
        loader.stop()
        let isOpen = buckets.first?.withLock { $0.isOpen } ?? false
        var failure: MagpieError? = nil
        if isOpen {
            do { try flush() } catch { failure = error }
        }
        // The loader thread stops after its current bucket (or its removal of strays): nothing of it runs
        // once the close writes in buckets/ (a snapshot, SIZES) or releases the directory.
        loader.waitUntilFinished()
        // Snapshots and SIZES only while the bucket files, the snapshots and SIZES fit the budget
        // (DiskLedger.swift); SIZES's room is set aside first (without it the next open measures every
        // file; without a snapshot it scans that bucket).
        // (The SIZES this open found, if still there, is replaced by the new one: both count meanwhile.)
        var room =
            configuration.budget - DiskLedger.manifestAllowance - journalSize - BucketSizes.length(bucketCount: bucketCount)
            - sizesFile.heldBytes
        closeJournal()
        logs.flush()
        // A bucket never loaded keeps its file and its snapshot as the open found them (both count).
        for bucket in buckets { room -= bucket.withLock { $0.isOpen ? $0.heldBytes : 0 } }
        var sizes: BucketSizes? = failure == nil && isOpen ? BucketSizes(seed: hasher.seed, files: [], snapshots: []) : nil
        for bucket in buckets {
            bucket.withLock { state in
                guard state.isOpen else {
                    sizes = nil
                    return
                }
                let file: Int
                var snapshot: Int
                if state.life.loaded {
                    // Its length, for the next load to check (OnDiskFormat.swift, "closed length"), once
                    // everything stored reached the file.
                    if failure == nil { state.recordClosedLength() }
                    file = state.layout.size
                    snapshot = state.life.keepsSnapshot ? state.life.snapshotCharge : 0
                    // Only a flushed index may be snapshotted: after a failed flush the next open scans.
                    if failure == nil && state.snapshotLength <= room {
                        room -= state.snapshotLength
                        snapshot = state.writeSnapshot()
                        state.life.keepsSnapshot = false  // that one is the close's, for the next open
                    }
                } else {
                    (file, snapshot) = state.unloadedSizes
                }
                sizes?.files.append(file)
                sizes?.snapshots.append(snapshot)
                state.close()
            }
        }
        // Last, once every file is as the next open will find it, and only once buckets/ holds nothing else
        // (an open that reads SIZES lists nothing, so it would leave strays: the same user's files, as
        // the directory is refused if others can write to it). A failure only means that open measures
        // every file.
        if let sizes, room >= 0, removeStraysAtClose() {
            _ = try? directory.writeAtomically(.buckets, BucketSizes.fileName, sizes.encoded())
        }
        lockFile.withLock { fd in
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }
        if let failure { throw failure }
    }
}
