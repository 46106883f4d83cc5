import Synchronization

/// What a cache with a remote tier knows about it: the store, the coherence state, the tokens it
/// checks records against, and the removals it owes the store.
final class RemoteTier: Sendable {
    let store: any RemoteStore
    let coherence: Coherence
    let maxPendingRemovals: Int
    /// The load lease's lifetime in ms (nil: no fleet-wide single flight).
    let leaseTime: Int64?
    let onInvalidation: (@Sendable ([UInt8]) -> Void)?
    let clock: CacheClock
    /// The versions of this cache's writes (the fences the store compares).
    let versions: HybridClock
    /// This instance's tag in the records it writes (random, never 0): a fetched record that carries it is
    /// this instance's own write, read back from the store (counted: its local copy had gone).
    let originTag = UInt16.random(in: 1...UInt16.max)
    /// ``RemoteTierOptions/pushedValueLimit``.
    let pushLimit: Int
    /// How long a removal's tombstone lives in the store (ms); a versioned write is refused by the store
    /// past half of it after it was sent.
    let tombstoneLifetime: Int64
    /// Where the synchronous API waits for the store.
    let bridge = RemoteBridge()
    /// ``RemoteTierOptions/writeWait``.
    let writeWait: Duration?
    /// Writes running in the background past their wait.
    let backgroundWrites = Atomic<Int>(0)
    /// Where owed removals are journaled (a cache with a disk tier), else nil.
    let journalHooks: OwedJournal?
    let tokens = Locked(TokenCache())
    /// The tokens this instance created where there was none (``knowsToken(_:group:now:)``), oldest first.
    private let created = Locked<[UInt64]>([])
    let pending = Locked(PendingRemovals())
    let replay = Locked<Task<Void, Never>?>(nil)
    /// Tasks waiting for every owed removal to land (``waitForReplay(upTo:)``).
    let drainWaiters = Locked<[Wakeup]>([])
    let counters = Counters()

    final class Counters: Sendable {
        let hits = Atomic<UInt64>(0)
        let misses = Atomic<UInt64>(0)
        let errors = Atomic<UInt64>(0)
        let corrupt = Atomic<UInt64>(0)
        let outdated = Atomic<UInt64>(0)
        let stores = Atomic<UInt64>(0)
        let removals = Atomic<UInt64>(0)
        let queuedRemovals = Atomic<UInt64>(0)
        let replayedRemovals = Atomic<UInt64>(0)
        let pendingOverflows = Atomic<UInt64>(0)
        let leasesAcquired = Atomic<UInt64>(0)
        let leaseWaits = Atomic<UInt64>(0)
        let sharedLoads = Atomic<UInt64>(0)
        let fenced = Atomic<UInt64>(0)
        let restoredRemovals = Atomic<UInt64>(0)
        let journalFailures = Atomic<UInt64>(0)
        let withheld = Atomic<UInt64>(0)
        let unkept = Atomic<UInt64>(0)
        let ownWritesFetched = Atomic<UInt64>(0)
        let pushesApplied = Atomic<UInt64>(0)
        let copiesDropped = Atomic<UInt64>(0)
        let ownMessages = Atomic<UInt64>(0)
        let staleMessages = Atomic<UInt64>(0)
        let unserved = Atomic<UInt64>(0)
        let readHits = Atomic<UInt64>(0)
        let readMisses = Atomic<UInt64>(0)
    }

    struct TokenCache {
        var namespace: (token: UInt64, stamp: Int64)? = nil
        var groups: [String: (token: UInt64, stamp: Int64)] = [:]
    }

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

    init(_ options: RemoteTierOptions, clock: CacheClock, journal: OwedJournal?) {
        journalHooks = journal
        writeWait = options.writeWait
        store = options.store
        coherence = Coherence(bound: options.maxDisconnectedStaleness)
        maxPendingRemovals = max(0, options.maxPendingRemovals)
        leaseTime = options.loadLease.map { max(1, $0.wholeMilliseconds) }
        onInvalidation = options.onInvalidation
        self.clock = clock
        versions = HybridClock(clock: clock)
        tombstoneLifetime = max(2, options.tombstoneLifetime.wholeMilliseconds)
        pushLimit = max(0, options.pushedValueLimit)
    }

