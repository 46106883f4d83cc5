// The local tiers of a cache as one: memory, the storage tier behind it (the disk tier, or one that holds
// nothing: StorageTier.swift), the key stripes that keep the two in step, and the promotion of a disk hit
// into memory.
//
// Consistency between the tiers: the changes one call makes to both tiers for a key, and a read's disk
// look-up and promotion, run under a lock striped by the key's hash, so they never interleave for one
// key: a promotion cannot put back a value that a concurrent store replaced or a removal removed.
// Removing everything, or a group, holds every stripe. A memory hit takes none; a memory-only cache
// takes none at all (its storage tier never waits, and memory keeps itself consistent).
//
// Every read and store takes a `ReadWait`: `.block` may wait (for a stripe, a bucket's lock, the disk),
// `.ifImmediate` answers `.wouldBlock`, having changed nothing, where it would have to: that is how the
// async API runs a disk hit or a memtable append on the caller's task and hops to an I/O thread only
// when it must (Runtime.immediateOrHop). One entry type, `StoredEntry`, comes out of both tiers.

/// What a read wants of the tiers.
@usableFromInline
enum ReadWant: Sendable {
    /// The value (a negative entry reads as absent, and is not promoted).
    case value
    /// The entry with its metadata, negative entries included (`lookup`, the loader API).
    case entry
    /// Whether a live value is there: not counted as a read, nothing promoted, no value copied.
    case contains
}

/// Which disk hits a read copies into memory.
enum Promotion {
    /// None (`contains` in a cache with a remote tier, which reads the entry for its stamp).
    case none
    /// Values, not negative entries (a plain read, which treats one as a miss, would store it into memory
    /// again on every read).
    case values
    /// Every entry, negative ones too (the loader API and `lookup`).
    case all

    /// Whether a hit, negative or not, is promoted.
    @inline(__always)
    func applies(negative: Bool) -> Bool {
        switch self {
        case .none: false
        case .values: !negative
        case .all: true
        }
    }
}

@usableFromInline
final class LocalTiers: Sendable {
    let memory: MemoryTier
    let storage: any StorageTier
    let stripes = LockStripes(count: 1024)
    let runtime: Runtime

    init(memory: MemoryTier, storage: any StorageTier, runtime: Runtime) {
        self.memory = memory
        self.storage = storage
        self.runtime = runtime
    }

    // MARK: Reads

    /// `key` in memory: its entry (for ``ReadWant/contains`` an empty one, not counted as a read, with its
    /// stamp when `stamped`).
    func inMemory(_ key: HashedKey, _ want: ReadWant, stamped: Bool) -> StoredEntry? {
        guard want == .contains else { return memory.entry(key) }
        guard stamped else { return memory.contains(key) ? .empty : nil }
        return memory.metadata(key).map { found in
            var entry = StoredEntry(value: [], deadline: found.deadline, freshness: found.freshness)
            entry.stamp = found.stamp
            return entry
        }
    }

    /// Runs `body` over a copy of `key` in memory that `policy` lets serve, in place (no lock). Generic
    /// over the policy: a call with the remote tier's own (a final class) judges the stamp without a
    /// witness call.
    @inline(__always)
    func withServableValue<R, Policy: CoherencePolicy>(_ key: HashedKey, _ policy: Policy, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        let now = runtime.clock.now()
        let found = memory.withStampedValue(key) { stamp, bytes -> R? in policy.servable(stamp: stamp, now: now) ? body(bytes) : nil }
        if case .some(.none) = found { policy.noteUnserved() }  // a copy, not servable
        return found ?? nil
    }

    /// Whether the storage tier holds a live value of `key` (no entry decoded, nothing promoted).
    func containsInStorage(_ key: HashedKey, wait: ReadWait) throws(MagpieError) -> ImmediateRead<Bool> {
        let storage = storage
        switch wait {
        case .block: return .done(try runtime.logged("contains") { () throws(MagpieError) in try storage.contains(key) })
        case .ifImmediate:
            let found = try runtime.logged("contains") { () throws(MagpieError) in try storage.containsIfImmediate(key) }
            if case .done = found { runtime.count(.inlineDiskReads) }
            return found
        }
    }

