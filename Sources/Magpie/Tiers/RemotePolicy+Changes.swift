// The changes the remote store reports, applied to the local tiers in order, and the remote tier's life
// cycle (start, close, shutdown).

extension RemotePolicy {
    // MARK: Changes reported by the store

    /// Starts what the remote tier runs in the background: the store's change reports, applied in order,
    /// and the replay of removals an earlier run owed (its journal). A change that may write the disk tier
    /// (a dropped copy's tombstone) is applied on the coherence thread; where the storage tier never waits
    /// (applying one takes a stripe and a memory store), on the store's own thread that reports it, one at
    /// a time (a thread wake-up per message cost more than applying it).
    func start() {
        let remote = remote
        let inline = !local.storage.mayWait
        let changes = RemoteChanges(
            clock: clock, delivered: { remote.owed.ownWritesDelivered() }, wantsSequences: { remote.coherence.sequencesWanted }
        ) { [weak self] change in
            guard let self else { return }
            if inline {
                applying.withLock { _ in apply(change) }
            } else {
                _ = applier.submit { self.apply(change) }
            }
        }
        remote.store.startReporting(to: changes)
        // Removals owed by an earlier run that was killed (journaled in the directory): replayed now.
        do {
            try remote.owed.restore()
        } catch {
            runtime.logger.error("magpie: the journal of owed removals could not be read", metadata: ["error": "\(error)"])
        }
    }

    /// Applies one change, on the coherence thread (in the order the store reported them).
    func apply(_ change: RemoteChange) {
        let coherence = remote.coherence
        switch change {
        case .changed(let message):
            coherence.invalidations.add(1, ordering: .relaxed)
            _ = coherence.sequenced(partition: message.partition, sequence: message.sequence, now: clock.now())
            // The writer keeps what it wrote: its own message changes nothing here.
            guard !message.own else {
                remote.counters.ownMessages.add(1, ordering: .relaxed)
                if message.key.first == RemoteKey.lease { wakeLeaseWaiters(Array(message.key.dropFirst())) }
                return
            }
            applyChanged(message.key, version: message.version, pushed: message.value)
        case .keys(let keys):
            coherence.invalidations.add(UInt64(keys.count), ordering: .relaxed)
            for key in keys { applyChanged(key, version: 0, pushed: nil) }
        case .sequences(let numbers):
            coherence.check(numbers, now: clock.now())
        case .sequencesRestarted:
            coherence.restartSequencesFromZero()
        case .partitionsLost(let partitions):
            coherence.lose(partitions: partitions, now: clock.now())
        case .all:
            remote.tokens.forget(group: nil)
            coherence.raiseFloor(to: clock.now())
            coherence.restartSequences()
        case .confirmed(let instant, let total):
            // Messages fell short of the store's total: no confirmation until the check finds where.
            if let total, coherence.check(total: total, instant: instant) { return }
            coherence.confirm(through: instant, now: clock.now())
        case .delivered(let instant):
            coherence.delivered.store(instant, ordering: .releasing)
        }
    }

    /// Another instance's change of the logical key `key` (version 0: unknown, from an invalidation).
    private func applyChanged(_ key: [UInt8], version: UInt64, pushed: [UInt8]?) {
        guard let tag = key.first else { return }
        let rest = key.dropFirst()
        switch tag {
        case RemoteKey.record:
            let name = Array(rest)
            changeLocal(name, version: version, pushed: pushed.flatMap { RemoteRecord.decode($0, key: key) })
            remote.onInvalidation?(name)
        case RemoteKey.lease:
            wakeLeaseWaiters(Array(rest))
        case RemoteKey.group:
            guard let group = String(validating: rest, as: UTF8.self) else { return }
            // A token this instance holds already (its creation, or an echo of this instance's own removal,
            // reported as a key's value), or one it created and has not cached yet, changes nothing.
            if let token = pushed.map(RemoteRecord.token), remote.tokens.knows(token, group: group, now: clock.now()) { return }
            remote.tokens.forget(group: group)
            _ = try? local.removeAll(inGroup: group)
        case RemoteKey.namespace:
            if let token = pushed.map(RemoteRecord.token), remote.tokens.knows(token, group: nil, now: clock.now()) { return }
            remote.tokens.forget(group: nil)
            remote.coherence.raiseFloor(to: clock.now())
        default:
            return  // the store's own keys
        }
    }