    /// Runs a call to the store on the store's executor (``RemoteStore/taskExecutor``): an async caller
    /// pays one hop there and one back, and the store's thread does the I/O and nothing else (encoding and
    /// checking records stays on the caller's).
    nonisolated(nonsending)
    func onStore<R: Sendable>(_ body: () async throws(MagpieError) -> R) async throws(MagpieError) -> R {
        try await withTaskExecutorPreference(store.taskExecutor) { () async throws(MagpieError) -> R in try await body() }
    }

    /// The store's partition of a user key's record.
    func partition(of key: [UInt8]) -> Int {
        min(max(0, store.partition(of: [RemoteKey.record] + key)), RemoteChanges.maximumPartitions - 1)
    }

    /// Whether a pushed record is current by the tokens cached now (its namespace's, its group's); false
    /// when a token is not cached (the copy is then dropped, not replaced).
    func tokensCurrent(_ record: RemoteRecord, now: Int64) -> Bool {
        guard let namespace = cachedToken(group: nil, now: now), namespace == record.namespaceToken else { return false }
        guard let group = record.group else { return true }
        return cachedToken(group: group, now: now) == record.groupToken
    }

    // MARK: Reads

    /// The current record of `key` (a user key), or nil: absent, outdated (its namespace or group was
    /// removed, or it expired), owed a removal, corrupt or foreign (counted), or the store failed
    /// (counted).
    func fetch(_ key: [UInt8]) async -> RemoteRecord? {
        let owed = pending.withLock { $0.all || $0.keys[key] != nil }
        if owed {
            counters.misses.add(1, ordering: .relaxed)
            return nil
        }
        let recordKey = [RemoteKey.record] + key
        let generation = coherence.tokenGeneration.load(ordering: .acquiring)
        // Read before the round trip: what the store holds now includes every write that returned
        // before this watermark.
        let watermark = coherence.delivered.load(ordering: .acquiring)
        let started = clock.now()
        let cachedNamespace = cachedToken(group: nil, now: started)
        do {
            let keys = cachedNamespace == nil ? [recordKey, RemoteKey.namespaceKey] : [recordKey]
            let values = try await onStore { [store] () async throws(MagpieError) in try await store.values(forKeys: keys) }
            guard values.count == (cachedNamespace == nil ? 2 : 1) else {
                counters.errors.add(1, ordering: .relaxed)
                return nil
            }
            let namespace: UInt64
            if let cachedNamespace {
                namespace = cachedNamespace
            } else {
                namespace = RemoteRecord.token(values[1])
                if namespace != 0 { remember(namespace, group: nil, stamp: started, generation: generation) }
            }
            guard let bytes = values[0] else {
                counters.misses.add(1, ordering: .relaxed)
                return nil
            }
            let record: RemoteRecord
            switch RemoteRecord.decode(bytes, key: recordKey) {
            case .record(let found):
                versions.observe(found.version)
                record = found
                if found.origin == originTag { counters.ownWritesFetched.add(1, ordering: .relaxed) }
            case .tombstone(let version):
                versions.observe(version)
                counters.misses.add(1, ordering: .relaxed)
                return nil
            case nil:
                counters.corrupt.add(1, ordering: .relaxed)
                return nil
            }
            var current = namespace != 0 && record.namespaceToken == namespace
            if current, let group = record.group {
                let owedGroup = pending.withLock { $0.groups[group] != nil }
                if owedGroup {
                    current = false
                } else {
                    current = try await token(group: group, create: false) == record.groupToken
                }
            }
            let now = clock.now()
            if current && record.expiresAt != 0 && record.expiresAt <= now { current = false }
            guard current else {
                counters.outdated.add(1, ordering: .relaxed)
                return nil
            }
            guard coherence.deliveredRecently(watermark, now: now) else {
                // An instance may have returned a write of this key that has not reached the store yet
                // (the store was unreachable for it): a miss, not a value that may be stale past the bound.
                counters.withheld.add(1, ordering: .relaxed)
                return nil
            }
            counters.hits.add(1, ordering: .relaxed)
            return record
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            return nil
        }
    }

