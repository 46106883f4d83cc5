import Logging

// The local tiers of a cache with a remote tier (``Cache/Configuration/remote``), kept coherent with it:
// reads go memory → disk → remote, writes and removals go through to the store, and a local copy is
// served only while its coherence stamp is servable (Remote/Coherence.swift).
//
// Every remote operation is async and awaited where it is needed: the async API awaits the store on the
// caller's task (a memory hit never leaves the caller's executor; disk work that would wait goes to the
// I/O threads); the synchronous API waits for it in one place, `RemoteTier.bridge`. No lock is held
// across a round trip.
//
// Writes have two halves. The local half (`writeLocally`, `removeLocally`), under the key's stripe, marks
// a write of the key under way (Coherence.beginWrite), changes the local tiers and gives the remote write
// its version (HybridClock), so one instance's writes of a key get versions in the order they changed the
// local tiers. The remote half (`send`) then writes the record, or a removal's tombstone, with no lock
// held; the store applies it only if no newer version of the key is there (RemoteStore.storeIfNewer), so
// writes of one key take effect in version order however they overtake each other on the way, and a write
// that ran late (after a timeout, or a paused server) never undoes a later removal. When it ends the write
// is no longer under way (Coherence.endWrite).
//
// Reads. Both local tiers keep the coherence stamp beside the value (never in it); a copy without one is
// never served. A remote hit is kept locally (memory, disk, as the record's tiers say) only while the
// change feed is confirmed, no change of the key newer than the fetched write came during the fetch, and
// no write of the key is under way (Coherence.keepable).

@usableFromInline
final class CoherentTiers: Sendable {
    let local: LocalTiers
    let remote: RemoteTier
    /// Applies the store's change reports, one at a time, in order (CoherentTiers+Changes.swift); without a
    /// disk tier they are applied where they are reported, one at a time under `applying`.
    let applier = IOThreadPool(threadCount: 1, name: "magpie-coherence")
    let applying = Locked<Void>(())
    /// Hashes the keys the store reports.
    let hasher: KeyHash
    /// Load waiters (CoherentTiers+Lease.swift), woken by a change of their key.
    let leaseWaiters = KeyedWakeups()
    /// Keys whose copies a change message dropped lately (CoherentTiers+Changes.swift).
    let droppedKeys = Locked(DroppedKeys())

    var runtime: Runtime { local.runtime }
    var clock: CacheClock { local.runtime.clock }

    init(local: LocalTiers, options: RemoteTierOptions, hasher: KeyHash) {
        self.local = local
        self.hasher = hasher
        remote = RemoteTier(options, clock: local.runtime.clock, journal: local.disk.map { OwedJournal($0) })
    }

    // MARK: Reads

    /// What the local tiers hold of a key, judged by its coherence stamp.
    enum LocalCopy: Sendable {
        /// A copy that may be served.
        case serve(StoredEntry, CacheHit.Tier)
        /// None that may be served: ask the store. `unverified`: a copy past its staleness bound, which
        /// only fail-safe may serve (the loader API's fallback when the store has nothing).
        case ask(unverified: (StoredEntry, CacheHit.Tier)?)
    }

    /// A servable copy of `key` in memory, copied (no lock): the memory hit.
    @usableFromInline
    func servableMemoryValue(_ key: HashedKey) -> [UInt8]? {
        withServableMemoryValue(key) { [UInt8]($0) }
    }

    /// Runs `body` over a servable copy of `key` in memory, in place (no lock).
    @inline(__always)
    func withServableMemoryValue<R>(_ key: HashedKey, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        let now = clock.now()
        let coherence = remote.coherence
        let found = local.memory.withStampedValue(key) { stamp, bytes -> R? in
            coherence.servable(stamp: stamp, now: now) ? body(bytes) : nil
        }
        if case .some(.none) = found { remote.counters.unserved.add(1, ordering: .relaxed) }  // a copy, not servable
        return found ?? nil
    }