    /// Another instance wrote `name` at `version` (0: unknown): a local copy of an older write is replaced
    /// by the pushed record when the message carried a current one and memory holds the key (or a load
    /// here waits for the key's value: the other instance's load, whose lease it found taken; or a message
    /// dropped this instance's copy lately, at an older version), else dropped; a copy of this write or a
    /// newer one stays. Wakes the loads waiting for its value.
    private func changeLocal(_ name: [UInt8], version: UInt64, pushed: RemoteRecord.Decoded?) {
        guard name.count <= HashedKey.maximumLength, !runtime.closed.load(ordering: .relaxed) else { return }
        let partition = remote.partition(of: name)
        let hash = name.withUnsafeBytes { bytes in
            let key = HashedKey(bytes, hasher: hasher)
            // Before the stripe: a fetch of the key under way now keeps nothing older than this change
            // (Coherence.keepable).
            remote.coherence.bump(key.hash, version: version)
            local.stripes.withLock(for: key.hash) {
                let held = local.memory.metadata(key)
                if version != 0, let held, held.version >= version {
                    remote.counters.staleMessages.add(1, ordering: .relaxed)
                    return
                }
                if case .tombstone? = pushed {
                    removedKeys.withLock { $0.note(key.hash, version: version) }
                } else {
                    removedKeys.withLock { $0.forget(key.hash) }
                }
                if case .record(let record) = pushed,
                    held != nil || leaseWaiters.waits(for: key.hash)
                        || version != 0 && droppedKeys.withLock({ $0.take(key.hash, before: version) }),
                    replace(key, with: record, partition: partition)
                {
                    remote.counters.pushesApplied.add(1, ordering: .relaxed)
                    return
                }
                guard local.drop(key) else { return }
                remote.counters.copiesDropped.add(1, ordering: .relaxed)
                // Its next write's pushed value comes back in (a key this instance held is likely read here
                // again); only after a versioned change, so that no push older than the drop is taken.
                if version != 0 { droppedKeys.withLock { $0.note(key.hash, version: version) } }
            }
            return key.hash
        }
        leaseWaiters.signal(hash)
    }

    /// Replaces memory's copy of `key` with a pushed record current by the cached tokens (the disk's copy,
    /// older, goes); false, with nothing changed, otherwise. The key's stripe is held.
    private func replace(_ key: HashedKey, with record: RemoteRecord, partition: Int) -> Bool {
        let now = clock.now()
        guard record.tiers != .diskOnly, remote.tokens.current(record, now: now),
            record.expiresAt == 0 || record.expiresAt > now
        else { return false }
        let storage = local.storage
        _ = try? runtime.logged("drop") { () throws(MagpieError) in try storage.remove(key) }
        let deadline = EntryOptions.promotedDeadline(policy: record.memoryPolicy, diskDeadline: record.expiresAt, now: now)
        // Stamped with the feed's confirmation, not the instant it arrived: the message may arrive late,
        // after a later change of the key was published and lost; confirmations stop at such a loss
        // (Coherence.check(total:)), so the copy lapses within the bound of it, as every other copy does.
        let since = min(now, remote.coherence.confirmed.load(ordering: .acquiring))
        let stored = record.value.withUnsafeBytes { bytes in
            local.memory.set(
                bytes, for: key, deadline: deadline, group: record.group, freshness: record.freshness,
                stamp: Coherence.stamp(at: since, partition: partition), version: record.version)
        }
        return (try? stored.get()) == true
    }

