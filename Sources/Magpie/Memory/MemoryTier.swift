import Glibc

/// The memory tier: a sharded, lock-striped, byte-budgeted table with S3-FIFO-family eviction (a small
/// FIFO whose share of the budget tunes itself, a CLOCK main queue, two ghosts whose memory tunes itself,
/// and admission to the main queue by how often a key was missed for its size, with a threshold that
/// tunes itself; an entry over twice the mean size earns its place from a read or a ghost hit in
/// proportion to its size).
///
/// A key's XXH3 hash picks one of ``shardCount`` shards (a power of two); each shard has its own lock,
/// index, queues and a share of ``budget``. Two keys in different shards never contend.
///
/// Every entry is charged `key bytes + value bytes + ` ``entryOverhead``. The tier's charge never
/// exceeds its budget, not even during a store: room is made before the entry goes in. The budget acts
/// as one: a shard lends the room it does not use to a shard that needs it for a large entry, so an entry
/// of up to ``largestStorableValue`` bytes (at least half the budget, whatever the shard count) is kept,
/// and a large store into a tier that has room evicts nothing. In a full tier the other shards evict
/// equal parts for it, each keeping at least half its share; the room goes back when the entry goes (see
/// "Budget" at the top of `Memory/ShardStorage.swift`). A larger entry is refused at once, evicting
/// nothing, and counted in ``MemoryTierStatistics/refusals`` (any previous value of that key is removed,
/// so a read never returns a value older than the last store). A tier with a budget of 0 stores nothing.
///
/// Keys are byte strings of 0 to ``maximumKeyLength`` bytes; the empty key is a valid key. A `String`
/// key is its UTF-8 bytes. Values are 0 to ``maximumValueLength`` bytes. All operations are safe to
/// call from any thread.
///
/// ### Implementation Notes
/// The data layout, the eviction policy and its guarantees are described at the top of
/// `Memory/ShardStorage.swift`. A hit takes no lock (`Memory/LockFreeRead.swift`): one hash, a store
/// to the calling thread's own epoch slot, an index probe that compares an 8-bit tag and then the key
/// (two dependent memory reads: bucket, then entry), a byte store the first time an entry is read after
/// the eviction policy cleared its bit, and the copy of the value; it writes no cache line that another
/// thread's hit writes, so hits on the same keys from many cores do not queue. Misses, stores and
/// removals take the key's shard lock.
public final class MemoryTier: Sendable {
    /// Bytes charged per entry beyond its key and value (index bucket at its maximum load, ghost share,
    /// frequency-sketch share, queue slot, entry header, allocator header; see
    /// `Memory/ShardStorage.swift`). An entry with an
    /// expiry is charged 8 bytes more, and one with a group 8 more.
    public static let entryOverhead = 46
    /// The longest key, in bytes.
    public static let maximumKeyLength = HashedKey.maximumLength
    /// The longest value, in bytes.
    public static let maximumValueLength = Int(UInt32.max)
    /// The most shards a tier may have.
    public static let maximumShardCount = 4096

    /// The total byte budget, which the shards share and lend each other.
    public let budget: Int
    /// The configuration it was created with (``Configuration/shardCount`` resolved).
    public let configuration: Configuration
    /// The number of shards (a power of two).
    public let shardCount: Int
    /// The hasher that places keys (seeded by ``Configuration/hashSeed``).
    @usableFromInline package let hasher: KeyHash
    /// The clock that expiry is judged by.
    public let clock: CacheClock

    /// Owns the shards.
    let shards: [Shard]
    /// The same shards, reached without retain/release: a retain and release per operation are two
    /// atomic writes to a line both cores then contend for. Valid while `shards` holds them (as long
    /// as this tier lives).
    let unownedShards: [Unmanaged<Shard>]
    @usableFromInline let shardMask: Int
    /// The budget no shard holds (see Support/BudgetPool.swift).
    let pool: BudgetPool
    /// Lock-free hits, one counter per read-epoch slot, each in its own cache line (see
    /// Memory/LockFreeRead.swift): a hit writes only its thread's line. Freed in deinit.
    nonisolated(unsafe) let hitCounts: UnsafeMutableRawPointer
    /// The process's read epochs (a copy of ``ReadEpochs/handle``).
    let epochs: ReadEpochs.Handle

    /// The default shard count: 8 per core, at least 8, a power of two.
    public static var defaultShardCount: Int {
        let wanted = max(8, ProcessInfoLite.activeProcessorCount * 8)
        var count = 1
        while count < wanted && count < maximumShardCount { count <<= 1 }
        return count
    }

    /// Creates an empty tier.
    /// - Parameters:
    ///   - budget: the byte budget, ≥ 0. With fewer than `shardCount` bytes every store is refused.
    ///   - shardCount: a power of two from 1 to ``maximumShardCount``; nil picks ``defaultShardCount``.
    ///   - hashSeed: the seed of the key hash; nil picks a random one.
    ///   - clock: the clock for expiry; the system's by default (inject one in tests).
    /// - Throws: ``MagpieError/Code/invalidConfiguration`` for a negative budget, a shard count out of
    ///   range or not a power of two, or when the shards' initial arrays cannot be allocated.
    public convenience init(budget: Int, shardCount: Int? = nil, hashSeed: UInt64? = nil, clock: CacheClock = .system)
        throws(MagpieError)
    {
        try self.init(Configuration(budget: budget, shardCount: shardCount, hashSeed: hashSeed, clock: clock))
    }