    // MARK: Writes

    /// Stores `record` (its version given) for `key` (a user key), with the current tokens, unless the
    /// store holds a newer version (counted in `fenced`). A failure is counted and owes the key a
    /// removal: the store may still hold an older value, or take this one late, and neither may be
    /// served once it is back.
    /// Returns false when the store refused the record because it holds a newer version of the key
    /// (the caller's local copy is then older than the store's value, and must go).
    @discardableResult
    func write(_ record: RemoteRecord, forKey key: [UInt8]) async -> Bool {
        var record = record
        record.origin = originTag
        if record.expiresAt != 0 && record.expiresAt <= clock.now() {
            // Expired already: an expiry in the past removes the key (the store's older value too).
            await remove(key, version: record.version)
            return true
        }
        do {
            record.namespaceToken = try await token(group: nil, create: true)
            if let group = record.group { record.groupToken = try await token(group: group, create: true) }
            let recordKey = [RemoteKey.record] + key
            let (encoded, expiresAt, deadline, pushing) = (record.encoded(key: recordKey), record.expiresAt, notAfter(), record.value.count <= pushLimit)
            let stored = try await onStore { [store] () async throws(MagpieError) in
                try await store.storeIfNewer(encoded, forKey: recordKey, expiresAt: expiresAt, notAfter: deadline, pushing: pushing)
            }
            if stored {
                counters.stores.add(1, ordering: .relaxed)
            } else {
                counters.fenced.add(1, ordering: .relaxed)
                return false
            }
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            owe(key: key, version: versions.next())
        }
        return true
    }

    /// Removes `key` (a user key) from the store as of `version`: a tombstone that refuses every older
    /// write for ``RemoteTierOptions/tombstoneLifetime``; or owes the removal.
    func remove(_ key: [UInt8], version: UInt64) async {
        do {
            if try await sendTombstone(key, version: version) {
                counters.removals.add(1, ordering: .relaxed)
            } else {
                counters.fenced.add(1, ordering: .relaxed)
            }
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            owe(key: key, version: version)
        }
    }

    /// Writes `key`'s tombstone of `version`; whether the store took it (false: it holds a newer write).
    func sendTombstone(_ key: [UInt8], version: UInt64) async throws(MagpieError) -> Bool {
        let recordKey = [RemoteKey.record] + key
        let now = clock.now()
        let (expiresAt, deadline) = (now.saturatingAdd(tombstoneLifetime), now.saturatingAdd(tombstoneLifetime / 2))
        return try await onStore { [store] () async throws(MagpieError) in
            try await store.storeIfNewer(RemoteRecord.tombstone(version: version), forKey: recordKey, expiresAt: expiresAt, notAfter: deadline)
        }
    }

    /// The deadline of a versioned write sent now: half the tombstones' lifetime away.
    private func notAfter() -> Int64 { clock.now().saturatingAdd(tombstoneLifetime / 2) }

    /// Replaces the group's token (every record of the group is then outdated), or owes it.
    func removeGroup(_ group: String) async {
        tokens.withLock { _ = $0.groups.removeValue(forKey: group) }
        do {
            _ = try await onStore { [store] () async throws(MagpieError) in
                try await store.store(
                    RemoteRecord.tokenBytes(RemoteRecord.newToken()), forKey: RemoteKey.group(group), expiresAt: 0, onlyIfAbsent: false)
            }
            counters.removals.add(1, ordering: .relaxed)
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            owe(group: group)
        }
    }

