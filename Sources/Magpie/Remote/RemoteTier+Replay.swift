import Synchronization

// Removals the store could not take (it was down, its breaker open, a call timed out) are owed to it
// and replayed when it answers again, so a removed value never comes back from the remote tier. A
// failed *store* owes a removal too: the store may still hold the value the failed store replaced.
//
// Until a key's removal is replayed, reads of it are remote misses here. The queue holds at most
// `maxPendingRemovals` keys and groups; past that it keeps one flag instead (`all`), and the replay
// replaces the namespace token: every record in the store is then outdated, for every instance.
//
// With a disk tier the queue is also journaled in the cache directory (DiskTier+Journal.swift), under
// the same lock as the queue: an entry per owed key (with its tombstone's version) or group, or one for
// everything; rewritten whole when the queue overflows or the cache opens, removed when nothing is owed.
// A process killed while it owes removals replays them when it opens the directory again. Without a
// disk tier owed removals die with the process (see <doc:RunningAFleet>).

/// Where a remote tier journals its owed removals (the disk tier, when there is one).
struct OwedJournal: Sendable {
    /// Appends an entry; false when it does not fit (the tier then owes everything).
    let append: @Sendable ([UInt8]) throws(MagpieError) -> Bool
    /// Replaces every entry (none: removes the journal); false when they do not fit.
    let replace: @Sendable ([[UInt8]]) throws(MagpieError) -> Bool
}

/// One journal entry: kind (1 byte: 1 a key, 2 a group, 3 everything), the version of a key's tombstone
/// (u64 LE; 0 otherwise), then the key's or group's bytes.
enum OwedEntry: Equatable {
    case key([UInt8], version: UInt64)
    case group(String)
    case everything

    var encoded: [UInt8] {
        var bytes = [UInt8]()
        let (kind, version, name): (UInt8, UInt64, [UInt8]) =
            switch self {
            case .key(let key, let version): (1, version, key)
            case .group(let group): (2, 0, Array(group.utf8))
            case .everything: (3, 0, [])
            }
        bytes.reserveCapacity(9 + name.count)
        bytes.append(kind)
        withUnsafeBytes(of: version.littleEndian) { bytes.append(contentsOf: $0) }
        bytes += name
        return bytes
    }

    init?(_ bytes: [UInt8]) {
        guard bytes.count >= 9 else { return nil }
        let version = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: 1, as: UInt64.self)) }
        let name = Array(bytes[9...])
        switch bytes[0] {
        case 1 where name.count <= HashedKey.maximumLength: self = .key(name, version: version)
        case 2:
            guard let group = String(validating: name, as: UTF8.self), !group.isEmpty else { return nil }
            self = .group(group)
        case 3 where name.isEmpty: self = .everything
        default: return nil
        }
    }

    init(_ key: [UInt8], version: UInt64) { self = .key(key, version: version) }
}

