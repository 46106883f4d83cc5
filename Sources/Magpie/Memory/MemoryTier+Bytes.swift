import Glibc

// The memory tier's entry points for a key hashed once by its caller (`Cache`, or the public generic
// API in MemoryTier.swift, which reduces every key and value to bytes in place where it can): the hash
// picks the shard (low bits) and the index home and tag (see Memory/ShardStorage.swift). Nothing here
// hashes or converts a key again.

extension MemoryTier {
    /// Runs `body` on the shard of `hash` with its lock held, without retaining the shard.
    @inline(__always)
    func withShard<R>(for hash: UInt64, _ body: (inout ShardStorage) -> R) -> R {
        unownedShards[Int(truncatingIfNeeded: hash) & shardMask]._withUnsafeGuaranteedRef { $0.withLock(body) }
    }

    /// The value stored for `key`, copied into a new array, or nil. (Inlined into `Cache`'s read: a
    /// call more cost a memory hit 30 instructions, measured.)
    @usableFromInline @inline(__always)
    package func copyValue(_ key: HashedKey) -> [UInt8]? {
        // `[UInt8](buffer)` is the cheapest array construction measured on Swift 6.3/Linux (~45 ns for
        // 100 bytes; `init(unsafeUninitializedCapacity:)` takes ~100 ns via an unspecialised path).
        read(key) { [UInt8]($0) }
    }

    /// Runs `body` over the stored value's bytes in place, or returns nil. A hit takes no lock (see
    /// Memory/LockFreeRead.swift); a miss is confirmed under the shard's lock.
    @usableFromInline
    package func withValue<R>(_ key: HashedKey, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        read(key, body)
    }

    /// A read: lock-free first; under the shard's lock when that found nothing it may serve. `body` runs
    /// outside the lock, the thread pinned, unless the thread has no read-epoch slot (more than
    /// ``ReadEpochs/capacity`` threads reading at once): then everything runs under the lock.
    @inline(__always)
    func read<R>(_ key: HashedKey, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        let hash = key.hash
        return unownedShards[Int(truncatingIfNeeded: hash) & shardMask]._withUnsafeGuaranteedRef { shard in
            guard let pin = epochs.pin() else {
                return shard.withLock { $0.lookup(hash: hash, key: key.bytes).map(body) }
            }
            defer { epochs.unpin(pin) }
            if let value = shard.findLockFree(hash: hash, key: key.bytes, clock: clock, pin: pin, hitCounts: hitCounts) {
                return body(value)
            }
            // Pinned before the lock was taken: what the locked look-up finds stays valid after unlocking.
            guard let value = shard.withLock({ $0.lookup(hash: hash, key: key.bytes) }) else { return nil }
            return body(value)
        }
    }

    /// Runs `body` over the coherence stamp (0: none) and the bytes of `key`'s value in place, or returns
    /// nil: a cache with a remote tier's memory hit. Negative entries are misses. A hit takes no lock;
    /// a miss is confirmed under the shard's lock.
    @inline(__always)
    package func withStampedValue<R>(_ key: HashedKey, _ body: (Int64, UnsafeRawBufferPointer) -> R) -> R? {
        let hash = key.hash
        return unownedShards[Int(truncatingIfNeeded: hash) & shardMask]._withUnsafeGuaranteedRef { shard in
            guard let pin = epochs.pin() else {
                return shard.withLock { storage in
                    storage.lookupEntry(hash: hash, key: key.bytes, refusing: EntryHeader.negativeFlag).map { block, header in
                        body(ShardStorage.stamp(of: block, header), ShardStorage.value(of: block, header))
                    }
                }
            }
            defer { epochs.unpin(pin) }
            if let (block, header) = shard.findBlockLockFree(
                hash: hash, key: key.bytes, clock: clock, pin: pin, hitCounts: hitCounts, refusing: EntryHeader.negativeFlag)
            {
                return body(ShardStorage.stamp(of: block, header), ShardStorage.value(of: block, header))
            }
            // Pinned before the lock was taken: the block stays valid after unlocking.
            guard let (block, header) = shard.withLock({ $0.lookupEntry(hash: hash, key: key.bytes, refusing: EntryHeader.negativeFlag) })
            else { return nil }
            return body(ShardStorage.stamp(of: block, header), ShardStorage.value(of: block, header))
        }
    }

