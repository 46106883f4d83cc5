// The one read chain of a cache, over tiers that answer the same questions. A read walks memory, then
// the storage tier behind it (the disk tier, or one that holds nothing: StorageTier.swift), then a miss
// source; a write changes the local tiers, then sends its remote half. What a remote tier adds is a
// policy of that chain, `CoherencePolicy`: whether a local copy may be served, where a local miss is
// fetched from and kept, what a write sends, and how a load takes the fleet's lease. A cache without a
// remote tier has `LocalOnly`, which serves every copy and fetches nothing; the chain never asks which
// tiers exist.
//
// Every operation is written once. A remote half is async; the synchronous API waits for it through the
// policy's one bridge (`blocking`), and its names end in `Blocking`. The memory hit is not in here:
// `Cache` reads memory itself, inlined, so that a hit costs what the memory tier's own read costs
// (Benchmarks/opcount.sh); `judgesCopies` is kept beside the policy so that the hit reads a stored Bool,
// not a protocol witness.

/// What a remote tier adds to the read chain, and what the chain asks of it (``LocalOnly`` without one).
protocol CoherencePolicy: AnyObject, Sendable {
    /// Whether local copies are judged by their coherence stamps (reads then read the stamps, and only
    /// a servable copy answers); false: every local copy is served.
    var judgesCopies: Bool { get }
    /// Whether a local copy stamped `stamp` may be served at `now`.
    func servable(stamp: Int64, now: Int64) -> Bool
    /// Counts a local copy that was found but may not be served.
    func noteUnserved()
    /// Whether a load of the key with this hash asks the store for its value together with its lease (one
    /// round trip, in the load) instead of reading it first: a change message said lately that the store
    /// holds a removal's tombstone for it.
    func readsWithLease(_ hash: UInt64) -> Bool
    /// The miss source: the current record of a key no local copy answered, kept locally when it may be;
    /// nil on a miss or a failure (counted, never thrown).
    nonisolated(nonsending)
    func fetch(_ name: [UInt8], hash: UInt64) async -> StoredEntry?
    /// A store's local half (see ``Composition/writeLocally(_:for:options:stamp:wait:)``).
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    /// A removal's local half: whether a local tier held the key, and the remote half.
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?)
    /// Sends a write's remote half. A failure is counted and owed, never thrown.
    nonisolated(nonsending)
    func send(_ write: RemoteSend) async
    /// The remote half of a write the synchronous API could not wait for (on the store's own thread).
    func owe(_ write: RemoteSend)
    /// A group removal the synchronous API could not wait for.
    func owe(group: String)
    /// Outdates every remote record (after the local tiers were emptied).
    nonisolated(nonsending)
    func removeAll() async
    /// Outdates every remote record of `group`.
    nonisolated(nonsending)
    func removeGroup(_ group: String) async
    /// Whether memory holds a copy of the key that `call` would serve without a load (fresh).
    func servableInMemory(_ call: LoaderCall, now: Int64) -> Bool
    /// The version a load that starts now gives its value (0 without a remote tier).
    func loadVersion() -> UInt64
    /// Takes the fleet's lease of `call`'s key, or gets the value another instance's load stored.
    nonisolated(nonsending)
    func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome
    /// Releases the lease `lease` holds, if any, once the load landed.
    nonisolated(nonsending)
    func releaseLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async
    /// A landed load's remote half, then its lease released (together where the store can).
    nonisolated(nonsending)
    func sendLanding(_ write: RemoteSend?, _ call: LoaderCall, _ lease: LeaseOutcome) async
    /// Runs `body` to its end from a thread that may block (the synchronous API), through the remote
    /// tier's one bridge; `fallback` where it cannot wait (counted).
    func blocking<R: Sendable>(_ operation: String, fallback: R, _ body: @escaping @Sendable () async -> R) -> R
    func start()
    func stop(closingStore: Bool)
    func drop(closed: Bool)
    nonisolated(nonsending)
    func replayBeforeShutdown(upTo replayTime: Duration) async
    nonisolated(nonsending)
    func closeStore() async
    var statistics: RemoteTierStatistics? { get }
}