    /// Replaces the namespace's token (every record is then outdated), or owes it.
    func removeAll() async {
        tokens.withLock { $0 = TokenCache() }
        do {
            _ = try await onStore { [store] () async throws(MagpieError) in
                try await store.store(
                    RemoteRecord.tokenBytes(RemoteRecord.newToken()), forKey: RemoteKey.namespaceKey, expiresAt: 0, onlyIfAbsent: false)
            }
            counters.removals.add(1, ordering: .relaxed)
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            oweEverything()
        }
    }

    // MARK: Tokens

    /// Whether a report that the token key of `group` (nil: the namespace's) now holds `token` is no
    /// change to this instance: the token it holds already, or one it created (the last 64; with foreign
    /// writes reported, the echo of a creation may come before the creator cached the token).
    func knowsToken(_ token: UInt64, group: String?, now: Int64) -> Bool {
        token != 0 && (token == cachedToken(group: group, now: now) || created.withLock { $0.contains(token) })
    }

    /// `token` is about to be stored by this instance where there was none.
    func noteCreated(_ token: UInt64) {
        created.withLock { created in
            if created.count >= 64 { created.removeFirst() }
            created.append(token)
        }
    }

    func cachedToken(group: String?, now: Int64) -> UInt64? {
        let cached = tokens.withLock { tokens in group.map { tokens.groups[$0] } ?? tokens.namespace }
        guard let cached, coherence.servable(stamp: cached.stamp, now: now) else { return nil }
        return cached.token
    }

    private func remember(_ token: UInt64, group: String?, stamp: Int64, generation: UInt64) {
        // Stamped as a local copy of its key is (Coherence.swift): a lost message of its partition drops it.
        let stamp = Coherence.stamp(at: stamp, partition: store.partition(of: group.map { RemoteKey.group($0) } ?? RemoteKey.namespaceKey))
        tokens.withLock { tokens in
            // A token invalidated while it was being read is not kept (it may be the old one).
            guard coherence.tokenGeneration.load(ordering: .acquiring) == generation else { return }
            if let group {
                if tokens.groups.count >= 10_000 { tokens.groups.removeAll() }
                tokens.groups[group] = (token, stamp)
            } else {
                tokens.namespace = (token, stamp)
            }
        }
    }

    /// The token of `group` (nil: the namespace's); with `create`, one is stored when there is none (so
    /// every record carries a token that is never 0). Throws the store's errors.
    func token(group: String?, create: Bool) async throws(MagpieError) -> UInt64 {
        let started = clock.now()
        if let cached = cachedToken(group: group, now: started) { return cached }
        let generation = coherence.tokenGeneration.load(ordering: .acquiring)
        let key = group.map { RemoteKey.group($0) } ?? RemoteKey.namespaceKey
        for _ in 0..<3 {
            var token = RemoteRecord.token(try await onStore { [store] () async throws(MagpieError) in try await store.values(forKeys: [key]) }.first ?? nil)
            if token == 0 && create {
                let fresh = RemoteRecord.newToken()
                noteCreated(fresh)
                let created = try await onStore { [store] () async throws(MagpieError) in
                    try await store.store(RemoteRecord.tokenBytes(fresh), forKey: key, expiresAt: 0, onlyIfAbsent: true)
                }
                if created {
                    token = fresh
                } else {
                    continue  // another writer created it: read theirs
                }
            }
            if token != 0 { remember(token, group: group, stamp: started, generation: generation) }
            return token
        }
        throw MagpieError(.remoteUnavailable, "the token of \(group.map { "group \($0)" } ?? "the namespace") keeps changing")
    }

    /// Forgets cached tokens after "g" + group or "a" changed.
    func forgetToken(group: String?) {
        coherence.tokenGeneration.add(1, ordering: .acquiringAndReleasing)
        tokens.withLock { tokens in
            if let group { tokens.groups[group] = nil } else { tokens = TokenCache() }
        }
    }
}
