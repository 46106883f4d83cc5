import Foundation
import Logging
import Synchronization

/// A two-tier cache: a ``MemoryTier`` in front of an optional ``DiskTier``, each within its own byte budget.
///
/// ```swift
/// let cache = try Cache(Cache.Configuration(directory: "/var/cache/thumbnails"))
/// cache["avatar:42"] = pngBytes                // both tiers
/// let bytes = cache["avatar:42"]               // memory, else disk (then promoted into memory)
/// cache["avatar:42"] = nil                     // removed from both
/// ```
///
/// **Reads** check memory, then disk. A disk hit is copied into memory (promoted) without being
/// written to disk again, with the entry's memory expiry re-applied (see ``EntryOptions/memoryExpiry``);
/// entries stored ``Tiers/diskOnly`` are never promoted. Expired entries are misses at once.
///
/// **Writes** go to both tiers unless the entry's ``EntryOptions/tiers`` say otherwise. The disk write
/// comes first: if it fails, the call throws and neither tier changes. A store with
/// ``Tiers/memoryOnly`` removes the key's older value from disk; one with ``Tiers/diskOnly`` removes
/// it from memory. So a read returns nothing or the value of the latest successful store or removal.
///
/// **Consistency between tiers.** The changes one call makes to both tiers, and a read's disk lookup
/// and promotion, run under a lock striped by the key's hash, so they never interleave for one key:
/// a promotion cannot put back a value that a concurrent store replaced or a removal removed.
/// `removeAll()` and `removeAll(inGroup:)` hold every stripe. A memory hit takes no stripe.
///
/// **Durability** is the disk tier's: a returned removal has reached the kernel, a returned store has
/// once its disk bucket's write buffer is written (see ``DiskTier/Configuration/writeBufferSize``);
/// `flush()` makes both survive power loss. After a crash a read returns nothing or a value stored for its key; removals and
/// group removals that returned are never undone (see <doc:DurabilityAndCrashSafety>).
///
/// **Async.** Every operation has an `async` form on ``async`` (`try await cache.async.value(forKey:)`)
/// that runs disk I/O on ``Configuration/ioThreadCount`` dedicated threads, never on Swift's cooperative
/// pool; a memory hit returns on the caller's executor without a hop. The synchronous forms work in
/// async functions too (they block the calling thread for disk I/O). ``value(forKey:options:loader:load:)-(String,_,_,_)``
/// coalesces concurrent loads of one missing key.
///
/// **Keys** are `String`s (their UTF-8 bytes) or any `Sequence<UInt8>`, 0 to ``maximumKeyLength`` bytes,
/// in every keyed call; a longer key throws ``MagpieError/Code/keyTooLong`` from every call.
///
/// **Errors** are ``MagpieError`` values. The subscript, which cannot throw, logs failures, counts them
/// in ``CacheStatistics/subscriptFailures`` and treats a failed read as a miss.
public final class Cache: Sendable {
    /// The configuration the cache was opened with (bucket count as found on disk).
    public let configuration: Configuration
    @usableFromInline let memory: MemoryTier
    /// The key hash of both tiers (the disk directory's seed, so placement is stable across restarts).
    @usableFromInline let hasher: KeyHash
    /// ``Configuration/defaultOptions`` and ``Configuration/clock``, kept apart: reading them through
    /// `configuration` copied the whole configuration on every store (metrics options included; callgrind).
    let defaultOptions: EntryOptions
    let clock: CacheClock
    let disk: DiskTier?
    let stripes: LockStripes
    let pool: IOThreadPool
    /// Runs the synchronous loader API's loads that must not run on their caller's thread.
    let loaderPool: IOThreadPool
    /// The load running for each key (Cache+Loader.swift), keyed by the key's 64-bit hash; each flight
    /// holds its key's bytes, which every look-up compares.
    let flights = Locked<[UInt64: Flight]>([:])
    /// How many loads `flights` holds: read without the lock by every store and removal, which
    /// supersede a running load of their key only when there is one.
    let flightCount = Atomic<Int>(0)
    /// Keys whose stale value fail-safe serves without loading until the instant given (ms).
    let throttles = Locked<[UInt64: Throttle]>([:])
    /// How many keys `throttles` holds (read without the lock: a stale hit looks only when some are).
    let throttleCount = Atomic<Int>(0)
    let defaultLoaderOptions: LoaderOptions
    let counters = Counters()
    @usableFromInline let closed = Atomic<Bool>(false)
    let logger: Logger
    /// Failures that repeat, each kind logged at most twice per ``Configuration/logInterval``.
    let logs: CacheLogs
    let metrics: MetricsReporter?
    /// The task that writes the disk write buffers every ``Configuration/diskBufferWriteInterval``.
    let bufferWriter = Locked<Task<Void, Never>?>(nil)
    /// The remote tier (``Configuration/remote``), and the thread that applies the changes its store
    /// reports, in order (Cache+Remote.swift).
    let remote: RemoteTier?
    /// Whether ``remote`` is set (for the inlined read paths, which take the remote tier's path then).
    @usableFromInline let hasRemote: Bool
    let coherencePool: IOThreadPool?