/// The policy of a cache without a remote tier: every local copy is served, a local miss is a miss, a
/// write has no remote half, a load takes no lease.
final class LocalOnly: CoherencePolicy {
    let local: LocalTiers

    init(_ local: LocalTiers) { self.local = local }

    var judgesCopies: Bool { false }
    func servable(stamp: Int64, now: Int64) -> Bool { true }
    func noteUnserved() {}
    func readsWithLease(_ hash: UInt64) -> Bool { false }
    nonisolated(nonsending) func fetch(_ name: [UInt8], hash: UInt64) async -> StoredEntry? { nil }
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    {
        guard case .done = try local.write(value, for: key, options: options, stamp: stamp, wait: wait) else { return .wouldBlock }
        return .done(nil)
    }
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?) { (try local.remove(key), nil) }
    nonisolated(nonsending) func send(_ write: RemoteSend) async {}
    func owe(_ write: RemoteSend) {}
    func owe(group: String) {}
    nonisolated(nonsending) func removeAll() async {}
    nonisolated(nonsending) func removeGroup(_ group: String) async {}
    func servableInMemory(_ call: LoaderCall, now: Int64) -> Bool {
        call.name.withUnsafeBytes { bytes in
            guard let freshness = local.memory.metadata(HashedKey(bytes, hash: call.hash))?.freshness else { return false }
            guard call.acceptsAbsence || !freshness.negative else { return false }
            return freshness.freshUntil == 0 || freshness.isFresh(at: now)
        }
    }
    func loadVersion() -> UInt64 { 0 }
    nonisolated(nonsending) func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome { .load(token: nil) }
    nonisolated(nonsending) func releaseLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async {}
    nonisolated(nonsending) func sendLanding(_ write: RemoteSend?, _ call: LoaderCall, _ lease: LeaseOutcome) async {}
    /// Nothing here is ever awaited: every remote half is empty, so `fallback` is its answer.
    func blocking<R: Sendable>(_ operation: String, fallback: R, _ body: @escaping @Sendable () async -> R) -> R { fallback }
    func start() {}
    func stop(closingStore: Bool) {}
    func drop(closed: Bool) {}
    nonisolated(nonsending) func replayBeforeShutdown(upTo replayTime: Duration) async {}
    nonisolated(nonsending) func closeStore() async {}
    var statistics: RemoteTierStatistics? { nil }
}

/// What a read's caller learned of memory before the walk (the loader API's first probe, the plain
/// read's memory hit).
enum MemorySeen: Sendable {
    /// Nothing memory may serve (with the loader API's unverified fallback: nothing at all).
    case nothing
    /// A copy the policy may not serve: judged again (and counted) by the walk, never read again.
    case unserved(StoredEntry)
}

/// What the local tiers hold of a key, judged by the policy.
enum LocalCopy: Sendable {
    /// A copy that may be served.
    case serve(StoredEntry, CacheHit.Tier)
    /// None that may be served: ask the miss source. `unverified`: a copy past its staleness bound, which
    /// only fail-safe may serve (the loader API's fallback when the remote tier has nothing).
    case ask(unverified: (StoredEntry, CacheHit.Tier)?)
}

@usableFromInline
struct Composition: Sendable {
    let local: LocalTiers
    let policy: any CoherencePolicy
    /// `policy.judgesCopies`, read by the memory hit without a witness call.
    @usableFromInline let judgesCopies: Bool

    init(local: LocalTiers, remote: RemoteTierOptions?, hasher: KeyHash) {
        self.local = local
        policy = remote.map { RemotePolicy(local: local, options: $0, hasher: hasher) } ?? LocalOnly(local)
        judgesCopies = policy.judgesCopies
        coherent = policy as? RemotePolicy
    }