    /// The entry stored for `key` with its expiry and freshness, negative entries included (the
    /// loader API's read); nil when absent or expired. Counted as a read like ``copyValue(_:)``.
    package func entry(_ key: HashedKey) -> StoredEntry? {
        let hash = key.hash
        return unownedShards[Int(truncatingIfNeeded: hash) & shardMask]._withUnsafeGuaranteedRef { shard in
            guard let pin = epochs.pin() else {
                return shard.withLock { $0.lookupEntry(hash: hash, key: key.bytes).map(StoredEntry.init) }
            }
            defer { epochs.unpin(pin) }
            if let (block, header) = shard.findBlockLockFree(
                hash: hash, key: key.bytes, clock: clock, pin: pin, hitCounts: hitCounts, refusing: 0)
            {
                return StoredEntry(block, header)
            }
            // Pinned before the lock was taken: the block stays valid after unlocking.
            guard let (block, header) = shard.withLock({ $0.lookupEntry(hash: hash, key: key.bytes) }) else { return nil }
            return StoredEntry(block, header)
        }
    }

    /// The expiry, freshness, coherence stamp and version of `key`'s live entry (negative ones included);
    /// not counted as a read.
    package func metadata(_ key: HashedKey) -> EntryMarks? {
        withShard(for: key.hash) { $0.metadata(hash: key.hash, key: key.bytes) }
    }

    /// Whether `key` is present and unexpired; not counted as a read.
    @usableFromInline
    package func contains(_ key: HashedKey) -> Bool {
        withShard(for: key.hash) { $0.contains(hash: key.hash, key: key.bytes) }
    }

    /// Stores `value` for `key`; see ``set(_:forKey:expiry:group:)-(Sequence<UInt8>,Sequence<UInt8>,_,_)``.
    @usableFromInline
    package func set(_ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?)
        -> Result<Bool, MagpieError>
    {
        set(value, for: key, deadline: expiry == .never ? 0 : expiry.deadline(now: clock.now()), group: group, freshness: .none)
    }

    /// ``set(_:for:expiry:group:)`` with the deadline computed (ms since 1970, 0 = none; one already
    /// past removes the key: it must not keep an older value) and the loader API's freshness.
    package func set(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, deadline: Int64, group: String?, freshness: Freshness, stamp: Int64 = 0,
        version: UInt64 = 0
    ) -> Result<Bool, MagpieError> {
        guard key.count <= Self.maximumKeyLength else {
            return .failure(
                MagpieError(.keyTooLong, "key of \(key.count) bytes; the limit is \(Self.maximumKeyLength)"))
        }
        guard value.count <= Self.maximumValueLength else {
            return .failure(
                MagpieError(
                    .valueTooLarge, "value of \(value.count) bytes; the limit is \(Self.maximumValueLength)"))
        }
        return .success(store(value, for: key, deadline: deadline, group: group, freshness: freshness, stamp: stamp, version: version))
    }

    /// Stores `value` for `key` with a deadline already computed (ms since 1970, 0 = none; one already
    /// past removes the key) and the loader API's freshness. The caller checked the key's and the
    /// value's lengths. Returns whether the entry was stored. `stamp` and `version`: the coherence stamp of
    /// a cache with a remote tier and the version of the remote write the copy holds (0: none).
    package func store(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, deadline: Int64, group: String?, freshness: Freshness, stamp: Int64 = 0,
        version: UInt64 = 0
    ) -> Bool {
        let hash = key.hash
        if deadline != 0 && deadline <= clock.now() {
            _ = withShard(for: hash) { $0.remove(hash: hash, key: key.bytes) }
            return false
        }
        let tag = group.map { $0.isEmpty ? 0 : hasher.groupTag($0) } ?? 0
        var outcome = withShard(for: hash) {
            $0.store(
                hash: hash, key: key.bytes, value: value, deadline: deadline, group: tag, freshness: freshness, stamp: stamp,
                version: version, policy: .borrow)
        }
        if case .short = outcome {
            outcome = storeBorrowing(
                hash: hash, key: key.bytes, value: value, deadline: deadline, group: tag, freshness: freshness, stamp: stamp,
                version: version)
        }
        return outcome != .refused
    }