    final class Counters: Sendable {
        let promotions = Atomic<UInt64>(0)
        let loaderRuns = Atomic<UInt64>(0)
        let loaderCoalesced = Atomic<UInt64>(0)
        let loaderFailures = Atomic<UInt64>(0)
        let freshHits = Atomic<UInt64>(0)
        let staleHits = Atomic<UInt64>(0)
        let negativeHits = Atomic<UInt64>(0)
        let backgroundRefreshes = Atomic<UInt64>(0)
        let failSafeActivations = Atomic<UInt64>(0)
        let softTimeouts = Atomic<UInt64>(0)
        let hardTimeouts = Atomic<UInt64>(0)
        let loadsSuperseded = Atomic<UInt64>(0)
        let diskErrors = Atomic<UInt64>(0)
        let subscriptFailures = Atomic<UInt64>(0)
        let inlineDiskReads = Atomic<UInt64>(0)
        let inlineDiskStores = Atomic<UInt64>(0)
    }

    /// The longest key, in bytes (a key's UTF-8 bytes for a `String`).
    public static let maximumKeyLength = HashedKey.maximumLength

    /// The longest value a store keeps: the disk tier's ``DiskTier/largestStorableValue`` for a two-tier
    /// cache (measured as the disk tier stores it, compressed when it compresses; a longer value throws
    /// ``MagpieError/Code/valueTooLarge``), else the memory tier's. Values
    /// longer than ``largestMemoryValue`` are kept on disk only. Both are for an empty key without a
    /// group; see the tiers' properties for what a key, a group and an expiry take.
    public var largestStorableValue: Int { disk?.largestStorableValue ?? memory.largestStorableValue }

    /// The longest value the memory tier keeps (``MemoryTier/largestStorableValue``, about half the
    /// memory budget or more); a longer one is refused by memory (counted) and kept on disk only.
    public var largestMemoryValue: Int { memory.largestStorableValue }

    /// Opens a cache: the memory tier, and the disk tier when ``Configuration/disk`` is set.
    /// - Throws: ``MagpieError/Code/invalidConfiguration`` for budgets or counts out of range; the
    ///   disk tier's errors when it cannot open its directory (``MagpieError/Code/directoryLocked``,
    ///   ``MagpieError/Code/directoryUnusable``, ``MagpieError/Code/directoryUnsafe``,
    ///   ``MagpieError/Code/manifestMismatch``, I/O errors).
    public init(_ configuration: Configuration = Configuration()) throws(MagpieError) {
        var resolved = configuration
        var disk: DiskTier? = nil
        if var diskConfiguration = configuration.disk {
            diskConfiguration.clock = configuration.clock
            diskConfiguration.hashSeed = configuration.hashSeed
            diskConfiguration.logger = diskConfiguration.logger ?? configuration.logger
            diskConfiguration.logInterval = configuration.logInterval
            let opened = try DiskTier(diskConfiguration)
            resolved.disk = opened.configuration
            disk = opened
        }
        // One seed for both tiers: the directory's, so placement is stable across restarts.
        let hasher = disk?.hasher ?? configuration.hashSeed.map { KeyHash(seed: $0) } ?? .random()
        do throws(MagpieError) {
            var memoryConfiguration = configuration.memory
            memoryConfiguration.clock = configuration.clock
            memory = try MemoryTier(memoryConfiguration, hasher: hasher)
            resolved.memory = memory.configuration
            resolved.hashSeed = hasher.seed
        } catch {
            try? disk?.close()
            throw error
        }
        self.hasher = hasher
        self.defaultOptions = configuration.defaultOptions
        self.clock = configuration.clock
        self.disk = disk
        self.configuration = resolved
        self.logger = configuration.logger
        logs = CacheLogs(configuration.logger, interval: configuration.logInterval)
        stripes = LockStripes(count: 1024)
        let ioThreads = disk == nil ? 1 : configuration.ioThreadCount
        pool = IOThreadPool(threadCount: ioThreads, name: "magpie-io")
        loaderPool = IOThreadPool(threadCount: configuration.loaderThreadCount, name: "magpie-load")
        defaultLoaderOptions = configuration.defaultLoaderOptions
        let remoteTier = Self.makeRemoteTier(configuration, disk: disk)
        remote = remoteTier?.0
        hasRemote = remoteTier != nil
        coherencePool = remoteTier?.1
        metrics = configuration.metrics.map { MetricsReporter($0) }
        if let interval = configuration.metrics?.interval { startReporting(every: interval) }
        if let disk, disk.configuration.writeBufferSize > 0, let interval = configuration.diskBufferWriteInterval {
            startWritingBuffers(every: interval)
        }
        startRemoteTier()
    }