    /// The remote tier's half of the chain (nil without one): called directly where a hit judges a copy
    /// (no witness), and inspected by the tests and the fleet tooling.
    let coherent: RemotePolicy?
    var runtime: Runtime { local.runtime }

    // MARK: The walk

    /// Judges a local copy: `.serve` when the policy lets it be served; `.ask` carrying it as unverified
    /// for the loader API's fail-safe; nil when it answers nothing.
    private func judge(_ entry: StoredEntry, _ tier: CacheHit.Tier, _ want: ReadWant, unverifiedFallback: Bool) -> LocalCopy? {
        guard judgesCopies else { return .serve(entry, tier) }
        if want == .contains && entry.freshness.negative { return nil }
        if policy.servable(stamp: entry.stamp, now: runtime.clock.now()) { return .serve(entry, tier) }
        if want != .contains { policy.noteUnserved() }
        guard unverifiedFallback && entry.stamp != 0 else { return nil }
        var copy = entry
        copy.unverified = true
        return .ask(unverified: (copy, tier))
    }

    /// The walk's memory step (never waits). For ``ReadWant/contains`` not counted as a read.
    private func memoryCopy(_ key: HashedKey, _ want: ReadWant, unverifiedFallback: Bool) -> LocalCopy? {
        local.inMemory(key, want, stamped: judgesCopies).flatMap { judge($0, .memory, want, unverifiedFallback: unverifiedFallback) }
    }

    /// The walk's storage step: a hit promoted into memory (`contains` promotes nothing; a plain read
    /// without a policy that judges copies promotes no negative entry, which it treats as a miss).
    private func storageCopy(_ key: HashedKey, _ want: ReadWant, unverifiedFallback: Bool, wait: ReadWait) throws(MagpieError)
        -> ImmediateRead<LocalCopy>
    {
        if want == .contains && !judgesCopies {
            guard case .done(let present) = try local.containsInStorage(key, wait: wait) else { return .wouldBlock }
            return .done(present ? .serve(.empty, .disk) : .ask(unverified: nil))
        }
        let promotion: Promotion = want == .contains ? .none : judgesCopies || want == .entry ? .all : .values
        guard case .done(let found) = try local.storageEntry(key, wait: wait, promotion: promotion) else { return .wouldBlock }
        return .done(found.flatMap { judge(StoredEntry($0), .disk, want, unverifiedFallback: unverifiedFallback) } ?? .ask(unverified: nil))
    }

    /// The walk's memory step when the caller read memory already (`memory`), else a read of it.
    private func memoryStep(_ key: HashedKey, _ want: ReadWant, _ memory: MemorySeen?, unverifiedFallback: Bool) -> LocalCopy? {
        switch memory {
        case nil: memoryCopy(key, want, unverifiedFallback: unverifiedFallback)
        case .nothing: nil
        case .unserved(let entry): judge(entry, .memory, want, unverifiedFallback: unverifiedFallback)
        }
    }