    /// Creates an empty tier; see ``init(budget:shardCount:hashSeed:clock:)``.
    public convenience init(_ configuration: Configuration) throws(MagpieError) {
        try self.init(configuration, hasher: configuration.hashSeed.map { KeyHash(seed: $0) } ?? .random())
    }

    /// A tier whose keys are placed by `hasher` (a `Cache` passes its disk tier's, so that one hash
    /// serves both tiers); the configuration's seed is not used.
    package init(_ configuration: Configuration, hasher: KeyHash) throws(MagpieError) {
        let budget = configuration.budget
        let clock = configuration.clock
        let shardCount = configuration.shardCount ?? Self.defaultShardCount
        guard budget >= 0 else {
            throw MagpieError(.invalidConfiguration, "memory budget \(budget) is negative")
        }
        guard shardCount >= 1, shardCount <= Self.maximumShardCount, shardCount & (shardCount - 1) == 0
        else {
            throw MagpieError(
                .invalidConfiguration,
                "shard count \(shardCount) must be a power of two from 1 to \(Self.maximumShardCount)")
        }
        guard let epochs = ReadEpochs.handle, let hitCounts = ReadEpochs.allocateCounters() else {
            throw MagpieError(.invalidConfiguration, "out of memory creating the read epochs and hit counters")
        }
        var shards: [Shard] = []
        shards.reserveCapacity(shardCount)
        let pool = BudgetPool(budget - budget / shardCount * shardCount)
        let largestCharge = Self.largestCharge(budget: budget, shardCount: shardCount)
        for _ in 0..<shardCount {
            guard
                let shard = Shard(
                    budget: budget / shardCount, hasher: hasher, clock: clock, pool: pool, largestCharge: largestCharge)
            else {
                free(hitCounts)
                throw MagpieError(.invalidConfiguration, "out of memory creating \(shardCount) shards")
            }
            shards.append(shard)
        }
        self.budget = budget
        var resolved = configuration
        resolved.shardCount = shardCount
        resolved.hashSeed = hasher.seed
        self.configuration = resolved
        self.shardCount = shardCount
        self.hasher = hasher
        self.clock = clock
        self.shards = shards
        self.unownedShards = shards.map { Unmanaged.passUnretained($0) }
        self.shardMask = shardCount - 1
        self.pool = pool
        self.hitCounts = hitCounts
        self.epochs = epochs
    }

    deinit {
        free(hitCounts)
    }

    /// A shard's nominal share of the budget (budget / shards). Shards lend each other room, so it
    /// bounds no entry: see ``largestStorableValue``.
    public var shardBudget: Int { budget / shardCount }

    /// The longest value the tier keeps, for a 0-byte key without expiry or group: the largest charge
    /// (one shard's share plus half a share from every other shard, at least half the budget) less
    /// ``entryOverhead``. A key takes its bytes from it, an expiry and a group 8 bytes each. A value up to
    /// it is kept even in a full tier (other entries are evicted for it); a longer one is refused.
    public var largestStorableValue: Int {
        max(0, Self.largestCharge(budget: budget, shardCount: shardCount) - Self.entryOverhead)
    }

    /// The largest charge a shard can hold: the budget less the half share every other shard keeps.
    static func largestCharge(budget: Int, shardCount: Int) -> Int {
        budget - (shardCount - 1) * (budget / shardCount / 2)
    }

    // MARK: Reads

    /// The value stored for `key`, copied into a new array, or nil.
    @inlinable
    public func value(forKey key: some Sequence<UInt8>) -> [UInt8]? {
        withBytes(key) { copyValue(HashedKey($0, hasher: hasher)) }
    }

    /// The value stored for the UTF-8 bytes of `key`, copied into a new array, or nil.
    @inlinable
    public func value(forKey key: String) -> [UInt8]? {
        withBytes(key) { copyValue(HashedKey($0, hasher: hasher)) }
    }

    /// Calls `body` with the stored value's bytes in place, without copying them, and returns its
    /// result; nil (and `body` is not called) when the key is absent.
    ///
    /// `body` runs without the shard's lock (the bytes stay valid and unchanged until it returns, even if
    /// the key is replaced, removed or evicted meanwhile): do not let the buffer escape. It may call back
    /// into this tier. Keep it short all the same: memory that any store frees while it runs is held until
    /// it returns (``MemoryTierStatistics/unreclaimedBytes``). One exception: when more than 256 threads read
    /// at once, those beyond the first 256 read under the shard's lock, `body` included, and a `body` that
    /// calls back into the tier for a key of the same shard then deadlocks.
    @inlinable
    public func withValue<R>(forKey key: some Sequence<UInt8>, _ body: (UnsafeRawBufferPointer) -> R)
        -> R?
    {
        withBytes(key) { withValue(HashedKey($0, hasher: hasher), body) }
    }

