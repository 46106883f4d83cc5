import Synchronization

// Removals the store could not take (it was down, its breaker open, a call timed out) are owed to it
// and replayed when it answers again, so a removed value never comes back from the remote tier. A
// failed *store* owes a removal too: the store may still hold the value the failed store replaced.
//
// Until a key's removal is replayed, reads of it are remote misses here. The queue holds at most
// `maxPendingRemovals` keys and groups; past that it keeps one flag instead (`all`), and the replay
// replaces the namespace token: every record in the store is then outdated, for every instance.
//
// With a disk tier the queue is also journaled in the cache directory (OwedJournal.swift), under the
// same lock as the queue: an entry per owed key (with its tombstone's version) or group, or one for
// everything; rewritten whole when the queue overflows or the cache opens, removed when nothing is owed.
// A process killed while it owes removals replays them when it opens the directory again. Without a
// disk tier owed removals die with the process (see <doc:RunningAFleet>).

/// The removals a remote tier owes its store (``RemoteTier/owed``): the queue, its journal, and its
/// replay (OwedRemovals+Replay.swift).
final class OwedRemovals: Sendable {
    let state = Locked(PendingRemovals())
    /// The replay loop, while one runs.
    let replayTask = Locked<Task<Void, Never>?>(nil)
    /// Tasks waiting for every owed removal to land (``waitForReplay(upTo:)``).
    let drainWaiters = Locked<[Wakeup]>([])
    /// Where owed removals are journaled (a cache with a disk tier), else nil.
    let journal: OwedJournal?
    let maxPendingRemovals: Int
    /// How long a removal's tombstone lives in the store (ms).
    let tombstoneLifetime: Int64
    let store: any RemoteStore
    let tokens: RemoteTokens
    let counters: RemoteCounters
    let coherence: Coherence
    let clock: CacheClock

    /// Removals the store has not acknowledged. `all`: more than ``RemoteTierOptions/maxPendingRemovals``
    /// were owed, so the whole namespace is replaced when the store is back.
    struct PendingRemovals {
        /// Each owed key with the sequence number of its latest failure (a replay clears only what it
        /// sent: a failure after the snapshot stays owed) and the version its tombstone carries (the
        /// removal's own, or one above the failed store's: a later write by anyone still wins).
        var keys: [[UInt8]: (sequence: UInt64, version: UInt64)] = [:]
        /// Each owed group with the sequence number of its latest failure.
        var groups: [String: UInt64] = [:]
        var all = false
        /// From when the removals owed now hold back the watermark this cache publishes
        /// (``RemoteChanges/ownWritesDelivered()``): the start of the oldest write that was under way when
        /// the first of them was owed. Nil when nothing is owed, or only keys the store refused.
        var since: Int64? = nil
        /// Owed keys whose last replay the store answered with an error (``MagpieError/Code/remoteRefused``):
        /// they stay owed, but hold nothing back (the store is reachable; every instance reads the error).
        var refused: Set<[UInt8]> = []
        var sequence: UInt64 = 0
        /// The sequence number at which `all` was last set: a replay clears it only if it is unchanged.
        var allSequence: UInt64 = 0
        var isEmpty: Bool { keys.isEmpty && groups.isEmpty && !all }
        /// Whether something owed holds the watermark back.
        var holds: Bool { all || !groups.isEmpty || keys.count > refused.count }
        /// How many removals are owed (keys and groups; 1 for the whole namespace).
        var count: Int { all ? 1 : keys.count + groups.count }

        /// After a change: the hold starts at `oldest` if none was on, and ends with what holds it.
        mutating func updateHold(oldest: Int64) {
            if !holds {
                since = nil
            } else if since == nil {
                since = oldest
            }
        }

        /// Everything is owed: the keys and groups are dropped (replacing the namespace covers them).
        mutating func oweEverything() {
            sequence += 1
            keys = [:]
            groups = [:]
            all = true
            allSequence = sequence
        }
    }

    init(
        store: any RemoteStore, tokens: RemoteTokens, counters: RemoteCounters, coherence: Coherence, clock: CacheClock,
        journal: OwedJournal?, maxPendingRemovals: Int, tombstoneLifetime: Int64
    ) {
        self.store = store
        self.tokens = tokens
        self.counters = counters
        self.coherence = coherence
        self.clock = clock
        self.journal = journal
        self.maxPendingRemovals = maxPendingRemovals
        self.tombstoneLifetime = tombstoneLifetime
    }

    /// How many removals are owed (keys and groups; 1 for the whole namespace).
    var count: Int { state.withLock { $0.count } }

    /// Whether `key` (a user key) is owed a removal (everything owed included).
    func owes(key: [UInt8]) -> Bool { state.withLock { $0.all || $0.keys[key] != nil } }

