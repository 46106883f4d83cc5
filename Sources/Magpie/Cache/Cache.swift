import Foundation
import Logging

/// A two-tier cache: a ``MemoryTier`` in front of an optional ``DiskTier``, each within its own byte budget,
/// and optionally a remote tier shared by a fleet of instances (``Configuration/remote``).
///
/// ```swift
/// let cache = try Cache(Cache.Configuration(directory: "/var/cache/thumbnails"))
/// cache["avatar:42"] = pngBytes                // both tiers
/// let bytes = cache["avatar:42"]               // memory, else disk (then promoted into memory)
/// cache["avatar:42"] = nil                     // removed from both
/// ```
///
/// **Reads** check memory, then disk, then the remote tier if there is one. A disk hit is copied into
/// memory (promoted) without being written to disk again, with the entry's memory expiry re-applied (see
/// ``EntryOptions/memoryExpiry``); entries stored ``Tiers/diskOnly`` are never promoted. A remote hit is
/// kept locally while coherence allows (see <doc:RunningAFleet>). Expired entries are misses at once.
///
/// **Writes** go to both local tiers unless the entry's ``EntryOptions/tiers`` say otherwise, then to
/// the remote tier. The disk write comes first: if it fails, the call throws and neither tier changes. A
/// store with ``Tiers/memoryOnly`` removes the key's older value from disk; one with ``Tiers/diskOnly``
/// removes it from memory. So a read returns nothing or the value of the latest successful store or removal.
///
/// **Consistency between tiers.** The changes one call makes to both tiers, and a read's disk lookup
/// and promotion, run under a lock striped by the key's hash, so they never interleave for one key:
/// a promotion cannot put back a value that a concurrent store replaced or a removal removed.
/// `removeAll()` and `removeAll(inGroup:)` hold every stripe. A memory hit takes no stripe.
///
/// **Durability** is the disk tier's: a returned removal has reached the kernel, a returned store has
/// once its disk bucket's write buffer is written (see ``DiskTier/Configuration/writeBufferSize``);
/// `flush()` makes both survive power loss. After a crash a read returns nothing or a value stored for its
/// key; removals and group removals that returned are never undone (see <doc:DurabilityAndCrashSafety>).
///
/// **Async.** Every operation has an `async` form on ``async`` (`try await cache.async.value(forKey:)`)
/// that runs disk I/O on ``Configuration/ioThreadCount`` dedicated threads, never on Swift's cooperative
/// pool, and awaits the remote tier with no thread blocked; a memory hit returns on the caller's executor
/// without a hop. The synchronous forms work in async functions too (they block the calling thread for
/// disk I/O and remote round trips). ``value(forKey:options:loader:load:)-(String,_,_,_)`` coalesces
/// concurrent loads of one missing key.
///
/// **Keys** are `String`s (their UTF-8 bytes) or any `Sequence<UInt8>`, 0 to ``maximumKeyLength`` bytes,
/// in every keyed call; a longer key throws ``MagpieError/Code/keyTooLong`` from every call.
///
/// **Errors** are ``MagpieError`` values. The subscript, which cannot throw, logs failures, counts them
/// in ``CacheStatistics/subscriptFailures`` and treats a failed read as a miss. The remote tier's
/// failures are never a caller's: they are misses, counted, and removals owed to the store.
///
/// ### Implementation notes
/// A cache is a thin composer: it hashes the key once, reads memory itself (the hit path, inlined), and
/// hands everything else to its one composition (local tiers, or local tiers kept coherent with a
/// remote tier: `Tiers/`), to its load coordinator (the loader API: `Loading/`) and to its runtime
/// (threads, counters, timers: `Runtime/`).
public final class Cache: Sendable {
    /// The configuration the cache was opened with (bucket count as found on disk).
    public let configuration: Configuration
    /// The memory tier, read directly by the inlined hit paths.
    @usableFromInline let memory: MemoryTier
    /// The key hash of every tier (the disk directory's seed, so placement is stable across restarts).
    @usableFromInline let hasher: KeyHash
    @usableFromInline let composition: Composition
    @usableFromInline let runtime: Runtime
    let loads: LoadCoordinator
    /// ``Configuration/defaultOptions``, kept apart: reading it through `configuration` copied the whole
    /// configuration on every store (metrics options included; callgrind).
    let defaultOptions: EntryOptions
    let metrics: MetricsReporter?

    /// The longest key, in bytes (a key's UTF-8 bytes for a `String`).
    public static let maximumKeyLength = HashedKey.maximumLength