    /// ``withValue(forKey:_:)-(Sequence<UInt8>,_)`` for a `String` key.
    @inlinable
    public func withValue<R>(forKey key: String, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        withBytes(key) { withValue(HashedKey($0, hasher: hasher), body) }
    }

    /// Whether `key` is present. Does not count as a read and does not affect eviction.
    @inlinable
    public func contains(_ key: some Sequence<UInt8>) -> Bool {
        withBytes(key) { contains(HashedKey($0, hasher: hasher)) }
    }

    /// ``contains(_:)-(Sequence<UInt8>)`` for a `String` key.
    @inlinable
    public func contains(_ key: String) -> Bool {
        withBytes(key) { contains(HashedKey($0, hasher: hasher)) }
    }

    // MARK: Writes

    /// Stores a copy of `value` for `key`, replacing any previous value.
    /// - Parameters:
    ///   - value: the bytes to store.
    ///   - key: the key's bytes.
    ///   - expiry: when the entry stops being served (by ``clock``); an instant already past stores nothing
    ///     and removes the key.
    ///   - group: a group to remove it with, see ``removeAll(inGroup:)``; nil or empty for none.
    /// - Returns: true if stored; false if refused (longer than ``largestStorableValue`` allows, or out
    ///   of memory), in which case the key is absent afterwards.
    /// - Throws: ``MagpieError/Code/keyTooLong`` or ``MagpieError/Code/valueTooLarge``; the tier is
    ///   unchanged then.
    @inlinable @discardableResult
    public func set(
        _ value: some Sequence<UInt8>, forKey key: some Sequence<UInt8>, expiry: Expiry = .never, group: String? = nil
    ) throws(MagpieError) -> Bool {
        try withBytes(key) { keyBytes in
            withBytes(value) { set($0, for: HashedKey(keyBytes, hasher: hasher), expiry: expiry, group: group) }
        }.get()
    }

    /// ``set(_:forKey:expiry:group:)-(Sequence<UInt8>,Sequence<UInt8>,_,_)`` for a `String` key.
    @inlinable @discardableResult
    public func set(_ value: some Sequence<UInt8>, forKey key: String, expiry: Expiry = .never, group: String? = nil)
        throws(MagpieError) -> Bool
    {
        try withBytes(key) { keyBytes in
            withBytes(value) { set($0, for: HashedKey(keyBytes, hasher: hasher), expiry: expiry, group: group) }
        }.get()
    }

    /// Removes every entry stored with `group`. Costs a walk over every entry of every shard.
    /// - Returns: the number of entries removed.
    @discardableResult
    public func removeAll(inGroup group: String) -> Int {
        guard !group.isEmpty else { return 0 }
        let tag = hasher.groupTag(group)
        return shards.reduce(0) { total, shard in total + shard.withLock { $0.removeGroup(tag) } }
    }

    /// Removes every entry whose expiry has passed. Expired entries are misses at once whether or not
    /// this runs; it reclaims their memory early.
    /// - Returns: the number of entries removed.
    @discardableResult
    public func removeExpired() -> Int {
        shards.reduce(0) { total, shard in total + shard.withLock { $0.removeExpired() } }
    }

    /// Removes `key`; returns whether it was present.
    @inlinable @discardableResult
    public func removeValue(forKey key: some Sequence<UInt8>) -> Bool {
        withBytes(key) { remove(HashedKey($0, hasher: hasher)) }
    }

    /// ``removeValue(forKey:)-(Sequence<UInt8>)`` for a `String` key.
    @inlinable @discardableResult
    public func removeValue(forKey key: String) -> Bool {
        withBytes(key) { remove(HashedKey($0, hasher: hasher)) }
    }

    /// Removes every entry. Statistics counters are kept.
    public func removeAll() {
        for shard in shards { shard.withLock { $0.removeAll() } }
    }

    // MARK: Size and statistics

    /// The number of entries.
    public var count: Int {
        shards.reduce(0) { total, shard in total + shard.withLock { $0.count } }
    }

    /// The sum of the entries' charges; never more than ``budget``.
    ///
    /// A removed or replaced entry's memory may be reclaimed lazily (when the eviction queue reaches it,
    /// or when removed entries outnumber live ones in a queue); until then it is still held, and so is
    /// still charged. Eviction reclaims such memory before it evicts any live entry.
    public var chargedBytes: Int {
        shards.reduce(0) { total, shard in total + shard.withLock { $0.charged } }
    }

    /// The counters summed over all shards.
    public var statistics: MemoryTierStatistics {
        var total = MemoryTierStatistics()
        for shard in shards {
            let part = shard.withLock { storage in
                var part = storage.counters
                part.entries = storage.count
                part.chargedBytes = storage.charged
                part.unreclaimedBytes = storage.retired.bytes + storage.retired.spareBytes
                return part
            }
            total.add(part)
        }
        total.hits &+= ReadEpochs.sum(hitCounts)
        return total
    }
}