    /// The local tiers' copy of `key` (memory unless `memoryChecked`; disk, read without promoting for
    /// ``ReadWant/contains``), judged at one instant. A negative entry never answers `contains`, which
    /// counts no read in memory.
    func localCopy(_ key: HashedKey, _ want: ReadWant, memoryChecked: Bool, unverifiedFallback: Bool, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<LocalCopy>
    {
        let now = clock.now()
        var unverified: (StoredEntry, CacheHit.Tier)? = nil
        func judge(_ entry: StoredEntry, _ tier: CacheHit.Tier) -> LocalCopy? {
            if want == .contains && entry.freshness.negative { return nil }
            if remote.coherence.servable(stamp: entry.stamp, now: now) { return .serve(entry, tier) }
            if want != .contains { remote.counters.unserved.add(1, ordering: .relaxed) }
            if unverifiedFallback && entry.stamp != 0 {
                var copy = entry
                copy.unverified = true
                unverified = (copy, tier)
            }
            return nil
        }
        if !memoryChecked || unverifiedFallback {
            let entry: StoredEntry?
            if want == .contains {
                entry = local.memory.metadata(key).map { found in
                    var entry = StoredEntry(value: [], deadline: found.deadline, freshness: found.freshness)
                    entry.stamp = found.stamp
                    return entry
                }
            } else {
                entry = local.memory.entry(key)
            }
            if let entry, let copy = judge(entry, .memory) { return .done(copy) }
        }
        if unverified == nil {
            let promotion: Promotion = want == .contains ? .none : .all
            guard case .done(let found) = try local.diskEntry(key, wait: wait, promotion: promotion) else { return .wouldBlock }
            if let found, let copy = judge(StoredEntry(found), .disk) { return .done(copy) }
        }
        return .done(.ask(unverified: unverified))
    }

    /// `want` of `key` from the synchronous API: a servable local copy, else the store's record (never for
    /// `contains`), waited for on the bridge and kept locally, else the unverified copy.
    func read(_ key: HashedKey, _ want: ReadWant, memoryChecked: Bool, unverifiedFallback: Bool) throws(MagpieError)
        -> (StoredEntry, CacheHit.Tier)?
    {
        switch try localCopy(key, want, memoryChecked: memoryChecked, unverifiedFallback: unverifiedFallback, wait: .block).waited() {
        case .serve(let entry, let tier): return (entry, tier)
        case .ask(let unverified):
            guard want != .contains else { return nil }
            return counted(fetchWaiting(key)) ?? unverified
        }
    }

    /// The plain read's value past the memory probe (a negative entry is no value).
    func valuePastMemory(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        guard let (entry, _) = try read(key, .value, memoryChecked: true, unverifiedFallback: false), !entry.freshness.negative else {
            return nil
        }
        return entry.value
    }

    /// ``read(_:_:memoryChecked:unverifiedFallback:)`` for the async API: the local copy here when it
    /// cannot wait, else on an I/O thread; the store awaited with no thread blocked.
    nonisolated(nonsending)
    func read(_ name: [UInt8], hash: UInt64, _ want: ReadWant, memoryChecked: Bool, unverifiedFallback: Bool) async throws
        -> (StoredEntry, CacheHit.Tier)?
    {
        let copy = try await local.immediateOrHop(name, hash: hash, inline: runtime.inlineReads) {
            [self] key, wait throws(MagpieError) in
            try localCopy(key, want, memoryChecked: memoryChecked, unverifiedFallback: unverifiedFallback, wait: wait)
        }
        switch copy {
        case .serve(let entry, let tier): return (entry, tier)
        case .ask(let unverified):
            guard want != .contains else { return nil }
            return counted(await fetch(name, hash: hash)) ?? unverified
        }
    }

    /// A read the local tiers could not answer, answered by the store or not (``CacheStatistics/hits``).
    private func counted(_ fetched: StoredEntry?) -> (StoredEntry, CacheHit.Tier)? {
        guard let fetched else {
            remote.counters.readMisses.add(1, ordering: .relaxed)
            return nil
        }
        remote.counters.readHits.add(1, ordering: .relaxed)
        return (fetched, .remote)
    }

    // MARK: Remote hits

    /// The store's current record of `key`, kept locally when it may be; nil on a miss or a failure.
    /// Blocks for the round trip (the synchronous API).
    func fetchWaiting(_ key: HashedKey) -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(key.hash)
        let name = Array(key.bytes)
        let remote = remote
        let fetched: RemoteRecord?
        do {
            fetched = try remote.bridge.wait(remote.store) { await remote.fetch(name) }
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            return nil
        }
        guard let record = fetched else { return nil }
        return try? keep(record, for: key, fetchedAt: started, counter: counter).waited()
    }

