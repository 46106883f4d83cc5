/// A key-value store shared by many caches: the remote tier a ``Cache`` composes after disk (reads
/// memory → disk → remote → loader). `MagpieRedis` provides one for Redis and Valkey
/// (`RedisRemoteStore`); this protocol has no network dependency.
///
/// The cache owns the layout of what it stores here: the keys it passes are *logical* keys (a one-byte
/// tag, then a key or a group name; see <doc:RunningAFleet>), which the store keeps under its own
/// namespace, and the values are self-checking records. A store only moves bytes, and reports changes.
///
/// **Changes.** Every write through the store publishes one change message, made by the write itself
/// (atomically with it, on the server), on the feed of the key's *partition*: the logical key, the write's
/// version (0 for an unversioned write), the instance that made it, the partition and its sequence
/// number (1, 2, 3, … per partition, in the order the writes took effect), and, for a versioned write
/// asked to push it, the stored value. After ``startReporting(to:)`` the store reports every message it
/// receives, in order (``RemoteChanges/changed(_:)``), the partitions' sequence numbers as it reads them
/// (``RemoteChanges/sequences(_:)``), and everything it can no longer vouch for
/// (``RemoteChanges/invalidateAll()``: a feed interrupted; ``RemoteChanges/partitionsLost(_:)``: the
/// partitions of a feed that missed messages). It also confirms, regularly, that every message published
/// before an instant has been reported (``RemoteChanges/confirm(through:total:)``): the cache serves its local
/// copies only while confirmations keep coming (see ``RemoteTierOptions/maxDisconnectedStaleness``). A
/// store may also report keys changed by programs that are not caches (``RemoteChanges/invalidate(keys:)``).
///
/// **Async only.** Every call is awaited where the cache runs it: from the async API on the caller's
/// task, with no thread blocked and no lock held across the round trip. The cache's synchronous API
/// waits for these calls in one place of its own (a dedicated thread runs them while the caller blocks).
///
/// **Errors.** Every call throws ``MagpieError`` (``MagpieError/Code/remoteUnavailable`` for a store
/// that is down or whose breaker is open); the cache turns them into misses and counted errors, never
/// into a caller's failure.
public protocol RemoteStore: AnyObject, Sendable {
    /// The values of `keys` (nil for an absent key), in one round trip where the store can.
    func values(forKeys keys: [[UInt8]]) async throws(MagpieError) -> [[UInt8]?]

    /// Stores `value` for `key`, expiring at `expiresAt` (ms since 1970; 0: never). With `onlyIfAbsent`
    /// only when the key has no value. Returns whether it stored.
    ///
    /// A store that created a namespace or group token this way (`onlyIfAbsent`, a key "a" or "g" + name)
    /// should publish its change message, with the token as its value, as for a token replaced: the
    /// token the key had before (evicted, say) is gone with every record written under it, and an
    /// instance that still holds it forgets it and its local copies of those records, instead of judging
    /// every record written under the new token outdated (a fleet split between two tokens). Taking a
    /// lease publishes nothing.
    func store(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, onlyIfAbsent: Bool) async throws(MagpieError)
        -> Bool

    /// Stores a *versioned* value for `key` only if it is newer than what the key holds: the write that
    /// keeps a late command (one that timed out, then ran when the store resumed) from bringing back a
    /// removed value or overwriting a newer one. Returns whether it stored; a write that stored published
    /// its change message (see **Changes**), with the value when `pushing`.
    ///
    /// A versioned value starts with `"MV"` and its version, 8 bytes big endian (the top 48 bits a wall
    /// clock in ms, the low 16 a counter). The store compares the version with the one at the start of
    /// the key's current value, atomically on the server (MagpieRedis: a script on the one key, so a
    /// cluster is fine and change tracking reports it), and stores only when the current value is
    /// absent, not versioned, or older. It also refuses (returns false) when its own clock is past
    /// `notAfter` (ms since 1970; 0: no deadline), so that a write delayed longer than the tombstones
    /// that fence it live is dropped, never applied. `expiresAt` as in
    /// ``store(_:forKey:expiresAt:onlyIfAbsent:)``.
    func storeIfNewer(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool) async throws(MagpieError)
        -> Bool

    /// Each of `writes` as ``storeIfNewer(_:forKey:expiresAt:notAfter:pushing:)`` makes it (publishing no
    /// value), sent together where the store can (MagpieRedis: one pipelined flush per node, each write
    /// still its own script and change message): each write's outcome in order, whether it stored or the
    /// error of that write alone. A write the store refused (a newer version, a passed deadline) is no
    /// error and stops none of the others; a batch cut short (the connection lost) fails each write it
    /// did not answer. The default sends them one at a time.
    func storeIfNewer(batch writes: [RemoteVersionedWrite]) async -> [Result<Bool, MagpieError>]