    /// The longest value a store keeps: the disk tier's ``DiskTier/largestStorableValue`` for a two-tier
    /// cache (measured as the disk tier stores it, compressed when it compresses; a longer value throws
    /// ``MagpieError/Code/valueTooLarge``), else the memory tier's. Values
    /// longer than ``largestMemoryValue`` are kept on disk only. Both are for an empty key without a
    /// group; see the tiers' properties for what a key, a group and an expiry take.
    public var largestStorableValue: Int { composition.local.largestStorableValue }

    /// The longest value the memory tier keeps (``MemoryTier/largestStorableValue``, about half the
    /// memory budget or more); a longer one is refused by memory (counted) and kept on disk only.
    public var largestMemoryValue: Int { memory.largestStorableValue }

    /// The disk tier, if any (for the tests, which read it directly).
    var disk: DiskTier? { composition.local.storage as? DiskTier }

    /// Opens a cache: the memory tier, the disk tier when ``Configuration/disk`` is set, the remote tier
    /// when ``Configuration/remote`` is.
    /// - Throws: ``MagpieError/Code/invalidConfiguration`` for budgets or counts out of range; the
    ///   disk tier's errors when it cannot open its directory (``MagpieError/Code/directoryLocked``,
    ///   ``MagpieError/Code/directoryUnusable``, ``MagpieError/Code/directoryUnsafe``,
    ///   ``MagpieError/Code/manifestMismatch``, I/O errors).
    public init(_ configuration: Configuration = Configuration()) throws(MagpieError) {
        var resolved = try configuration.sharingItsSettings()
        let storage: any StorageTier = try resolved.disk.map { (disk) throws(MagpieError) in try DiskTier(disk) } ?? NoStorage()
        resolved.disk = storage.diskConfiguration
        // One seed for both tiers: the directory's, so placement is stable across restarts.
        let hasher = storage.directoryHasher ?? configuration.hashSeed.map { KeyHash(seed: $0) } ?? .random()
        do throws(MagpieError) {
            memory = try MemoryTier(resolved.memory, hasher: hasher)
            resolved.memory = memory.configuration
            resolved.hashSeed = hasher.seed
        } catch {
            try? storage.close()
            throw error
        }
        self.hasher = hasher
        self.configuration = resolved
        defaultOptions = configuration.defaultOptions
        runtime = Runtime(configuration, ioThreads: storage.mayWait ? configuration.ioThreadCount : 1)
        let local = LocalTiers(memory: memory, storage: storage, runtime: runtime)
        composition = Composition(local: local, remote: configuration.remote, hasher: hasher)
        loads = LoadCoordinator(composition, runtime: runtime, configuration: configuration)
        metrics = configuration.metrics.map { MetricsReporter($0) }
        composition.start(writingBuffersEvery: configuration.diskBufferWriteInterval)
        startReportingMetrics()
    }

    /// A memory-only cache with the given budget (the other settings default).
    public convenience init(memoryBudget: Int) throws(MagpieError) {
        try self.init(Configuration(memoryBudget: memoryBudget))
    }

    deinit {
        runtime.stop()
        loads.shutdown()
        composition.policy.drop(closed: runtime.closed.load(ordering: .relaxed))
    }

    // MARK: Writes

    /// Stores `value` for `key` with `options` (``Configuration/defaultOptions`` when nil), replacing any
    /// previous value in every tier.
    ///
    /// A value longer than ``largestMemoryValue`` is kept on disk only (counted as a memory refusal); one
    /// longer than ``largestStorableValue`` throws (a memory-only cache refuses it: counted, the key
    /// absent). An expiry already past removes the key. With a remote tier the store returns once the
    /// store answered (or failed, which owes the key a removal; never thrown).
    /// - Throws: ``MagpieError/Code/keyTooLong`` (key or group), ``MagpieError/Code/valueTooLarge``,
    ///   ``MagpieError/Code/noSpace``, ``MagpieError/Code/ioFailure``, ``MagpieError/Code/closed``. After a
    ///   throw the key keeps its previous value (or has none).
    @inlinable
    public func set(_ value: some Sequence<UInt8>, forKey key: String, options: EntryOptions? = nil) throws(MagpieError) {
        try set(value, forKey: key.utf8, options: options)
    }

    /// `set(_:forKey:options:)` for a key of arbitrary bytes.
    @inlinable
    public func set(_ value: some Sequence<UInt8>, forKey key: some Sequence<UInt8>, options: EntryOptions? = nil)
        throws(MagpieError)
    {
        try withHashedKey(key) { key throws(MagpieError) in
            try withBytes(value) { value in Result { () throws(MagpieError) in try set(value, for: key, options: options) } }.get()
        }
    }

    @usableFromInline
    func set(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions?) throws(MagpieError) {
        composition.sendBlocking(try write(value, for: key, options: options, wait: .block).waited())
    }