    /// Removes `key`; returns whether it was present.
    @usableFromInline
    package func remove(_ key: HashedKey) -> Bool {
        withShard(for: key.hash) { $0.remove(hash: key.hash, key: key.bytes) }
    }

    /// The store of an entry its shard lacked room for (nothing changed yet): room is gathered from the
    /// other shards and the store tried again (see `withBorrowedRoom`). Out of line, so that a store
    /// that fits costs what it did before shards lent (measured).
    @inline(never)
    func storeBorrowing(
        hash: UInt64, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, deadline: Int64, group: UInt64,
        freshness: Freshness, stamp: Int64, version: UInt64
    ) -> StoreOutcome {
        let number = Int(truncatingIfNeeded: hash) & shardMask
        return withBorrowedRoom { (policy, granted) -> RoomOutcome<StoreOutcome> in
            let outcome = withShard(for: hash) {
                $0.acceptGranted(granted)
                return $0.store(
                    hash: hash, key: key, value: value, deadline: deadline, group: group, freshness: freshness, stamp: stamp,
                    version: version, policy: policy)
            }
            if case .short(let shortfall) = outcome { return .short(shortfall) }
            return .done(outcome)
        } gather: { bytes, evicting in
            gatherRoom(bytes, for: number, evicting: evicting)
        }
    }

    /// Asks the shards other than `number`, one lock at a time, to lend up to `bytes` (see
    /// `ShardStorage.lend`). Returns what they lent, which the caller now holds (`withBorrowedRoom` hands
    /// it to the borrowing shard's limit). Free room is taken from the nearest shards
    /// first; evicting, each shard is asked for an equal part of what is still missing (so that no few
    /// shards lose half their entries while the others lose none), then, if some could not give their
    /// part, the shards are asked again for all that is missing. Out of line: inlined, it made every
    /// store run more instructions (measured).
    @inline(never)
    func gatherRoom(_ bytes: Int, for number: Int, evicting: Bool) -> Int {
        var gathered = 0
        for sweep in 0..<(evicting ? 2 : 1) {
            var step = 1
            while step < shardCount && gathered < bytes {
                let missing = bytes - gathered
                let others = shardCount - step  // this shard and those after it
                let wanted = evicting && sweep == 0 ? (missing + others - 1) / others : missing
                gathered += unownedShards[(number + step) & shardMask].takeUnretainedValue().withLock {
                    $0.lend(upTo: wanted, evicting: evicting)
                }
                step += 1
            }
        }
        return gathered
    }
}

/// The number of online processors, from `sysconf` (no Foundation in the library's hot types).
enum ProcessInfoLite {
    static var activeProcessorCount: Int {
        max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    }
}

/// An entry as the loader API reads it: the value (empty for a negative entry), its expiry and its
/// freshness.
package struct StoredEntry: Sendable {
    /// The value's bytes.
    package var value: [UInt8]
    /// The expiry in this tier (ms since 1970), 0 for none.
    package var deadline: Int64
    package var freshness: Freshness
    /// A cache with a remote tier: the instant its copy was last known current (0: none, never served
    /// by such a cache). Kept beside the value, never in it.
    package var stamp: Int64 = 0
    /// A cache with a remote tier: the version of the remote write this copy holds (0: unknown).
    package var version: UInt64 = 0
    /// A cache with a remote tier: a local copy past its staleness bound, given to the loader API only,
    /// which may serve it through fail-safe and nothing else.
    package var unverified = false

    package init(value: [UInt8], deadline: Int64, freshness: Freshness) {
        self.value = value
        self.deadline = deadline
        self.freshness = freshness
    }

    /// The entry of a block found live (lock held, or the thread pinned).
    init(_ block: UnsafeMutableRawPointer, _ header: EntryHeader) {
        let (deadline, freshness) = ShardStorage.metadata(of: block, header)
        self.init(value: [UInt8](ShardStorage.value(of: block, header)), deadline: deadline, freshness: freshness)
        stamp = ShardStorage.stamp(of: block, header)
        version = ShardStorage.version(of: block, header)
    }
}