    /// The local copy of `key` (memory unless the caller read it: `memory`, then the storage tier).
    private func localCopy(_ key: HashedKey, _ want: ReadWant, memory: MemorySeen?, unverifiedFallback: Bool, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<LocalCopy>
    {
        if let copy = memoryStep(key, want, memory, unverifiedFallback: unverifiedFallback) { return .done(copy) }
        return try storageCopy(key, want, unverifiedFallback: unverifiedFallback, wait: wait)
    }

    /// The miss source's answer when no local copy may be served (never for `contains`).
    private func tierOf(_ fetched: StoredEntry?) -> (StoredEntry, CacheHit.Tier)? { fetched.map { ($0, .remote) } }

    /// `want` of `key`, and the tier that answered, from the synchronous API. `memory`: what the caller's
    /// own read of memory found (nil: it did not read it). `unverifiedFallback` (the loader API): a local
    /// copy past its staleness bound comes marked unverified when the miss source has nothing. Without
    /// `fetching` the miss source is not asked (the loader API's load asks it with its lease).
    func read(_ key: HashedKey, _ want: ReadWant, memory: MemorySeen? = nil, unverifiedFallback: Bool = false, fetching: Bool = true)
        throws(MagpieError) -> (StoredEntry, CacheHit.Tier)?
    {
        switch try localCopy(key, want, memory: memory, unverifiedFallback: unverifiedFallback, wait: .block).waited() {
        case .serve(let entry, let tier): return (entry, tier)
        case .ask(let unverified):
            guard want != .contains, judgesCopies, fetching else { return unverified }
            let (policy, name, hash) = (policy, Array(key.bytes), key.hash)
            return tierOf(policy.blocking("read", fallback: nil) { await policy.fetch(name, hash: hash) }) ?? unverified
        }
    }

    /// ``read(_:_:memory:unverifiedFallback:fetching:)`` for the async API: memory on the caller's task (a
    /// memory hit never hops), the storage tier there too when it cannot wait (else on an I/O thread), the
    /// miss source awaited.
    nonisolated(nonsending)
    func read(
        _ name: [UInt8], hash: UInt64, _ want: ReadWant, memory: MemorySeen? = nil, unverifiedFallback: Bool = false, fetching: Bool = true
    ) async throws -> (StoredEntry, CacheHit.Tier)? {
        var copy = try runtime.withKey(name, hash: hash) { key in memoryStep(key, want, memory, unverifiedFallback: unverifiedFallback) }
        if case .none = copy {
            copy = try await local.immediateOrHop(name, hash: hash, inline: runtime.inlineReads) { [self] key, wait throws(MagpieError) in
                try storageCopy(key, want, unverifiedFallback: unverifiedFallback, wait: wait)
            }
        }
        switch copy {
        case .serve(let entry, let tier): return (entry, tier)
        case .ask(let unverified):
            guard want != .contains, judgesCopies, fetching else { return unverified }
            return tierOf(await policy.fetch(name, hash: hash)) ?? unverified
        case nil: return nil
        }
    }

    /// The plain read's value past the memory probe (a negative entry is no value): the synchronous read's
    /// disk half, unwrapped where no policy judges copies.
    @usableFromInline
    func valuePastMemory(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        guard judgesCopies else { return try local.valueInStorage(key) }
        guard let (entry, _) = try read(key, .value, memory: .nothing), !entry.freshness.negative else { return nil }
        return entry.value
    }

    /// Runs `body` over a copy of `key` in memory that may be served, in place (no lock): the memory hit
    /// of a cache whose copies are judged.
    @usableFromInline
    func withServableMemoryValue<R>(_ key: HashedKey, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        // Without a remote tier every copy may be served.
        guard let coherent else { return local.memory.withValue(key, body) }
        return local.withServableValue(key, coherent, body)
    }

    /// Whether a read that found nothing in memory reads further (a storage tier or a miss source).
    var readsPastMemory: Bool { local.storage.mayWait || judgesCopies }

    // MARK: Writes

    /// A store's local half (the whole store without a remote tier), and the remote half still to send.
    /// `.ifImmediate`: `.wouldBlock`, with nothing changed, where it would wait.
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    {
        try policy.writeLocally(value, for: key, options: options, stamp: stamp, wait: wait)
    }

    /// A removal's local half: whether either local tier held the key, and the remote half still to send.
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?) {
        try policy.removeLocally(key)
    }

    /// Sends a write's remote half (the async API: awaited, no thread blocked).
    nonisolated(nonsending)
    func send(_ write: RemoteSend?) async {
        if let write { await policy.send(write) }
    }

    /// ``send(_:)`` from the synchronous API: blocks until the remote tier answered; a write that could
    /// not wait there (on the store's own thread) is owed.
    func sendBlocking(_ write: RemoteSend?) {
        guard let write else { return }
        let policy = policy
        if !policy.blocking("write", fallback: false, { await policy.send(write); return true }) { policy.owe(write) }
    }

