// The one place that knows which tiers a `Cache` has. A cache holds one composition, and each operation
// switches on it once: the local tiers alone (memory + optional disk), or the same local tiers kept
// coherent with a remote tier. Everything below the switch is written once per composition, and every
// read once for both the synchronous and the async API (a `ReadWait` says which), so adding a tier, or a
// policy to one, touches the composer in one place. The memory hit is not in here: `Cache` reads memory
// itself, inlined, so that a hit costs what the memory tier's own read costs (Benchmarks/opcount.sh).

@usableFromInline
enum Composition: Sendable {
    case local(LocalTiers)
    case coherent(CoherentTiers)

    var local: LocalTiers {
        switch self {
        case .local(let local): local
        case .coherent(let coherent): coherent.local
        }
    }

    var coherent: CoherentTiers? {
        if case .coherent(let coherent) = self { return coherent }
        return nil
    }

    // MARK: Reads

    /// `want` of `key`, and the tier that answered, from the synchronous API. `memoryChecked`: memory was
    /// read and found nothing (servable). `unverifiedFallback` (the loader API): with a remote tier, a local
    /// copy past its staleness bound comes marked unverified when the store has nothing.
    func read(_ key: HashedKey, _ want: ReadWant, memoryChecked: Bool = false, unverifiedFallback: Bool = false) throws(MagpieError)
        -> (StoredEntry, CacheHit.Tier)?
    {
        switch self {
        case .local(let local):
            if !memoryChecked, let entry = local.inMemory(key, want) { return (entry, .memory) }
            return try local.onDisk(key, want, wait: .block).waited().map { ($0, .disk) }
        case .coherent(let coherent):
            return try coherent.read(key, want, memoryChecked: memoryChecked, unverifiedFallback: unverifiedFallback)
        }
    }

    /// The plain read's value past the memory probe (a negative entry is no value).
    @usableFromInline
    func valuePastMemory(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        switch self {
        case .local(let local): return try local.valueOnDisk(key)
        case .coherent(let coherent): return try coherent.valuePastMemory(key)
        }
    }

    /// ``read(_:_:memoryChecked:unverifiedFallback:)`` for the async API: memory on the caller's task, disk
    /// there too when the read cannot wait (else on an I/O thread), the store awaited.
    nonisolated(nonsending)
    func read(_ name: [UInt8], hash: UInt64, _ want: ReadWant, memoryChecked: Bool = false, unverifiedFallback: Bool = false)
        async throws -> (StoredEntry, CacheHit.Tier)?
    {
        switch self {
        case .local(let local):
            let runtime = local.runtime
            if !memoryChecked, let entry = try runtime.withKey(name, hash: hash, { key in local.inMemory(key, want) }) {
                return (entry, .memory)
            }
            guard local.disk != nil else { return nil }
            let found = try await local.immediateOrHop(name, hash: hash, inline: runtime.inlineReads) { key, wait throws(MagpieError) in
                try local.onDisk(key, want, wait: wait)
            }
            return found.map { ($0, .disk) }
        case .coherent(let coherent):
            return try await coherent.read(name, hash: hash, want, memoryChecked: memoryChecked, unverifiedFallback: unverifiedFallback)
        }
    }

    /// Whether a read that found nothing in memory reads further (a disk or a remote tier).
    var readsPastMemory: Bool { local.disk != nil || coherent != nil }

    // MARK: Writes

    /// A store's local half (the whole store without a remote tier), and the remote half still to send.
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    {
        switch self {
        case .local(let local):
            guard case .done = try local.write(value, for: key, options: options, stamp: stamp, wait: wait) else { return .wouldBlock }
            return .done(nil)
        case .coherent(let coherent):
            guard case .done(let send) = try coherent.writeLocally(value, for: key, options: options, stamp: stamp, wait: wait) else {
                return .wouldBlock
            }
            return .done(send)
        }
    }