extension RemoteTier {
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
        pending.withLock { pending in
            pending.oweEverything()
            pending.updateHold(oldest: oldest)
            journal(replacingWith: [.everything])
        }
        counters.queuedRemovals.add(1, ordering: .relaxed)
        startReplay()
    }

    /// Records a removal owed (`record` files it under the next sequence number) and journals `entry`,
    /// unless everything is owed already; starts the replay.
    private func owe(_ entry: OwedEntry, _ record: (inout PendingRemovals) -> Void) {
        let oldest = oldestUndelivered()
        pending.withLock { pending in
            guard !pending.all else { return }
            pending.sequence += 1
            record(&pending)
            defer { pending.updateHold(oldest: oldest) }
            if !overflowIfNeeded(&pending), let hooks = journalHooks {
                let appended: Bool
                do { appended = try hooks.append(entry.encoded) } catch {
                    counters.journalFailures.add(1, ordering: .relaxed)
                    appended = true  // kept in memory; the journal may miss it
                }
                if !appended {
                    // No room for another entry: one entry says it all.
                    pending.oweEverything()
                    counters.pendingOverflows.add(1, ordering: .relaxed)
                    journal(replacingWith: [.everything])
                }
            }
        }
        counters.queuedRemovals.add(1, ordering: .relaxed)
        startReplay()
    }

    /// Rewrites the journal (the caller holds `pending`'s lock); a failure is counted.
    func journal(replacingWith entries: [OwedEntry]) {
        guard let journal = journalHooks else { return }
        do {
            if try !journal.replace(entries.map(\.encoded)) {
                // Too many entries for the journal: everything, which always fits.
                _ = try journal.replace([OwedEntry.everything.encoded])
            }
        } catch {
            counters.journalFailures.add(1, ordering: .relaxed)
        }
    }

    /// Takes in the removals a journal left from an earlier run (the cache opened its directory again),
    /// rewrites the journal compacted, and starts their replay.
    func restoreOwed(_ entries: [[UInt8]]) {
        guard !entries.isEmpty else { return }
        pending.withLock { pending in
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
                journal(replacingWith: [.everything])
            } else {
                journal(replacingWith: pending.keys.map { OwedEntry($0.key, version: $0.value.version) } + pending.groups.keys.map { .group($0) })
            }
            counters.restoredRemovals.add(UInt64(pending.all ? 1 : pending.keys.count + pending.groups.count), ordering: .relaxed)
        }
        startReplay()
    }

    /// Owes everything instead when the queue outgrew its bound (journaled); whether it did.
    private func overflowIfNeeded(_ pending: inout PendingRemovals) -> Bool {
        guard pending.keys.count + pending.groups.count > maxPendingRemovals else { return false }
        pending.oweEverything()
        counters.pendingOverflows.add(1, ordering: .relaxed)
        journal(replacingWith: [.everything])
        return true
    }

    /// The start of the oldest write under way, or now: where a removal owed now starts holding back
    /// the watermark (the failed write is still under way when it is owed).
    func oldestUndelivered() -> Int64 {
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
        let owed = pending.withLock { $0.holds ? $0.since : nil } ?? now
        return min(now, underWay, owed)
    }

    /// How many removals are owed (keys and groups; 1 for the whole namespace).
    var owedRemovals: Int {
        pending.withLock { $0.all ? 1 : $0.keys.count + $0.groups.count }
    }

    /// Starts the replay loop unless it runs.
    func startReplay() {
        replay.withLock { task in
            guard task == nil else { return }
            task = Task { [weak self] in await self?.replayOwedRemovals() }
        }
    }

    func stopReplay() {
        replay.withLock { task in
            task?.cancel()
            task = nil
        }
    }

    /// Replays until nothing is owed: looks every 20 ms while the store fails fast (so the replay
    /// follows the store's return closely: until it lands, other instances may read what the store
    /// holds), backs off after a failed attempt (20 ms doubling to 250 ms).
    private func replayOwedRemovals() async {
        var delay = Duration.milliseconds(20)
        while !Task.isCancelled {
            let owed = pending.withLock { pending -> PendingRemovals? in
                if pending.isEmpty {
                    replay.withLock { $0 = nil }
                    return nil
                }
                return pending
            }
            guard let owed else { return }
            if store.failsFast {
                try? await Task.sleep(for: .milliseconds(20))
                continue
            }
            do {
                try await send(owed)
                delay = .milliseconds(20)
            } catch {
                counters.errors.add(1, ordering: .relaxed)
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .milliseconds(250))
            }
        }
    }

    /// Sends what `owed` holds, settling each removal as soon as the store took it, so that one that
    /// fails keeps only itself (and what was not tried yet) owed; throws at the first failed step.
    private func send(_ owed: PendingRemovals) async throws(MagpieError) {
        if owed.all {
            tokens.withLock { $0 = TokenCache() }
            _ = try await store.store(
                RemoteRecord.tokenBytes(RemoteRecord.newToken()), forKey: RemoteKey.namespaceKey, expiresAt: 0, onlyIfAbsent: false)
            settle { pending in
                guard pending.all && pending.allSequence == owed.allSequence else { return 0 }
                pending.all = false
                return 1
            }
            return
        }
        for (group, sequence) in owed.groups {
            tokens.withLock { _ = $0.groups.removeValue(forKey: group) }
            _ = try await store.store(
                RemoteRecord.tokenBytes(RemoteRecord.newToken()), forKey: RemoteKey.group(group), expiresAt: 0, onlyIfAbsent: false)
            settle { pending in
                guard pending.groups[group] == sequence else { return 0 }
                pending.groups[group] = nil
                return 1
            }
        }
        // Each key's tombstone carries its removal's version: a write made since, by anyone, still wins.
        // Up to 256 in flight (each is one round trip of its own; until the last lands, the fleet's
        // delivery watermark waits for this instance), settled 64 at a time as they land, so that a
        // failure keeps owed only what it did not take. Each tombstone is taken (true), refused by the
        // store (false: it answered with an error), or not answered (nil: the store is unreachable, and
        // the rest waits for the next pass).
        let keys = Array(owed.keys)
        var anyRefused = false
        var unanswered = false
        await withTaskGroup(of: (Int, Bool?).self) { group in
            var next = 0
            var landed: [(Int, Bool?)] = []
            func launch() {
                guard next < keys.count else { return }
                let index = next
                let (key, owedKey) = keys[index]
                next += 1
                group.addTask { [self] in
                    do {
                        _ = try await sendTombstone(key, version: owedKey.version)
                        return (index, true)
                    } catch {
                        return (index, (error as? MagpieError)?.code == .remoteRefused ? false : nil)
                    }
                }
            }
            for _ in 0..<min(256, keys.count) { launch() }
            for await outcome in group {
                landed.append(outcome)
                if outcome.1 == nil { unanswered = true }
                if !unanswered { launch() }
                if landed.count >= 64 {
                    anyRefused = settle(landed, of: keys) || anyRefused
                    landed.removeAll(keepingCapacity: true)
                }
            }
            anyRefused = settle(landed, of: keys) || anyRefused
        }
        if unanswered { throw MagpieError(.remoteUnavailable, "an owed removal was not taken") }
        if anyRefused { throw MagpieError(.remoteRefused, "the store refused an owed removal") }
    }

    /// Settles the keys whose tombstones the store took and marks those it refused; whether any was
    /// refused.
    private func settle(_ outcomes: [(Int, Bool?)], of keys: [([UInt8], (sequence: UInt64, version: UInt64))]) -> Bool {
        let refused = outcomes.compactMap { $0.1 == false ? $0.0 : nil }
        if !refused.isEmpty {
            pending.withLock { pending in
                for index in refused where pending.keys[keys[index].0]?.sequence == keys[index].1.sequence {
                    pending.refused.insert(keys[index].0)
                }
            }
        }
        settle { pending in
            var settled = 0
            for (index, taken) in outcomes where taken == true {
                let (key, owedKey) = keys[index]
                if pending.keys[key]?.sequence == owedKey.sequence {
                    pending.keys[key] = nil
                    settled += 1
                }
            }
            return settled
        }
        return !refused.isEmpty
    }

    /// Drops removals the store took from the queue (`drop` returns how many; one that was owed again
    /// since stays), counts them as replayed, and removes the journal once nothing is owed. (Until then
    /// the journal keeps entries already replayed beside the rest: replaying one again after a restart
    /// changes nothing, its version being fenced like any.)
    private func settle(_ drop: (inout PendingRemovals) -> Int) {
        pending.withLock { pending in
            let settled = drop(&pending)
            // Counted under the lock: whoever sees the owed count fall also sees these replays counted.
            counters.replayedRemovals.add(UInt64(settled), ordering: .relaxed)
            if !pending.refused.isEmpty { pending.refused = pending.refused.filter { pending.keys[$0] != nil } }
            pending.updateHold(oldest: clock.now())
            if settled > 0 && pending.isEmpty { journal(replacingWith: []) }
        }
        if owedRemovals == 0 { for waiter in drainWaiters.withLock({ waiters in defer { waiters = [] }; return waiters }) { waiter.finish() } }
    }

    /// Waits until nothing is owed to the store, or `limit` passes (woken by the replay that settles the
    /// last owed removal, no polling); returns what is still owed.
    func waitForReplay(upTo limit: Duration) async -> Int {
        guard owedRemovals > 0 else { return 0 }
        let waiter = Wakeup()
        drainWaiters.withLock { $0.append(waiter) }
        startReplay()
        if owedRemovals == 0 { waiter.finish() }  // settled between the first look and the registration
        await waiter.wait(upTo: limit)
        drainWaiters.withLock { $0.removeAll { $0 === waiter } }
        return owedRemovals
    }
}
