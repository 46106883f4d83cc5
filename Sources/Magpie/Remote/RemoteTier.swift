import Synchronization

import Synchronization

/// What a cache with a remote tier knows about it: the store, the coherence state, and the tier's parts:
/// the tokens records are checked against (``RemoteTokens``), the removals owed to the store
/// (``OwedRemovals``, with their journal and replay) and the counters (``RemoteCounters``).
final class RemoteTier: Sendable {
    let store: any RemoteStore
    let coherence: Coherence
    let clock: CacheClock
    /// The versions of this cache's writes (the fences the store compares).
    let versions: HybridClock
    /// Where the synchronous API waits for the store.
    let bridge = RemoteBridge()
    let counters = RemoteCounters()
    let tokens: RemoteTokens
    let owed: OwedRemovals
    /// Writes running in the background past their wait.
    let backgroundWrites = Atomic<Int>(0)
    /// This instance's tag in the records it writes (random, never 0): a fetched record that carries it is
    /// this instance's own write, read back from the store (counted: its local copy had gone).
    let originTag = UInt16.random(in: 1...UInt16.max)
    let settings: Settings

    /// What the tier was configured with (``RemoteTierOptions``), normalised.
    struct Settings: Sendable {
        /// The load lease's lifetime in ms (nil: no single flight across instances).
        let leaseTime: Int64?
        /// ``RemoteTierOptions/writeWait``.
        let writeWait: Duration?
        /// ``RemoteTierOptions/pushedValueLimit``.
        let pushLimit: Int
        /// How long a removal's tombstone lives in the store (ms); a versioned write is refused by the
        /// store past half of it after it was sent.
        let tombstoneLifetime: Int64
        let onInvalidation: (@Sendable ([UInt8]) -> Void)?
    }

    var leaseTime: Int64? { settings.leaseTime }
    var writeWait: Duration? { settings.writeWait }
    var onInvalidation: (@Sendable ([UInt8]) -> Void)? { settings.onInvalidation }

    init(_ options: RemoteTierOptions, clock: CacheClock, journal: OwedJournal?) {
        store = options.store
        coherence = Coherence(bound: options.maxDisconnectedStaleness)
        self.clock = clock
        versions = HybridClock(clock: clock)
        settings = Settings(
            leaseTime: options.loadLease.map { max(1, $0.wholeMilliseconds) }, writeWait: options.writeWait,
            pushLimit: max(0, options.pushedValueLimit), tombstoneLifetime: max(2, options.tombstoneLifetime.wholeMilliseconds),
            onInvalidation: options.onInvalidation)
        tokens = RemoteTokens(store: store, coherence: coherence, clock: clock)
        owed = OwedRemovals(
            store: store, tokens: tokens, counters: counters, coherence: coherence, clock: clock, journal: journal,
            maxPendingRemovals: max(0, options.maxPendingRemovals), tombstoneLifetime: settings.tombstoneLifetime)
    }

    /// Runs a call to the store on the store's executor (``RemoteStore/onExecutor(_:)``).
    @inline(__always) nonisolated(nonsending)
    func onStore<R: Sendable>(_ body: () async throws(MagpieError) -> R) async throws(MagpieError) -> R {
        try await store.onExecutor(body)
    }

    /// The synchronous form of a remote operation (a `…Blocking` method): `operation` runs on the bridge
    /// while the caller blocks (``RemoteBridge/wait(_:_:)``), the one place the synchronous API waits.
    func blocking<R: Sendable>(_ operation: @escaping @Sendable () async throws(MagpieError) -> R) throws(MagpieError) -> R {
        try bridge.wait(store, operation)
    }

    /// The store's partition of a user key's record.
    func partition(of key: [UInt8]) -> Int {
        min(max(0, store.partition(of: [RemoteKey.record] + key)), RemoteChanges.maximumPartitions - 1)
    }

    // MARK: Reads

