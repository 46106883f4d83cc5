/// A snapshot of a ``Cache``'s counters, per tier and for the façade.
///
/// The counts add up: every read that consults memory is a memory hit or miss; every memory miss of
/// a two-tier cache is a disk hit or miss (reads that fail with an error aside), so
/// ``hits`` + ``misses`` = `memory.hits + memory.misses`. With a remote tier, a local copy that may not
/// be served (``RemoteTierStatistics/unservedCopies``) is no hit, and a read the local tiers could not
/// answer is a hit or a miss of the store (``RemoteTierStatistics/readHits``, ``RemoteTierStatistics/readMisses``);
/// the sum holds the same way. `Cache.contains(_:)` is not a read.
public struct CacheStatistics: Sendable, Hashable {
    /// The memory tier's counters.
    public var memory: MemoryTierStatistics
    /// The disk tier's counters; nil for a memory-only cache.
    public var disk: DiskTierStatistics?
    /// Disk hits copied into memory.
    public var promotions: UInt64
    /// Loads started by ``Cache/value(forKey:options:loader:load:)-(String,_,_,_)`` (one per coalesced group of callers).
    public var loaderRuns: UInt64
    /// Callers that joined a load already running for their key instead of starting one.
    public var loaderCoalesced: UInt64
    /// Loads that threw (their error reached every waiter; nothing was cached).
    public var loaderFailures: UInt64
    /// Loader calls served a fresh value (see ``EntryOptions/freshFor``).
    public var freshHits: UInt64 = 0
    /// Loader calls served a stale value: with stale-while-revalidate, while the key was throttled after a
    /// failed load, in place of a failed or timed-out load (fail-safe), or at a soft timeout.
    public var staleHits: UInt64 = 0
    /// Loader calls answered by a remembered absence (``LoaderOptions/negativeLifetime``).
    public var negativeHits: UInt64 = 0
    /// Loads started in the background (stale-while-revalidate and eager refresh), part of ``loaderRuns``.
    public var backgroundRefreshes: UInt64 = 0
    /// Failed loads after which a stale value stood in (served to the callers that waited, and kept for
    /// ``LoaderOptions/failSafeThrottle`` without another load).
    public var failSafeActivations: UInt64 = 0
    /// Callers whose wait ended at ``LoaderOptions/softTimeout``.
    public var softTimeouts: UInt64 = 0
    /// Callers whose wait ended at ``LoaderOptions/hardTimeout``.
    public var hardTimeouts: UInt64 = 0
    /// Loads whose value was not stored because a store or removal of the key came while they ran (their
    /// callers still got the value).
    public var loadsSuperseded: UInt64 = 0
    /// Disk operations that failed with an I/O error or a full file system (each was logged).
    public var diskErrors: UInt64
    /// Subscript reads and stores (``Cache`` and ``TypedCache``) that failed: a subscript cannot throw,
    /// so it logs the error, counts it here and reads nil.
    public var subscriptFailures: UInt64 = 0
    /// Async disk reads done on their caller's task, with no hop to an I/O thread (hits and misses alike,
    /// `contains` included; see ``Cache/Configuration/inlineResidentDiskReads``). The rest of the async
    /// disk reads hopped.
    public var inlineDiskReads: UInt64 = 0
    /// Async stores (`cache.async.set`) done on the caller's task, their disk half a memtable append that
    /// needed neither the file nor a wait (see ``Cache/Configuration/inlineDiskStores``); the others hopped.
    public var inlineDiskStores: UInt64 = 0
    /// The remote tier's figures; nil without one.
    public var remote: RemoteTierStatistics? = nil

    /// Reads answered by a tier (memory, disk, or the remote tier).
    public var hits: UInt64 {
        let local = memory.hits &+ (disk?.hits ?? 0)
        guard let remote else { return local }
        return local &- min(local, remote.unservedCopies) &+ remote.readHits
    }
    /// Reads answered by no tier.
    public var misses: UInt64 { remote?.readMisses ?? disk?.misses ?? memory.misses }
    /// hits / (hits + misses), or 0 before the first read.
    public var hitRatio: Double {
        let reads = hits + misses
        return reads == 0 ? 0 : Double(hits) / Double(reads)
    }

    /// A snapshot with the given parts.
    public init(
        memory: MemoryTierStatistics = MemoryTierStatistics(), disk: DiskTierStatistics? = nil, promotions: UInt64 = 0,
        loaderRuns: UInt64 = 0, loaderCoalesced: UInt64 = 0, loaderFailures: UInt64 = 0, diskErrors: UInt64 = 0
    ) {
        self.memory = memory
        self.disk = disk
        self.promotions = promotions
        self.loaderRuns = loaderRuns
        self.loaderCoalesced = loaderCoalesced
        self.loaderFailures = loaderFailures
        self.diskErrors = diskErrors
    }
}

extension Cache {
    /// The counters of every tier and of the façade. Costs a lock of every memory shard and disk bucket;
    /// right after an open it also waits for the disk buckets' indexes still loading (milliseconds after
    /// a clean close, a scan of every bucket file after a crash; see ``DiskTier/statistics``).
    public var statistics: CacheStatistics {
        var statistics = CacheStatistics(memory: memory.statistics, disk: composition.local.storage.tierStatistics)
        for (counter, field, _) in CacheCounter.table { statistics[keyPath: field] = runtime.value(of: counter) }
        statistics.remote = composition.policy.statistics
        return statistics
    }
}