    /// A store's local half, after superseding the key's running load: the remote half still to send.
    /// `.ifImmediate` (an async caller's task): `.wouldBlock`, with nothing changed but the key's load
    /// superseded, where the store would wait.
    func write(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions?, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    {
        guard loads.supersede(key, wait: wait) else { return .wouldBlock }
        let options = options ?? defaultOptions
        let stamp = options.stamp(now: runtime.clock.now(), hash: key.hash)
        return try composition.writeLocally(value, for: key, options: options, stamp: stamp, wait: wait)
    }

    /// Removes `key` from every tier (durably on disk). Returns whether a local tier held it.
    @discardableResult
    public func removeValue(forKey key: String) throws(MagpieError) -> Bool {
        try removeValue(forKey: key.utf8)
    }

    /// `removeValue(forKey:)` for a key of arbitrary bytes.
    @discardableResult @inlinable
    public func removeValue(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try remove(key) }
    }

    @usableFromInline
    func remove(_ key: HashedKey) throws(MagpieError) -> Bool {
        loads.supersede(key)
        let (removed, send) = try composition.removeLocally(key)
        composition.sendBlocking(send)
        return removed
    }

    /// Removes every entry from every tier. On disk, bucket after bucket: if it throws, the buckets not
    /// yet emptied keep their entries (memory is emptied regardless).
    public func removeAll() throws(MagpieError) {
        try runtime.checkOpen()
        loads.supersedeAll()
        try composition.removeAllBlocking()
    }

    /// Removes every entry stored with `group` from every tier; on disk durably (a group tombstone), so
    /// none comes back after a restart. Costs a walk over every entry of both local tiers. The empty group
    /// is no group (an entry stored with group "" has none), so `removeAll(inGroup: "")` removes nothing.
    /// - Throws: ``MagpieError/Code/keyTooLong`` for a group name over 65,535 UTF-8 bytes; disk I/O
    ///   errors; ``MagpieError/Code/closed``.
    @discardableResult
    public func removeAll(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        try runtime.checkOpen()
        guard !group.isEmpty else { return RemovedEntries() }
        loads.supersedeAll()
        return try composition.removeAllBlocking(inGroup: group)
    }

    /// Removes the entries whose expiry has passed from both local tiers. Expired entries are misses
    /// whether or not this runs: it reclaims their room early.
    @discardableResult
    public func removeExpired() throws(MagpieError) -> RemovedEntries {
        try runtime.checkOpen()
        return try composition.local.removeExpired()
    }

    /// Makes every store and removal so far durable (fsync of the disk tier's files and directories).
    /// A memory-only cache has nothing to flush.
    public func flush() throws(MagpieError) {
        try runtime.checkOpen()
        try composition.local.flush()
    }

    /// Closes the cache: stops the I/O threads and the metrics reporter, closes the disk tier (leaving an
    /// index snapshot for a fast reopen) and empties memory. Every later call, reads included, throws
    /// ``MagpieError/Code/closed`` (the subscript, which cannot throw, reads nil and counts a
    /// ``CacheStatistics/subscriptFailures``), whether or not the cache has a disk tier. Closing twice is
    /// harmless.
    ///
    /// With a remote tier, its store's connections close in the background (``shutdown(replayingFor:)``
    /// waits for them, and for the removals owed to the store).
    public func close() throws(MagpieError) {
        try close(waitingForRemote: true)
    }

    /// `close()`; `waitingForRemote: false` leaves the remote store open (the caller closes it).
    func close(waitingForRemote: Bool) throws(MagpieError) {
        guard !runtime.closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        runtime.stop()
        loads.shutdown()
        reportMetrics()
        defer { runtime.logs.flush() }
        try composition.close(closingStore: waitingForRemote)
    }

    /// Deletes a cache directory's Magpie files so that the next open starts empty: the documented way
    /// to reset a directory a ``Cache`` refuses to open (``MagpieError/Code/directoryUnusable`` for an
    /// unreadable or missing MANIFEST, ``MagpieError/Code/manifestMismatch`` for another format or
    /// bucket count). Other files in the directory are left alone. Same as
    /// ``DiskTier/destroy(directory:)``.
    /// - Throws: ``MagpieError/Code/directoryLocked`` while a cache has the directory open; I/O errors.
    public static func destroy(directory: String) throws(MagpieError) {
        try DiskTier.destroy(directory: directory)
    }

    // MARK: Metrics

    /// Reports the metrics every ``MetricsOptions/interval``.
    private func startReportingMetrics() {
        guard let interval = configuration.metrics?.interval else { return }
        runtime.repeating(every: interval) { [weak self] in
            guard let self else { return false }
            // Not while the disk buckets' indexes still load after the open: `statistics` would wait for
            // them on a thread of Swift's pool. The next tick reports (counters are totals).
            if self.composition.local.storage.indexesLoaded { self.reportMetrics() }
            return true
        }
    }
}