    /// ``storeIfNewer(_:forKey:expiresAt:notAfter:pushing:)``, and the load lease `lease` removed while it
    /// still holds `token` (``remove(_:ifValue:)``), whether the write stored or was refused: how a load's
    /// holder lands its value and ends its lease. The write's outcome or error is the answer; after an error
    /// the release may not have run, and is the caller's (the cache sends it apart). In one round trip
    /// where the store can (MagpieRedis on a single server: one script call, the write's change message
    /// alone waking the instances that wait for the value); the default sends the write, then the release
    /// (a release that fails is left to expire with its lease).
    func storeIfNewer(
        _ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool, releasing lease: [UInt8], token: [UInt8]
    ) async throws(MagpieError) -> Bool

    /// How many partitions the store's keys fall into (at most ``RemoteChanges/maximumPartitions``); each has
    /// its own sequence of change messages.
    var partitionCount: Int { get }

    /// The partition of a logical key (0 ..< ``partitionCount``).
    func partition(of key: [UInt8]) -> Int

    /// The executor the store's own I/O runs on, if it has one: the cache runs a remote operation's calls
    /// there as one task, so that an async caller pays one hop there and one back however many calls the
    /// operation makes. Nil: the calls are awaited from the caller's executor.
    var taskExecutor: (any TaskExecutor)? { get }

    /// Removes `keys` (absent ones are no error).
    func remove(keys: [[UInt8]]) async throws(MagpieError)

    /// Removes `key` only while it holds exactly `value` (atomically on the server); returns whether it
    /// removed. How a load lease is released by its holder only, never by a later holder's token.
    func remove(_ key: [UInt8], ifValue value: [UInt8]) async throws(MagpieError) -> Bool

    /// The value of `key`, or, when it has none (absent, or a removal's tombstone: a versioned value of
    /// exactly the fence and `"MT"`), the load lease `lease` taken with `token` until `expiresAt` (ms since
    /// 1970) where no lease is held: how a load asks for "the value, or the lease" at once. A value found
    /// takes no lease. In one round trip where the store can (MagpieRedis on a single server: one script);
    /// the default reads the value, takes the lease when there is none, and, having taken it, reads the
    /// value again (a holder that stored it and ended its lease between the two): that value found, the
    /// lease is released and the value answered.
    func valueOrLease(forKey key: [UInt8], lease: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError) -> RemoteLeaseRead

    /// Starts reporting changes to `changes` (called once, by the cache that composes the store).
    func startReporting(to changes: RemoteChanges)

    /// Whether calls fail fast now (the store's circuit breaker is open).
    var failsFast: Bool { get }

    /// Whether the calling thread may block until a call to the store ends: false on a thread the
    /// store's own calls need (an event loop of its own), where the cache's *synchronous* API then
    /// treats the remote tier as unreachable rather than deadlock. The async API never blocks.
    var callerMayWait: Bool { get }

    /// Stops reporting and closes the store's connections (the cache calls it from its shutdown).
    func shutdown() async
}

/// What ``RemoteStore/valueOrLease(forKey:lease:token:expiresAt:)`` found: the key's value (then no lease was
/// asked for), or none and whether the lease was taken.
public struct RemoteLeaseRead: Sendable, Equatable {
    /// The key's value; nil when it had none (or a tombstone).
    public var value: [UInt8]?
    /// Whether this call took the lease (never with a value).
    public var leased: Bool

    public init(value: [UInt8]?, leased: Bool) {
        (self.value, self.leased) = (value, leased)
    }

    /// Whether `bytes` are a removal's tombstone as the cache writes it (the 10-byte fence, then `"MT"`),
    /// which reads as no value.
    public static func isTombstone(_ bytes: [UInt8]) -> Bool {
        bytes.count == 12 && bytes[0] == 0x4D && bytes[1] == 0x56 && bytes[10] == 0x4D && bytes[11] == 0x54
    }
}

/// One write of ``RemoteStore/storeIfNewer(batch:)``: a versioned value (`"MV"` and its version) for a key,
/// expiring at `expiresAt` and not stored once the store's clock is past `notAfter`.
public struct RemoteVersionedWrite: Sendable {
    public var value: [UInt8]
    public var key: [UInt8]
    public var expiresAt: Int64
    public var notAfter: Int64

    public init(value: [UInt8], key: [UInt8], expiresAt: Int64, notAfter: Int64) {
        (self.value, self.key, self.expiresAt, self.notAfter) = (value, key, expiresAt, notAfter)
    }
}

extension RemoteStore {
    public func storeIfNewer(
        _ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool, releasing lease: [UInt8], token: [UInt8]
    ) async throws(MagpieError) -> Bool {
        try await storeIfNewerThenRelease(value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: pushing, releasing: lease, token: token)
    }