    /// The store's current record of `name`, awaited, and kept locally when it may be (on an I/O thread
    /// when there is a disk tier).
    nonisolated(nonsending)
    func fetch(_ name: [UInt8], hash: UInt64) async -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(hash)
        guard let record = await remote.fetch(name) else { return nil }
        return await keep(record, name: name, hash: hash, fetchedAt: started, counter: counter)
    }

    /// Keeps a fetched record, on an I/O thread when there is a disk tier; the record as an entry.
    nonisolated(nonsending)
    private func keep(_ record: RemoteRecord, name: [UInt8], hash: UInt64, fetchedAt started: Int64, counter: Coherence.Count) async -> StoredEntry {
        // Here when it cannot wait (a memtable append with the stripe free), else on an I/O thread.
        let kept = try? await local.immediateOrHop(name, hash: hash, inline: runtime.inlineStores) { [self] key, wait in
            keep(record, for: key, fetchedAt: started, counter: counter, wait: wait)
        }
        return kept ?? entry(of: record)
    }

    /// A fetched record as an entry (its memory deadline from its policy).
    private func entry(of record: RemoteRecord) -> StoredEntry {
        StoredEntry(
            value: record.value,
            deadline: EntryOptions.promotedDeadline(policy: record.memoryPolicy, diskDeadline: record.expiresAt, now: clock.now()),
            freshness: record.freshness)
    }

    /// Keeps a fetched record locally (stamped with the fetch's start) when it may be, and returns it as
    /// an entry. Takes the key's stripe; disk I/O when there is a disk tier (with `.ifImmediate`, only a
    /// memtable append with the stripe free: `.wouldBlock` changed nothing).
    private func keep(_ record: RemoteRecord, for key: HashedKey, fetchedAt started: Int64, counter: Coherence.Count, wait: ReadWait = .block)
        -> ImmediateRead<StoredEntry>
    {
        let entry = entry(of: record)
        guard !runtime.closed.load(ordering: .relaxed) else { return .done(entry) }
        let partition = remote.partition(of: Array(key.bytes))
        guard remote.coherence.confirmedRecently(now: clock.now()) else {
            remote.counters.unkept.add(1, ordering: .relaxed)
            return .done(entry)
        }
        let options = EntryOptions(group: record.group, tiers: record.tiers)
        // The stripe even without a disk tier: a change message drops or replaces the key's copies under it,
        // after bumping the counter this checks.
        guard local.lock(key.hash, for: options, wait: wait, always: true) else { return .wouldBlock }
        defer { local.unlock(key.hash, always: true) }
        guard remote.coherence.keepable(key.hash, since: counter, version: record.version) else {
            remote.counters.unkept.add(1, ordering: .relaxed)
            return .done(entry)
        }
        // A copy of a newer write (a change message pushed it meanwhile) stays; so does a servable copy of
        // this one.
        if let held = local.memory.metadata(key), record.version != 0,
            held.version > record.version || held.version == record.version && remote.coherence.servable(stamp: held.stamp, now: clock.now())
        {
            return .done(entry)
        }
        var stamp = StoreStamp(
            memory: entry.deadline, disk: record.expiresAt, freshness: record.freshness,
            coherence: Coherence.stamp(at: started, partition: partition))
        stamp.version = record.version
        do {
            let stored = try record.value.withUnsafeBytes { bytes in
                Result { () throws(MagpieError) in
                    try local.store(bytes, for: key, options: options, memoryPolicy: record.memoryPolicy, stamp: stamp, wait: wait)
                }
            }.get()
            guard case .done = stored else { return .wouldBlock }
        } catch {
            runtime.logger.debug("magpie: a remote hit could not be kept locally", metadata: ["error": "\(error)"])
        }
        return .done(entry)
    }
}