    /// A memory-only cache with the given budget (the other settings default).
    public convenience init(memoryBudget: Int) throws(MagpieError) {
        try self.init(Configuration(memoryBudget: memoryBudget))
    }

    deinit {
        bufferWriter.withLock { $0?.cancel() }
        pool.shutdown()
        loaderPool.shutdown()
        coherencePool?.shutdown()
        dropRemoteTier()
        metrics?.stop()
    }

    // MARK: Writes

    /// Stores `value` for `key` with `options` (``Configuration/defaultOptions`` when nil), replacing any
    /// previous value in both tiers.
    ///
    /// A value longer than ``largestMemoryValue`` is kept on disk only (counted as a memory refusal); one
    /// longer than ``largestStorableValue`` throws (a memory-only cache refuses it: counted, the key
    /// absent). An expiry already past removes the key.
    /// - Throws: ``MagpieError/Code/keyTooLong`` (key or group), ``MagpieError/Code/valueTooLarge``,
    ///   ``MagpieError/Code/noSpace``, ``MagpieError/Code/ioFailure``, ``MagpieError/Code/closed``. After a
    ///   throw the key keeps its previous value (or has none).
    @inlinable
    public func set(_ value: some Sequence<UInt8>, forKey key: String, options: EntryOptions? = nil) throws(MagpieError) {
        try withHashedKey(key) { key throws(MagpieError) in
            try withBytes(value) { value in Result { () throws(MagpieError) in try set(value, for: key, options: options) } }.get()
        }
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
        supersedeLoads(of: key)
        let options = options ?? defaultOptions
        try write(value, for: key, options: options, stamp: options.stamp(now: clock.now(), hash: key.hash))
    }

    /// A store's writes to both tiers, with its deadlines computed (`stamp`); the key's running load, if
    /// any, is the caller's business (a user's store supersedes it, the load's own landing does not).
    func write(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp) throws(MagpieError) {
        if let send = try writeLocally(value, for: key, options: options, stamp: stamp) { sendWaiting(send) }
    }

    /// A store's writes to the local tiers, the key's stripe held by the caller when there is a disk
    /// tier. `memoryPolicy`: the memory expiry kept beside the disk record (a promotion's is its record's).
    func writeTiers(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, memoryPolicy: Int64, stamp: StoreStamp)
        throws(MagpieError)
    {
        guard let disk else {
            _ = try memory.set(
                value, for: key, deadline: stamp.memory, group: options.group, freshness: stamp.freshness, stamp: stamp.coherence
            ).get()
            return
        }
        do {
            try logged("store") { () throws(MagpieError) in
                let diskExpiry = stamp.disk == 0 ? Expiry.never : .at(millisecondsSince1970: stamp.disk)
                switch options.tiers {
                case .memoryAndDisk:
                    let placement = Self.diskPlacement(options, memoryPolicy: memoryPolicy, stamp: stamp)
                    try disk.store(value, for: key, expiry: diskExpiry, group: options.group, placement: placement)
                    _ = try memory.set(
                        value, for: key, deadline: stamp.memory, group: options.group, freshness: stamp.freshness, stamp: stamp.coherence
                    ).get()
                case .memoryOnly:
                    _ = try disk.removeIfPresent(key)
                    _ = try memory.set(
                        value, for: key, deadline: stamp.memory, group: options.group, freshness: stamp.freshness, stamp: stamp.coherence
                    ).get()
                case .diskOnly:
                    let placement = Self.diskPlacement(options, memoryPolicy: memoryPolicy, stamp: stamp)
                    try disk.store(value, for: key, expiry: diskExpiry, group: options.group, placement: placement)
                    _ = memory.remove(key)
                }
            }
        }
    }