    /// The value past memory for a plain read (nil for a negative entry): the synchronous read's disk half.
    @inline(__always)
    func valueInStorage(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        guard let entry = try storageEntryBlocking(key, promotion: .values), !entry.placement.freshness.negative else { return nil }
        return entry.value
    }

    /// A storage read with the key's stripe held, a hit promoted as `promotion` says. With `.ifImmediate`
    /// the stripe is taken by a bounded spin and the read done through ``StorageTier/entryIfImmediate(_:)``;
    /// a read done so is counted in `inlineDiskReads`. (Written without closures around the stripe and
    /// the logging: each cost a retain and a release per read.)
    @inline(__always)
    func storageEntry(_ key: HashedKey, wait: ReadWait, promotion: Promotion) throws(MagpieError) -> ImmediateRead<DiskEntry?> {
        guard wait == .ifImmediate else { return .done(try storageEntryBlocking(key, promotion: promotion)) }
        guard stripes.tryLock(for: key.hash) else { return .wouldBlock }
        defer { stripes.unlock(for: key.hash) }
        let read: ImmediateRead<DiskEntry?>
        do {
            read = try storage.entryIfImmediate(key)
        } catch {
            runtime.noteDiskFailure("read", error)
            throw error
        }
        guard case .done(let found) = read else { return .wouldBlock }
        runtime.count(.inlineDiskReads)
        if let entry = found, promotion.applies(negative: entry.placement.freshness.negative) { promote(entry, for: key) }
        return read
    }

    /// ``storageEntry(_:wait:promotion:)`` with `.block`: its result returned as it is, not wrapped (the
    /// wrapping copied the entry on every disk hit; callgrind).
    @inline(__always)
    func storageEntryBlocking(_ key: HashedKey, promotion: Promotion) throws(MagpieError) -> DiskEntry? {
        guard storage.mayWait else { return nil }
        stripes.lock(for: key.hash)
        defer { stripes.unlock(for: key.hash) }
        let found: DiskEntry?
        do {
            found = try storage.entry(key)
        } catch {
            runtime.noteDiskFailure("read", error)
            throw error
        }
        // Unwrapped once and returned as it is (binding a copy beside `found` copied the entry).
        guard let entry = found else { return nil }
        if promotion.applies(negative: entry.placement.freshness.negative) { promote(entry, for: key) }
        return entry
    }

    /// Copies a disk hit into memory, with the memory expiry its record's policy gives and its metadata.
    private func promote(_ entry: DiskEntry, for key: HashedKey) {
        guard !entry.placement.diskOnly else { return }
        let now = runtime.clock.now()
        let deadline = EntryOptions.promotedDeadline(policy: entry.placement.memoryPolicy, diskDeadline: entry.expiry, now: now)
        guard deadline == 0 || deadline > now else { return }
        let stored = entry.value.withUnsafeBytes { value in
            memory.set(
                value, for: key, deadline: deadline, group: entry.group, freshness: entry.placement.freshness,
                stamp: entry.placement.stamp, version: entry.placement.version)
        }
        if case .success(true) = stored { runtime.count(.promotions) }
    }

    // MARK: Writes