    /// Removes everything: the local tiers (on an I/O thread when they may wait), then the remote records.
    nonisolated(nonsending)
    func removeAll() async throws {
        let local = local
        try await local.offload { () throws(MagpieError) in try local.removeAll() }
        await policy.removeAll()
    }

    func removeAllBlocking() throws(MagpieError) {
        try local.removeAll()
        let policy = policy
        policy.blocking("removal of everything", fallback: ()) { await policy.removeAll() }
    }

    /// Removes a group: the local tiers, then the group's remote records (owed where the synchronous API
    /// cannot wait for them).
    nonisolated(nonsending)
    func removeAll(inGroup group: String) async throws -> RemovedEntries {
        let local = local
        let removed = try await local.offload { () throws(MagpieError) -> RemovedEntries in try local.removeAll(inGroup: group) }
        await policy.removeGroup(group)
        return removed
    }

    func removeAllBlocking(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        let removed = try local.removeAll(inGroup: group)
        let policy = policy
        if !policy.blocking("group removal", fallback: false, { await policy.removeGroup(group); return true }) { policy.owe(group: group) }
        return removed
    }

    // MARK: Loads

    /// Whether memory holds a value of the key that `call` would serve without a load (fresh).
    func servableInMemory(_ call: LoaderCall, now: @autoclosure () -> Int64) -> Bool {
        policy.servableInMemory(call, now: now())
    }

    /// The version a load that starts now gives its value (0 without a remote tier).
    func loadVersion() -> UInt64 { policy.loadVersion() }

    /// Takes the fleet's lease of `call`'s key (or gets the value another instance's load stored);
    /// without a remote tier this instance just loads.
    nonisolated(nonsending)
    func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome { await policy.acquireLoad(call) }

    func acquireLoadBlocking(_ call: LoaderCall) -> LeaseOutcome {
        let policy = policy
        return policy.blocking("lease", fallback: .load(token: nil)) { await policy.acquireLoad(call) }
    }

    /// Releases the lease `lease` holds, if any, once the load landed.
    nonisolated(nonsending)
    func releaseLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async { await policy.releaseLoad(call, lease) }

    func releaseLoadBlocking(_ call: LoaderCall, _ lease: LeaseOutcome) {
        guard case .load(.some) = lease else { return }
        let policy = policy
        policy.blocking("lease release", fallback: ()) { await policy.releaseLoad(call, lease) }
    }

    /// A landed load's remote half (`write`, from `land`), then its lease released: together where the
    /// store can (one round trip for a value's write and its release).
    nonisolated(nonsending)
    func sendLanding(_ write: RemoteSend?, _ call: LoaderCall, _ lease: LeaseOutcome) async {
        await policy.sendLanding(write, call, lease)
    }

    /// ``sendLanding(_:_:_:)`` from the synchronous API: blocks until the remote tier answered; a write
    /// that could not wait there (on the store's own thread) is owed, and its lease left to expire.
    func sendLandingBlocking(_ write: RemoteSend?, _ call: LoaderCall, _ lease: LeaseOutcome) {
        guard let write else { return releaseLoadBlocking(call, lease) }
        let policy = policy
        if !policy.blocking("write", fallback: false, { await policy.sendLanding(write, call, lease); return true }) { policy.owe(write) }
    }

    // MARK: Life cycle

    /// Starts what runs in the background: the storage tier's buffer writer, and the remote tier's feed
    /// and replay.
    func start(writingBuffersEvery interval: Duration?) {
        if let interval { local.startWritingBuffers(every: interval) }
        policy.start()
    }

    /// At `close()`: the remote tier stops (its store's connections close in the background unless the
    /// caller closes them), then the local tiers close.
    func close(closingStore: Bool) throws(MagpieError) {
        policy.stop(closingStore: closingStore)
        try local.close()
    }
}