    /// Marks the running load of `key`, if any, superseded, so that its value does not land over this
    /// newer write (see Cache+Loader.swift). Waits while that load's value is landing. Costs one atomic
    /// load when no load runs.
    @inline(__always)
    func supersedeLoads(of key: HashedKey) {
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return }
        supersedeRunningLoad(of: key)
    }

    @inline(never)
    func supersedeRunningLoad(of key: HashedKey) {
        let flight = flights.withLock { flights in flights[key.hash].flatMap { sameKey($0.name, key.bytes) ? $0 : nil } }
        flight?.superseded.withLock { $0 = true }
    }

    /// ``supersedeLoads(of:)`` for a caller that must not wait (an inline async store): false, with nothing
    /// marked, when the key's load is landing now (its value is being stored, with the disk's waits, under
    /// the lock this would take).
    @inline(__always)
    func supersedeLoadsIfImmediate(of key: HashedKey) -> Bool {
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return true }
        let flight = flights.withLock { flights in flights[key.hash].flatMap { sameKey($0.name, key.bytes) ? $0 : nil } }
        guard let flight else { return true }
        return flight.superseded.withLockIfAvailable { $0 = true } != nil
    }

    /// Marks every running load superseded (a removal of all entries, or of a group).
    func supersedeAllLoads() {
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return }
        for flight in flights.withLock({ Array($0.values) }) { flight.superseded.withLock { $0 = true } }
    }

    /// Removes `key` from both tiers (durably on disk). Returns whether either tier held it.
    @discardableResult
    public func removeValue(forKey key: String) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try remove(key) }
    }

    /// `removeValue(forKey:)` for a key of arbitrary bytes.
    @discardableResult @inlinable
    public func removeValue(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try remove(key) }
    }

    @usableFromInline
    func remove(_ key: HashedKey) throws(MagpieError) -> Bool {
        supersedeLoads(of: key)
        return try removeWithoutSuperseding(key)
    }

    /// A removal from both tiers (a load that found nothing lands through this).
    func removeWithoutSuperseding(_ key: HashedKey) throws(MagpieError) -> Bool {
        let (removed, send) = try removeLocally(key)
        if let send { sendWaiting(send) }
        return removed
    }

    /// Removes every entry from both tiers. On disk, bucket after bucket: if it throws, the buckets not
    /// yet emptied keep their entries (memory is emptied regardless).
    public func removeAll() throws(MagpieError) {
        try removeAllThrough()
    }

    /// `removeAll()` in the local tiers.
    func removeAllLocally() throws(MagpieError) {
        try checkOpen()
        supersedeAllLoads()
        try stripes.withAllLocked { () throws(MagpieError) in
            defer { memory.removeAll() }
            if let disk { try logged("remove all") { () throws(MagpieError) in try disk.removeAll() } }
        }
    }

    /// Removes every entry stored with `group` from both tiers; on disk durably (a group tombstone), so
    /// none comes back after a restart. Costs a walk over every entry of both tiers. The empty group is
    /// no group (an entry stored with group "" has none), so `removeAll(inGroup: "")` removes nothing.
    /// - Throws: ``MagpieError/Code/keyTooLong`` for a group name over 65,535 UTF-8 bytes; disk I/O
    ///   errors; ``MagpieError/Code/closed``.
    @discardableResult
    public func removeAll(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        try checkOpen()
        guard !group.isEmpty else { return RemovedEntries() }
        supersedeAllLoads()
        let removed = try removeAllLocally(inGroup: group)
        removeGroupRemotely(group)
        return removed
    }

    /// `removeAll(inGroup:)` in the local tiers only (a group removal reported by the remote store).
    func removeAllLocally(inGroup group: String) throws(MagpieError) -> RemovedEntries {
        try stripes.withAllLocked { () throws(MagpieError) -> RemovedEntries in
            var removed = RemovedEntries()
            if let disk {
                removed.disk = try logged("remove group") { () throws(MagpieError) in try disk.removeAll(inGroup: group) }
            }
            removed.memory = memory.removeAll(inGroup: group)
            return removed
        }
    }

    /// Removes the entries whose expiry has passed from both tiers. Expired entries are misses whether
    /// or not this runs: it reclaims their room early.
    @discardableResult
    public func removeExpired() throws(MagpieError) -> RemovedEntries {
        try checkOpen()
        var removed = RemovedEntries(memory: memory.removeExpired())
        if let disk { removed.disk = try logged("remove expired") { () throws(MagpieError) in try disk.removeExpired() } }
        return removed
    }

    /// Makes every store and removal so far durable (fsync of the disk tier's files and directories).
    /// A memory-only cache has nothing to flush.
    public func flush() throws(MagpieError) {
        try checkOpen()
        if let disk { try logged("flush") { () throws(MagpieError) in try disk.flush() } }
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
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        bufferWriter.withLock { $0?.cancel() }
        pool.shutdown()
        loaderPool.shutdown()
        coherencePool?.shutdown()
        stopRemoteTier(closingStore: waitingForRemote)
        metrics?.stop()
        reportMetrics()
        defer { memory.removeAll() }
        defer { logs.flush() }
        if let disk { try logged("close") { () throws(MagpieError) in try disk.close() } }
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
}