    /// A store, with the key's stripe taken here (`.ifImmediate`: only when it is free within a short
    /// spin, and only when the storage half is a memtable append that cannot wait, see
    /// ``DiskTier/storeIfImmediate(_:for:expiry:group:placement:)``). `.wouldBlock` changed nothing.
    func write(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<Void>
    {
        guard lock(key.hash, for: options, wait: wait) else { return .wouldBlock }
        defer { unlock(key.hash) }
        return try store(value, for: key, options: options, memoryPolicy: options.encodedMemoryPolicy, stamp: stamp, wait: wait)
    }

    /// Takes the stripe a store of `options` holds across both tiers (none when the storage tier never
    /// waits, unless `always`); `.ifImmediate`: only if it is free within a short spin, and never for a
    /// memory-only store into a storage tier, whose removal there may wait. Pair a true with
    /// ``unlock(_:always:)``.
    @inline(__always)
    func lock(_ hash: UInt64, for options: EntryOptions, wait: ReadWait, always: Bool = false) -> Bool {
        guard storage.mayWait || always else { return true }
        switch wait {
        case .block:
            stripes.lock(for: hash)
            return true
        case .ifImmediate:
            return (options.tiers != .memoryOnly || !storage.mayWait) && stripes.tryLock(for: hash)
        }
    }

    @inline(__always)
    func unlock(_ hash: UInt64, always: Bool = false) {
        if storage.mayWait || always { stripes.unlock(for: hash) }
    }

    /// An async caller's read or store of `key` (hashed as `hash`): here when the storage tier never
    /// waits; else here when it cannot wait and `inline` allows it, else on an I/O thread
    /// (``Runtime/immediateOrHop(_:hash:inline:_:)``).
    nonisolated(nonsending)
    func immediateOrHop<R: Sendable>(
        _ key: [UInt8], hash: UInt64, inline: Bool, _ work: @escaping @Sendable (HashedKey, ReadWait) throws(MagpieError) -> ImmediateRead<R>
    ) async throws -> R {
        guard storage.mayWait else {
            return try runtime.withKey(key, hash: hash) { key throws(MagpieError) in try work(key, .block).waited() }
        }
        return try await runtime.immediateOrHop(key, hash: hash, inline: inline, work)
    }

    /// Runs `work` on an I/O thread when the storage tier may wait, else here.
    nonisolated(nonsending)
    func offload<R: Sendable>(_ work: @escaping @Sendable () throws(MagpieError) -> R) async throws -> R {
        guard storage.mayWait else {
            try runtime.checkOpen()
            return try work()
        }
        return try await runtime.hop(work)
    }

    /// A store's changes to both tiers, the key's stripe held by the caller when the storage tier may
    /// wait: storage first (if it throws, neither tier changed). `memoryPolicy`: the memory expiry kept
    /// beside the disk record (a kept remote hit's is its record's). `.ifImmediate`: see
    /// ``write(_:for:options:stamp:wait:)``.
    @discardableResult
    func store(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, memoryPolicy: Int64, stamp: StoreStamp,
        wait: ReadWait = .block
    ) throws(MagpieError) -> ImmediateRead<Void> {
        let (storage, tiers) = (storage, storage.placing(options.tiers))
        let expiry = stamp.disk == 0 ? Expiry.never : .at(millisecondsSince1970: stamp.disk)
        var placement = EntryMetadata(memoryPolicy: memoryPolicy, freshness: stamp.freshness, stamp: stamp.coherence, version: stamp.version)
        if tiers == .diskOnly { placement.tiers = .diskOnly }
        let written = try runtime.logged("store") { () throws(MagpieError) -> ImmediateRead<Void> in
            switch (tiers, wait) {
            case (.memoryOnly, _):
                _ = try storage.remove(key)
                return .done(())
            case (_, .block):
                try storage.store(value, for: key, expiry: expiry, group: options.group, placement: placement)
                return .done(())
            case (_, .ifImmediate):
                return try storage.storeIfImmediate(value, for: key, expiry: expiry, group: options.group, placement: placement)
            }
        }
        guard case .done = written else { return .wouldBlock }
        if wait == .ifImmediate { runtime.count(.inlineDiskStores) }
        if tiers == .diskOnly {
            _ = memory.remove(key)
            return .done(())
        }
        _ = try memory.set(
            value, for: key, deadline: stamp.memory, group: options.group, freshness: stamp.freshness, stamp: stamp.coherence,
            version: stamp.version
        ).get()
        return .done(())
    }

    /// Removes `key` from both tiers (durably in storage); whether either held it.
    func remove(_ key: HashedKey) throws(MagpieError) -> Bool {
        guard storage.mayWait else { return memory.remove(key) }
        stripes.lock(for: key.hash)
        defer { stripes.unlock(for: key.hash) }
        return try removeHoldingStripe(key)
    }

    /// Removes `key` from both tiers, its stripe held by the caller; whether either held it.
    func removeHoldingStripe(_ key: HashedKey) throws(MagpieError) -> Bool {
        let storage = storage
        let inStorage = try runtime.logged("remove") { () throws(MagpieError) in try storage.remove(key) }
        return memory.remove(key) || inStorage
    }

    /// Drops `key`'s copies, its stripe held by the caller: from memory whatever the storage tier does (a
    /// failure there is logged and counted); whether either held one.
    func drop(_ key: HashedKey) -> Bool {
        let storage = storage
        let inStorage = try? runtime.logged("drop") { () throws(MagpieError) in try storage.remove(key) }
        return memory.remove(key) || inStorage == true
    }

    /// Empties both tiers, every stripe held. In storage bucket after bucket: if it throws, the buckets
    /// not yet emptied keep their entries (memory is emptied regardless).
    func removeAll() throws(MagpieError) {
        let storage = storage
        try stripes.withAllLocked { () throws(MagpieError) in
            defer { memory.removeAll() }
            try runtime.logged("remove all") { () throws(MagpieError) in try storage.removeAll() }
        }
    }

    /// Removes `group`'s entries from both tiers (in storage durably, a group tombstone), every stripe held.
    func removeAll(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        let storage = storage
        return try stripes.withAllLocked { () throws(MagpieError) -> RemovedEntries in
            var removed = RemovedEntries()
            removed.disk = try runtime.logged("remove group") { () throws(MagpieError) in try storage.removeAll(inGroup: group) }
            removed.memory = memory.removeAll(inGroup: group)
            return removed
        }
    }

    func removeExpired() throws(MagpieError) -> RemovedEntries {
        let storage = storage
        var removed = RemovedEntries(memory: memory.removeExpired())
        removed.disk = try runtime.logged("remove expired") { () throws(MagpieError) in try storage.removeExpired() }
        return removed
    }

    func flush() throws(MagpieError) {
        let storage = storage
        try runtime.logged("flush") { () throws(MagpieError) in try storage.flush() }
    }

    /// Closes the storage tier (the disk leaves an index snapshot for a fast reopen) and empties memory.
    func close() throws(MagpieError) {
        defer { memory.removeAll() }
        let storage = storage
        try runtime.logged("close") { () throws(MagpieError) in try storage.close() }
    }

    /// Writes the storage tier's write buffers to the kernel every `interval`, on an I/O thread (failures
    /// are logged and counted like any disk failure), when it buffers stores.
    func startWritingBuffers(every interval: Duration) {
        guard storage.buffersWrites else { return }
        let runtime = runtime
        // Weakly: a cache dropped without `close()` releases its directory at once, not when a timer ends.
        runtime.repeating(every: interval) { [weak storage] in
            guard let storage else { return false }
            _ = try? await runtime.hop { () throws(MagpieError) in
                try runtime.logged("buffer write") { () throws(MagpieError) in try storage.writeBuffers() }
            }
            return true
        }
    }

    /// The longest value a store keeps: the storage tier's, else the memory tier's.
    var largestStorableValue: Int { storage.largestValue ?? memory.largestStorableValue }
}

extension StoredEntry {
    /// The entry a `contains` answers with: no value, no metadata.
    static var empty: StoredEntry { StoredEntry(value: [], deadline: 0, freshness: .none) }

    /// The entry of a disk hit (its disk expiry as the deadline).
    init(_ entry: DiskEntry) {
        self.init(value: entry.value, deadline: entry.expiry, freshness: entry.placement.freshness)
        stamp = entry.placement.stamp
        version = entry.placement.version
    }
}