    /// Drops the local copies of `name` (this instance's write was refused as older than the store's).
    func dropLocal(_ name: [UInt8]) {
        changeLocal(name, version: 0, pushed: nil)
    }

    private func wakeLeaseWaiters(_ name: [UInt8]) {
        guard name.count <= HashedKey.maximumLength else { return }
        leaseWaiters.signal(name.withUnsafeBytes { HashedKey($0, hasher: hasher).hash })
    }

    // MARK: Life cycle

    /// `shutdown`'s last step: the store's connections, closed and awaited.
    nonisolated(nonsending)
    func closeStore() async { await remote.store.shutdown() }

    /// Stops the remote tier at `close()`: the replay stops, and the store's connections close in the
    /// background unless the caller closes them (`closingStore` false).
    func stop(closingStore: Bool) {
        applier.shutdown()
        remote.owed.stopReplay()
        let store = remote.store
        if closingStore { Task { await store.shutdown() } }
    }

    /// The remote tier of a cache dropped without `close()`: its bridge thread ends, and so do its replay
    /// and its store's connections (they would outlive the cache).
    func drop(closed: Bool) {
        remote.bridge.shutdown()
        applier.shutdown()
        if !closed { stop(closingStore: true) }
    }

    /// `shutdown`'s first step: waits up to `replayTime` for the owed removals to reach the store; what is
    /// still owed is logged (journaled with a disk tier, lost without one).
    nonisolated(nonsending)
    func replayBeforeShutdown(upTo replayTime: Duration) async {
        let owed = await remote.owed.waitForReplay(upTo: replayTime)
        guard owed > 0 else { return }
        if local.storage.owedJournal == nil {
            runtime.logger.error("magpie: removals owed to the remote tier are lost at shutdown", metadata: ["owed": "\(owed)"])
        } else {
            runtime.logger.warning(
                "magpie: removals still owed to the remote tier at shutdown; journaled, replayed at the next open",
                metadata: ["owed": "\(owed)"])
        }
    }
}

/// The keys whose local copies a versioned change message (or this instance's removal) dropped lately,
/// and the version of that change: a later message of such a key with a newer pushed value brings it back
/// into memory with no round trip (the instance was holding the key, so it is likely read here again),
/// where a key never held here is not added. A key's hash picks one of 4,096 places (keys of different
/// stripes share them: the table has a lock of its own); a newer drop of another key there forgets it, at
/// the cost of one remote hit, as without the table. 64 KiB. A second table of the same kind keeps the keys
/// removed lately (RemotePolicy's `removedKeys`).
struct DroppedKeys: Sendable {
    private static let count = 4096
    /// Per place: the key's hash (0: none) and the version of the change that dropped its copy.
    private var entries = [(hash: UInt64, version: UInt64)](repeating: (0, 0), count: count)

    private static func place(_ hash: UInt64) -> Int { Int(truncatingIfNeeded: (hash >> 24) & UInt64(count - 1)) }

    /// A copy of the key with this hash was dropped by a change of `version`.
    mutating func note(_ hash: UInt64, version: UInt64) {
        entries[Self.place(hash)] = (hash, version)
    }

    /// This instance wrote the key with this hash: no earlier drop of it counts any more.
    mutating func forget(_ hash: UInt64) {
        let place = Self.place(hash)
        if entries[place].hash == hash { entries[place].hash = 0 }
    }

    /// Whether the key with this hash is noted (and not forgotten since).
    func holds(_ hash: UInt64) -> Bool {
        hash != 0 && entries[Self.place(hash)].hash == hash
    }

    /// Whether a copy of the key with this hash was dropped lately by a change older than `version`;
    /// forgets it when so (the key is held again, or the push could not be kept).
    mutating func take(_ hash: UInt64, before version: UInt64) -> Bool {
        let place = Self.place(hash)
        guard hash != 0, entries[place].hash == hash, entries[place].version < version else { return false }
        entries[place].hash = 0
        return true
    }
}