    /// ``storeIfNewer(_:forKey:expiresAt:notAfter:pushing:releasing:token:)`` in two calls: the write, then
    /// the release (whose failure is left to the lease's expiry). A write that fails throws before any
    /// release: that one is the caller's, as the protocol says. The default, and a store's fallback where
    /// it cannot do both at once.
    public func storeIfNewerThenRelease(
        _ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool, releasing lease: [UInt8], token: [UInt8]
    ) async throws(MagpieError) -> Bool {
        let stored = try await storeIfNewer(value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: pushing)
        _ = try? await remove(lease, ifValue: token)
        return stored
    }

    public func valueOrLease(forKey key: [UInt8], lease: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError)
        -> RemoteLeaseRead
    {
        try await valueThenLease(forKey: key, lease: lease, token: token, expiresAt: expiresAt)
    }

    /// ``valueOrLease(forKey:lease:token:expiresAt:)`` in separate calls: the value read, the lease taken
    /// when there is none, and the value read again once taken (released if it came meanwhile). The
    /// default, and a store's fallback where one call cannot reach both keys (a cluster).
    public func valueThenLease(forKey key: [UInt8], lease: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError)
        -> RemoteLeaseRead
    {
        func present() async throws(MagpieError) -> [UInt8]? {
            guard let value = try await values(forKeys: [key]).first ?? nil, !RemoteLeaseRead.isTombstone(value) else { return nil }
            return value
        }
        if let value = try await present() { return RemoteLeaseRead(value: value, leased: false) }
        guard try await store(token, forKey: lease, expiresAt: expiresAt, onlyIfAbsent: true) else {
            return RemoteLeaseRead(value: nil, leased: false)
        }
        if let value = try await present() {
            _ = try? await remove(lease, ifValue: token)
            return RemoteLeaseRead(value: value, leased: false)
        }
        return RemoteLeaseRead(value: nil, leased: true)
    }

    public func storeIfNewer(batch writes: [RemoteVersionedWrite]) async -> [Result<Bool, MagpieError>] {
        var outcomes: [Result<Bool, MagpieError>] = []
        outcomes.reserveCapacity(writes.count)
        for write in writes {
            do {
                outcomes.append(.success(try await storeIfNewer(write.value, forKey: write.key, expiresAt: write.expiresAt, notAfter: write.notAfter)))
            } catch {
                outcomes.append(.failure(error))
            }
        }
        return outcomes
    }

    /// ``storeIfNewer(_:forKey:expiresAt:notAfter:pushing:)`` publishing no value.
    public func storeIfNewer(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64) async throws(MagpieError)
        -> Bool
    {
        try await storeIfNewer(value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: false)
    }
}

// What the remote tier asks of its store, each written once (the tier, its tokens and its replay share them).
extension RemoteStore {
    /// Runs a call to the store on its executor (``RemoteStore/taskExecutor``): an async caller pays one
    /// hop there and one back, and the store's thread does the I/O and nothing else (encoding and
    /// checking records stays on the caller's).
    @inline(__always) nonisolated(nonsending)
    func onExecutor<R: Sendable>(_ body: () async throws(MagpieError) -> R) async throws(MagpieError) -> R {
        try await withTaskExecutorPreference(taskExecutor) { () async throws(MagpieError) -> R in try await body() }
    }

    /// Replaces the token of `group` (nil: the namespace's) with a new one: every record written under
    /// the old one is outdated.
    func replaceToken(group: String?) async throws(MagpieError) {
        _ = try await store(
            RemoteRecord.tokenBytes(RemoteRecord.newToken()), forKey: group.map { RemoteKey.group($0) } ?? RemoteKey.namespaceKey,
            expiresAt: 0, onlyIfAbsent: false)
    }

    /// Writes `key`'s (a user key) tombstone of `version`, on the store's executor: it lives `lifetime` ms
    /// from `now`, and refuses every older write meanwhile. Whether the store took it (false: it holds a
    /// newer write). Its message carries it (12 bytes): receivers learn that the store holds nothing newer
    /// (RemotePolicy's `removedKeys`).
    func storeTombstone(_ key: [UInt8], version: UInt64, now: Int64, lifetime: Int64) async throws(MagpieError) -> Bool {
        let write = Self.tombstone(key, version: version, now: now, lifetime: lifetime)
        return try await onExecutor { [self] () async throws(MagpieError) in
            try await storeIfNewer(write.value, forKey: write.key, expiresAt: write.expiresAt, notAfter: write.notAfter, pushing: true)
        }
    }