    /// The current record of `key` (a user key), or nil: absent, outdated (its namespace or group was
    /// removed, or it expired), owed a removal, corrupt or foreign (counted), or the store failed
    /// (counted).
    func fetch(_ key: [UInt8]) async -> RemoteRecord? {
        if owed.owes(key: key) {
            counters.misses.add(1, ordering: .relaxed)
            return nil
        }
        let recordKey = [RemoteKey.record] + key
        let generation = coherence.tokenGeneration.load(ordering: .acquiring)
        // Read before the round trip: what the store holds now includes every write that returned
        // before this watermark.
        let watermark = coherence.delivered.load(ordering: .acquiring)
        let started = clock.now()
        let cachedNamespace = tokens.cached(group: nil, now: started)
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
                if namespace != 0 { tokens.remember(namespace, group: nil, stamp: started, generation: generation) }
            }
            guard let bytes = values[0] else {
                counters.misses.add(1, ordering: .relaxed)
                return nil
            }
            return try await current(bytes, recordKey: recordKey, namespace: namespace, watermark: watermark)
        } catch {
            counters.errors.add(1, ordering: .relaxed)
            return nil
        }
    }

    /// What ``fetchOrLease(_:token:expiresAt:)`` found.
    enum LeaseRead: Sendable {
        /// The key's current record (no lease asked for).
        case record(RemoteRecord)
        /// No record the cache may serve; whether the lease was taken.
        case leased(Bool)
    }

    /// The key's current record, or, when the store holds none, its load lease taken with `token` until
    /// `expiresAt`: one round trip where the store can (``RemoteStore/valueOrLease(forKey:lease:token:expiresAt:)``).
    /// A value the cache may not serve (outdated, withheld, corrupt) is no record: the lease is then asked
    /// for apart. Counted as ``fetch(_:)`` counts.
    func fetchOrLease(_ key: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError) -> LeaseRead {
        let leaseKey = [RemoteKey.lease] + key
        if owed.owes(key: key) {
            counters.misses.add(1, ordering: .relaxed)
            return .leased(try await takeLease(key, token: token, expiresAt: expiresAt))
        }
        let recordKey = [RemoteKey.record] + key
        let watermark = coherence.delivered.load(ordering: .acquiring)  // as fetch reads it
        let read = try await onStore { [store] () async throws(MagpieError) in
            try await store.valueOrLease(forKey: recordKey, lease: leaseKey, token: token, expiresAt: expiresAt)
        }
        guard let bytes = read.value else {
            counters.misses.add(1, ordering: .relaxed)
            return .leased(read.leased)
        }
        let namespace = try await tokens.token(group: nil, create: false)
        if let record = try await current(bytes, recordKey: recordKey, namespace: namespace, watermark: watermark) { return .record(record) }
        return .leased(try await takeLease(key, token: token, expiresAt: expiresAt))
    }

    /// Takes the load lease of `key` (a user key) with `token` until `expiresAt` where none is held;
    /// whether it took it.
    func takeLease(_ key: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError) -> Bool {
        let leaseKey = [RemoteKey.lease] + key
        return try await onStore { [store] () async throws(MagpieError) in
            try await store.store(token, forKey: leaseKey, expiresAt: expiresAt, onlyIfAbsent: true)
        }
    }

    /// The record in `bytes` (read under `recordKey` with the namespace's token `namespace`, the delivery
    /// watermark read before the round trip) when it may be served: nil for a tombstone, a corrupt,
    /// outdated or expired record, or one withheld while writes may not have reached the store; counted.
    private func current(_ bytes: [UInt8], recordKey: [UInt8], namespace: UInt64, watermark: Int64) async throws(MagpieError)
        -> RemoteRecord?
    {
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
            if owed.owes(group: group) {
                current = false
            } else {
                current = try await tokens.token(group: group, create: false) == record.groupToken
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
    }

    // MARK: Writes

    /// Stores `record` (its version given) for `key` (a user key), with the current tokens, unless the
    /// store holds a newer version (counted in `fenced`). A failure is counted and owes the key a
    /// removal: the store may still hold an older value, or take this one late, and neither may be
    /// served once it is back.
    /// Returns false when the store refused the record because it holds a newer version of the key
    /// (the caller's local copy is then older than the store's value, and must go).
    ///
    /// - Parameter lease: a load lease token this instance holds for the key: released with the write
    ///   (``RemoteStore/storeIfNewer(_:forKey:expiresAt:notAfter:pushing:releasing:token:)``, one round trip
    ///   where the store can), or after it when the write went otherwise or failed.
    @discardableResult
    func write(_ record: RemoteRecord, forKey key: [UInt8], releasing lease: [UInt8]? = nil) async -> Bool {
        var record = record
        record.origin = originTag
        if record.expiresAt != 0 && record.expiresAt <= clock.now() {
            // Expired already: an expiry in the past removes the key (the store's older value too).
            await remove(key, version: record.version)
            if let lease { await releaseLease(key, token: lease) }
            return true
        }
        do {
            record.namespaceToken = try await tokens.token(group: nil, create: true)
            if let group = record.group { record.groupToken = try await tokens.token(group: group, create: true) }
            let recordKey = [RemoteKey.record] + key
            let (encoded, expiresAt, deadline, pushing) = (record.encoded(key: recordKey), record.expiresAt, notAfter(), record.value.count <= settings.pushLimit)
            let stored = try await onStore { [store] () async throws(MagpieError) in
                if let lease {
                    try await store.storeIfNewer(
                        encoded, forKey: recordKey, expiresAt: expiresAt, notAfter: deadline, pushing: pushing,
                        releasing: [RemoteKey.lease] + key, token: lease)
                } else {
                    try await store.storeIfNewer(encoded, forKey: recordKey, expiresAt: expiresAt, notAfter: deadline, pushing: pushing)
                }
            }
            if stored {
                counters.stores.add(1, ordering: .relaxed)
            } else {
                counters.fenced.add(1, ordering: .relaxed)
                return false
            }
        } catch {
            if counters.failed(error) {
                await replaceRefused(key)
            } else {
                owed.owe(key: key, version: versions.next())
            }
            // After a failed write its release is this instance's (RemoteStore.storeIfNewer(…releasing:token:)):
            // sent apart (a release that finds another token, or none, changes nothing).
            if let lease { await releaseLease(key, token: lease) }
        }
        return true
    }

    /// Releases the load lease of `key` (a user key) this instance holds with `token`: removed only while
    /// the store still holds that token (a holder whose lease expired cannot release its successor's). A
    /// failure is counted; the lease then expires on its own.
    func releaseLease(_ key: [UInt8], token: [UInt8]) async {
        let leaseKey = [RemoteKey.lease] + key
        do {
            _ = try await onStore { [store] () async throws(MagpieError) in try await store.remove(leaseKey, ifValue: token) }
        } catch {
            counters.failed(error)
        }
    }

    /// A write of `key` the store refused for lack of memory: the key's tombstone at once, over the older
    /// value the store may hold, so that its change message drops every other instance's copy now and
    /// the store serves nothing stale. A tombstone takes less memory than the value it replaces, and a
    /// store that is full takes it (MagpieRedis on Redis 7 and later: its removals run `allow-oom`), so
    /// nothing is owed: an owed removal would hold the fleet's delivery watermark back (every instance's
    /// reads withheld past the bound) and, replayed into the same refusal, repeat the refused command
    /// without end. Owed only when the tombstone fails too (a server before Redis 7, or down): the replay
    /// is paced then (OwedRemovals+Replay.swift).
    private func replaceRefused(_ key: [UInt8]) async {
        let version = versions.next()
        do {
            if try await store.storeTombstone(key, version: version, now: clock.now(), lifetime: settings.tombstoneLifetime) {
                counters.removals.add(1, ordering: .relaxed)
            } else {
                counters.fenced.add(1, ordering: .relaxed)  // a newer write holds the key: nothing older stays
            }
        } catch {
            counters.failed(error)
            owed.owe(key: key, version: version)
        }
    }

    /// Removes `key` (a user key) from the store as of `version`: a tombstone that refuses every older
    /// write for ``RemoteTierOptions/tombstoneLifetime``; or owes the removal.
    func remove(_ key: [UInt8], version: UInt64) async {
        do {
            if try await store.storeTombstone(key, version: version, now: clock.now(), lifetime: settings.tombstoneLifetime) {
                counters.removals.add(1, ordering: .relaxed)
            } else {
                counters.fenced.add(1, ordering: .relaxed)
            }
        } catch {
            counters.failed(error)
            owed.owe(key: key, version: version)
        }
    }

    /// The deadline of a versioned write sent now: half the tombstones' lifetime away.
    private func notAfter() -> Int64 { clock.now().saturatingAdd(settings.tombstoneLifetime / 2) }

    /// Replaces the group's token (every record of the group is then outdated), or owes it.
    func removeGroup(_ group: String) async {
        tokens.drop(group: group)
        do {
            try await onStore { [store] () async throws(MagpieError) in try await store.replaceToken(group: group) }
            counters.removals.add(1, ordering: .relaxed)
        } catch {
            counters.failed(error)
            owed.owe(group: group)
        }
    }

    /// Replaces the namespace's token (every record is then outdated), or owes it.
    func removeAll() async {
        tokens.drop(group: nil)
        do {
            try await onStore { [store] () async throws(MagpieError) in try await store.replaceToken(group: nil) }
            counters.removals.add(1, ordering: .relaxed)
        } catch {
            counters.failed(error)
            owed.oweEverything()
        }
    }
}
