import Logging

// The coherence policy of a cache with a remote tier (``Cache/Configuration/remote``): the read chain
// (Composition.swift) walks memory and disk and asks this policy whether a copy may be served (only while
// its coherence stamp is servable: Remote/Coherence.swift) and, on a local miss, fetches the store's record
// and keeps it; writes and removals go through to the store. What is its own: change messages, leases,
// fencing and the versions of writes.
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
final class RemotePolicy: CoherencePolicy {
    let local: LocalTiers
    let remote: RemoteTier
    /// Applies the store's change reports, one at a time, in order (RemotePolicy+Changes.swift); without a
    /// storage tier that may wait they are applied where they are reported, one at a time under `applying`.
    let applier = IOThreadPool(threadCount: 1, name: "magpie-coherence")
    let applying = Locked<Void>(())
    /// Hashes the keys the store reports.
    let hasher: KeyHash
    /// Load waiters (RemotePolicy+Lease.swift), woken by a change of their key.
    let leaseWaiters = KeyedWakeups()
    /// Keys whose copies a change message dropped lately (RemotePolicy+Changes.swift).
    let droppedKeys = Locked(DroppedKeys())
    /// Keys removed lately, by this instance or another (whose message carried the tombstone), and not
    /// written since as far as this instance heard: the store holds nothing newer, so a load asks for the
    /// value and the lease in one call rather than reading the value first (RemotePolicy+Lease.swift). A
    /// hint only: the one call answers the value if there is one after all.
    let removedKeys = Locked(DroppedKeys())

    var runtime: Runtime { local.runtime }
    var clock: CacheClock { local.runtime.clock }

    init(local: LocalTiers, options: RemoteTierOptions, hasher: KeyHash) {
        self.local = local
        self.hasher = hasher
        remote = RemoteTier(options, clock: local.runtime.clock, journal: local.storage.owedJournal)
    }

    // MARK: The policy's reads

    var judgesCopies: Bool { true }

    func servable(stamp: Int64, now: Int64) -> Bool { remote.coherence.servable(stamp: stamp, now: now) }

    func noteUnserved() { remote.counters.unserved.add(1, ordering: .relaxed) }

    func readsWithLease(_ hash: UInt64) -> Bool {
        remote.leaseTime != nil && removedKeys.withLock { $0.holds(hash) }
    }

    /// Runs `body` through the remote tier's bridge, blocking the calling thread; `fallback` where it
    /// cannot wait (on the store's own thread: counted and logged).
    func blocking<R: Sendable>(_ operation: String, fallback: R, _ body: @escaping @Sendable () async -> R) -> R {
        do {
            return try remote.blocking { () async throws(MagpieError) -> R in await body() }
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            runtime.logger.debug("magpie: remote \(operation) not run", metadata: ["error": "\(error)"])
            return fallback
        }
    }

    var statistics: RemoteTierStatistics? { remote.statistics }

    // MARK: Remote hits

    /// The store's current record of `name`, awaited, and kept locally when it may be (on an I/O thread
    /// when the storage tier may wait); counted as a remote hit or miss (``CacheStatistics/hits``).
    nonisolated(nonsending)
    func fetch(_ name: [UInt8], hash: UInt64) async -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(hash)
        guard let record = await remote.fetch(name) else {
            remote.counters.readMisses.add(1, ordering: .relaxed)
            return nil
        }
        remote.counters.readHits.add(1, ordering: .relaxed)
        return await keep(record, name: name, hash: hash, fetchedAt: started, counter: counter)
    }

    /// Keeps a fetched record, on an I/O thread when the storage tier may wait; the record as an entry.
    nonisolated(nonsending)
    func keep(_ record: RemoteRecord, name: [UInt8], hash: UInt64, fetchedAt started: Int64, counter: Coherence.Count) async -> StoredEntry {
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
    private func keep(_ record: RemoteRecord, for key: HashedKey, fetchedAt started: Int64, counter: Coherence.Count, wait: ReadWait)
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