    /// Whether `group` is owed a removal.
    func owes(group: String) -> Bool { state.withLock { $0.groups[group] != nil } }

    /// Owes `key`'s removal as of `version` (a later owed removal of the key supersedes it).
    func owe(key: [UInt8], version: UInt64) {
        owe(.key(key, version: version)) { pending in
            let previous = pending.keys[key]?.version ?? 0
            pending.keys[key] = (pending.sequence, max(previous, version))
            pending.refused.remove(key)
        }
    }

    func owe(group: String) {
        owe(.group(group)) { pending in pending.groups[group] = pending.sequence }
    }

    /// Owes everything: the namespace is replaced on replay.
    func oweEverything() {
        let oldest = oldestUndelivered()
        state.withLock { pending in
            pending.oweEverything()
            pending.updateHold(oldest: oldest)
            rewriteJournal([.everything])
        }
        counters.queuedRemovals.add(1, ordering: .relaxed)
        startReplay()
    }

    /// Records a removal owed (`record` files it under the next sequence number) and journals `entry`,
    /// unless everything is owed already; starts the replay.
    private func owe(_ entry: OwedEntry, _ record: (inout PendingRemovals) -> Void) {
        let oldest = oldestUndelivered()
        state.withLock { pending in
            guard !pending.all else { return }
            pending.sequence += 1
            record(&pending)
            defer { pending.updateHold(oldest: oldest) }
            if !overflowIfNeeded(&pending), let journal {
                let appended: Bool
                do { appended = try journal.append(entry.encoded) } catch {
                    counters.journalFailures.add(1, ordering: .relaxed)
                    appended = true  // kept in memory; the journal may miss it
                }
                if !appended {
                    // No room for another entry: one entry says it all.
                    pending.oweEverything()
                    counters.pendingOverflows.add(1, ordering: .relaxed)
                    rewriteJournal([.everything])
                }
            }
        }
        counters.queuedRemovals.add(1, ordering: .relaxed)
        startReplay()
    }

    /// Rewrites the journal (the caller holds `state`'s lock); a failure is counted.
    func rewriteJournal(_ entries: [OwedEntry]) {
        guard let journal else { return }
        do {
            if try !journal.replace(with: entries.map(\.encoded)) {
                // Too many entries for the journal: everything, which always fits.
                _ = try journal.replace(with: [OwedEntry.everything.encoded])
            }
        } catch {
            counters.journalFailures.add(1, ordering: .relaxed)
        }
    }

    /// Takes in the removals the journal kept from an earlier run (the cache opened its directory again),
    /// rewrites the journal compacted, and starts their replay. Throws the journal's read errors.
    func restore() throws(MagpieError) {
        guard let entries = try journal?.payloads(), !entries.isEmpty else { return }
        state.withLock { pending in
            for bytes in entries {
                guard let entry = OwedEntry(bytes) else { continue }
                pending.sequence += 1
                switch entry {
                case .key(let key, let version):
                    pending.keys[key] = (pending.sequence, max(pending.keys[key]?.version ?? 0, version))
                case .group(let group): pending.groups[group] = pending.sequence
                case .everything: pending.oweEverything()
                }
            }
            _ = overflowIfNeeded(&pending)
            // Writes of an earlier run: held back from now (when this run learns of them).
            pending.updateHold(oldest: clock.now())
            if pending.all {
                rewriteJournal([.everything])
            } else {
                rewriteJournal(pending.keys.map { OwedEntry.key($0.key, version: $0.value.version) } + pending.groups.keys.map { .group($0) })
            }
            counters.restoredRemovals.add(UInt64(pending.count), ordering: .relaxed)
        }
        startReplay()
    }

    /// Owes everything instead when the queue outgrew its bound (journaled); whether it did.
    private func overflowIfNeeded(_ pending: inout PendingRemovals) -> Bool {
        guard pending.keys.count + pending.groups.count > maxPendingRemovals else { return false }
        pending.oweEverything()
        counters.pendingOverflows.add(1, ordering: .relaxed)
        rewriteJournal([.everything])
        return true
    }

    /// The start of the oldest write under way, or now: where a removal owed now starts holding back
    /// the watermark (the failed write is still under way when it is owed).
    private func oldestUndelivered() -> Int64 {
        let now = clock.now()
        return min(now, coherence.oldestWriteUnderWay() ?? now)
    }

    /// The instant before which every write this cache returned has reached the store
    /// (``RemoteChanges/ownWritesDelivered()``). The writes under way are read before the owed
    /// removals: a failed write is owed before it stops being under way, so it is seen in one or the
    /// other.
    func ownWritesDelivered() -> Int64 {
        let now = clock.now()
        let underWay = coherence.oldestWriteUnderWay() ?? now
        let owed = state.withLock { $0.holds ? $0.since : nil } ?? now
        return min(now, underWay, owed)
    }
}