    /// The tombstones of `keys` (user keys, each with its version) as ``storeTombstone(_:version:now:lifetime:)``
    /// writes them, in one batch (``storeIfNewer(batch:)``) on the store's executor: one hop there and one
    /// back for them all.
    func storeTombstones(_ keys: [(key: [UInt8], version: UInt64)], now: Int64, lifetime: Int64) async -> [Result<Bool, MagpieError>] {
        let writes = keys.map { Self.tombstone($0.key, version: $0.version, now: now, lifetime: lifetime) }
        return await withTaskExecutorPreference(taskExecutor) { [self] in await storeIfNewer(batch: writes) }
    }

    /// A tombstone's write: it lives `lifetime` ms from `now`, and is not stored past half of it.
    private static func tombstone(_ key: [UInt8], version: UInt64, now: Int64, lifetime: Int64) -> RemoteVersionedWrite {
        RemoteVersionedWrite(
            value: RemoteRecord.tombstone(version: version), key: [RemoteKey.record] + key, expiresAt: now.saturatingAdd(lifetime),
            notAfter: now.saturatingAdd(lifetime / 2))
    }
}

/// How a ``Cache`` uses its remote tier.
public struct RemoteTierOptions: Sendable {
    /// The shared store.
    public var store: any RemoteStore
    /// How long a local copy stays servable without word from the store's change feed.
    ///
    /// A local entry (memory or disk) is served only while the cache can vouch that no change to its key
    /// in the store went unreported: the store confirms its feed regularly (every
    /// ``RemoteTierOptions/maxDisconnectedStaleness`` / 10 for `MagpieRedis`). When confirmations stop
    /// (the store is down, paused, or unreachable), an entry is served until `maxDisconnectedStaleness`
    /// after the later of the last confirmation and the entry's own store or fetch; after that it is a
    /// miss (lazily: nothing is scanned). When the feed is re-established after an interruption, every
    /// local entry from before is a miss. Default 1 s.
    public var maxDisconnectedStaleness: Duration
    /// The most removals (keys, groups) kept for replay while the store cannot be reached. Beyond it the
    /// cache stops keeping keys and, when the store is back, removes *everything* it stored (one write
    /// that invalidates every record in the namespace, see <doc:RunningAFleet>): a removal is never lost.
    /// Default 100,000.
    public var maxPendingRemovals: Int
    /// Fleet-wide single flight for the loader API: a load first takes the key's lease in the store,
    /// for this long; an instance that finds it taken waits for the holder's value instead of loading
    /// (until the lease is released or expires). Longer than the slowest load you want coalesced.
    /// Nil: every instance loads on its own. Default 10 s.
    public var loadLease: Duration?
    /// How long a removal's tombstone stays in the store (default 60 s). A removal leaves a versioned
    /// tombstone instead of deleting the key, so that a write issued before it, delayed in the network
    /// or in a paused server, is refused when it finally runs; and every versioned write carries a
    /// deadline of half this lifetime, after which the store refuses it whatever it holds. Together they
    /// fence a late write as long as the instances' clocks differ by less than half of it. Longer costs
    /// the store one small key per removed key for longer.
    public var tombstoneLifetime: Duration = .seconds(60)
    /// How long a store or removal waits for the remote store's answer before it returns (a soft
    /// timeout, as FusionCache's distributed-cache soft timeout): past it the write goes on in the
    /// background, in order with the key's other writes (its version fences it), and a failure still
    /// owes the key a removal. Nil (the default): until the store answered or the command failed (the
    /// command timeout, or at once with the breaker open). A short wait keeps stores fast while the
    /// store is slow or paused, at the price of other instances seeing the write a little later than the
    /// call's return.
    public var writeWait: Duration? = nil
    /// Values up to this many bytes travel in their write's change message, so that another instance
    /// holding the key replaces its copy without a round trip (an instance that does not hold the key
    /// ignores it). Longer values, and removals, make the other instances drop their copies. 0: never
    /// pushed. Default 4 KiB.
    public var pushedValueLimit: Int = 4096
    /// Called with a key (as the cache's callers gave it) after another instance's change replaced or
    /// dropped its local copies: on the cache's coherence thread, in order; keep it short. For metrics
    /// and for measuring invalidation lag (`magpie-bench fleet`). Default nil.
    public var onInvalidation: (@Sendable ([UInt8]) -> Void)? = nil

    /// Options for `store`.
    public init(
        store: any RemoteStore, maxDisconnectedStaleness: Duration = .seconds(1), maxPendingRemovals: Int = 100_000,
        loadLease: Duration? = .seconds(10)
    ) {
        self.store = store
        self.maxDisconnectedStaleness = maxDisconnectedStaleness
        self.maxPendingRemovals = maxPendingRemovals
        self.loadLease = loadLease
    }
}