    /// A removal's local half: whether either local tier held the key, and the remote half still to send.
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?) {
        switch self {
        case .local(let local): return (try local.remove(key), nil)
        case .coherent(let coherent): return try coherent.removeLocally(key)
        }
    }

    /// Sends a write's remote half (the async API: awaited, no thread blocked).
    nonisolated(nonsending)
    func send(_ write: RemoteSend?) async {
        if let write, let coherent { await coherent.send(write) }
    }

    /// Sends a write's remote half from the synchronous API (blocks until the store answered).
    func sendWaiting(_ write: RemoteSend?) {
        if let write, let coherent { coherent.sendWaiting(write) }
    }

    /// Removes everything: the local tiers, then the store's namespace (synchronous API).
    func removeAll() throws(MagpieError) {
        try local.removeAll()
        coherent?.removeAllRemotely()
    }

    nonisolated(nonsending)
    func removeAllAsync() async throws {
        let local = local
        try await local.offload { () throws(MagpieError) in try local.removeAll() }
        await coherent?.removeAllRemotelyAsync()
    }

    /// Removes a group: the local tiers, then the group's token in the store (synchronous API).
    func removeAll(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        let removed = try local.removeAll(inGroup: group)
        coherent?.removeGroupRemotely(group)
        return removed
    }

    nonisolated(nonsending)
    func removeAllAsync(inGroup group: String) async throws -> RemovedEntries {
        let local = local
        let removed = try await local.offload { () throws(MagpieError) -> RemovedEntries in try local.removeAll(inGroup: group) }
        if let remote = coherent?.remote { await remote.removeGroup(group) }
        return removed
    }

    // MARK: Loads

    /// Whether a loader call may judge a memory entry by itself before the full protocol: not with a
    /// remote tier, whose local copies are judged by their coherence stamps there.
    @usableFromInline
    var judgesMemoryFirst: Bool { coherent == nil }

    /// Whether memory holds a value of the key that `call` would serve without a load (fresh).
    func servableInMemory(_ call: LoaderCall, now: @autoclosure () -> Int64) -> Bool {
        if let coherent { return coherent.servableInMemory(call) }
        return call.name.withUnsafeBytes { bytes in
            guard let freshness = local.memory.metadata(HashedKey(bytes, hash: call.hash))?.freshness else { return false }
            guard call.acceptsAbsence || !freshness.negative else { return false }
            return freshness.freshUntil == 0 || freshness.isFresh(at: now())
        }
    }

    /// The version a load that starts now gives its value (with a remote tier; 0 without one).
    func loadVersion() -> UInt64 {
        coherent?.remote.versions.next() ?? 0
    }

    /// Takes the fleet's lease of `call`'s key (or gets the value another instance's load stored);
    /// without a remote tier this instance just loads.
    nonisolated(nonsending)
    func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome {
        guard let coherent else { return .load(token: nil) }
        return await coherent.leaseOrShared(call)
    }

    /// ``acquireLoad(_:)`` from a loader thread (the synchronous loader API).
    func acquireLoadWaiting(_ call: LoaderCall) -> LeaseOutcome {
        coherent?.leaseOrSharedWaiting(call) ?? .load(token: nil)
    }

    /// Releases the lease `lease` holds, if any, once the load landed.
    nonisolated(nonsending)
    func finishLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async {
        if case .load(let token?) = lease, let coherent { await coherent.releaseLease(call, token: token) }
    }

    func finishLoadWaiting(_ call: LoaderCall, _ lease: LeaseOutcome) {
        coherent?.releaseLeaseWaiting(call, lease)
    }

    // MARK: Life cycle

    /// Starts what runs in the background: the disk buffers' writer, and the remote tier's feed and replay.
    func start(writingBuffersEvery interval: Duration?) {
        if let interval { local.startWritingBuffers(every: interval) }
        coherent?.start()
    }

    /// At `close()`: the remote tier stops (its store's connections close in the background unless the
    /// caller closes them), then the local tiers close.
    func close(closingStore: Bool) throws(MagpieError) {
        coherent?.stop(closingStore: closingStore)
        try local.close()
    }

    /// A cache dropped (its `deinit`): the remote tier's threads and tasks end.
    func drop(closed: Bool) {
        coherent?.drop(closed: closed)
    }

    /// `shutdown`'s first step: the removals owed to the remote store, waited for up to `replayTime`.
    nonisolated(nonsending)
    func replayBeforeShutdown(upTo replayTime: Duration) async {
        await coherent?.replayBeforeShutdown(upTo: replayTime)
    }

    /// `shutdown`'s last step: the remote store's connections, closed and awaited.
    nonisolated(nonsending)
    func closeStore() async {
        if let store = coherent?.remote.store { await store.shutdown() }
    }

    var remoteStatistics: RemoteTierStatistics? { coherent?.remote.statistics }
}
