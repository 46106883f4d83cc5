import Synchronization

// What a cache's remote tier did: the public statistics, read from the tier's counters.

/// What a cache's remote tier did (``CacheStatistics/remote``).
public struct RemoteTierStatistics: Sendable, Hashable {
    /// Reads the store answered with a current record.
    public var hits: UInt64 = 0
    /// Reads that found nothing, or a key owed a removal.
    public var misses: UInt64 = 0
    /// Records that were not current: their namespace or group was removed, or they expired.
    public var outdated: UInt64 = 0
    /// Values that were not records of this key: corrupt, torn, foreign, or copied from another key.
    public var corrupt: UInt64 = 0
    /// Failed calls to the store (down, breaker open, timed out): each a miss or an owed removal, never
    /// a caller's error.
    public var errors: UInt64 = 0
    /// Of ``errors``: calls the store refused for lack of memory (``MagpieError/Code/remoteFull``; Redis
    /// over `maxmemory` with nothing its policy may evict). A value refused so is replaced by its
    /// tombstone, so that no instance serves the older one (`MagpieRedis`: "When Redis is full or
    /// evicts its keys").
    public var oomRefusals: UInt64 = 0
    /// Records written.
    public var stores: UInt64 = 0
    /// Removals (keys, groups, everything) the store took.
    public var removals: UInt64 = 0
    /// Removals owed to the store (queued on a failure).
    public var queuedRemovals: UInt64 = 0
    /// Owed removals replayed once the store answered.
    public var replayedRemovals: UInt64 = 0
    /// Removals owed now (keys and groups; 1 for the whole namespace).
    public var owedRemovals: Int = 0
    /// Times the owed removals outgrew ``RemoteTierOptions/maxPendingRemovals`` or the journal's room
    /// (the namespace is then replaced on replay).
    public var pendingOverflows: UInt64 = 0
    /// Keys the store reported changed (change messages and, with foreign writes reported, invalidations).
    public var invalidations: UInt64 = 0
    /// Other instances' changes that replaced a local copy with the value their message carried (no round
    /// trip).
    public var pushesApplied: UInt64 = 0
    /// Other instances' changes that dropped a local copy (a removal, or a value too long to push).
    public var copiesDropped: UInt64 = 0
    /// This instance's own change messages, which change nothing here: it keeps what it wrote.
    public var ownMessages: UInt64 = 0
    /// Change messages older than the local copy (by version), which change nothing.
    public var staleMessages: UInt64 = 0
    /// Gaps in a partition's sequence of change messages (each made that partition's copies misses).
    public var sequenceGaps: UInt64 = 0
    /// Partitions a check of the store's sequence numbers found short (messages lost at their end).
    public var shortPartitions: UInt64 = 0
    /// Times some partitions' copies were made misses (a gap, a feed's lost heartbeat, a short check).
    public var partitionLosses: UInt64 = 0
    /// Remote reads that returned this instance's own write: its local copy had gone (evicted, or dropped
    /// by a change). With change messages a writer keeps its write, so these come from evictions only.
    public var ownWritesFetched: UInt64 = 0
    /// Times every older local copy became a miss (the feed was re-established, or everything changed).
    public var epochBumps: UInt64 = 0
    /// Times the store's numbering of change messages restarted at 0 (its counters were evicted or lost
    /// and made anew).
    public var sequenceRestarts: UInt64 = 0
    /// Confirmations of the change feed.
    public var confirmations: UInt64 = 0
    /// The latest confirmation's lag (ms): from the confirmed instant to its application here.
    public var lastLagMilliseconds: Int64 = 0
    /// The largest confirmation lag seen (ms).
    public var maxLagMilliseconds: Int64 = 0
    /// How long ago (ms) the latest confirmed instant was: past ``RemoteTierOptions/maxDisconnectedStaleness``,
    /// local copies are misses.
    public var unconfirmedMilliseconds: Int64 = 0
    /// How far behind (ms) the fleet's delivery watermark is: the instant before which every instance's
    /// writes reached the store (see ``RemoteChanges/allDelivered(through:)``). Past
    /// ``RemoteTierOptions/maxDisconnectedStaleness`` local copies are misses and fetched values are
    /// withheld, until the instances' owed removals land. 0 with a store that reports none.
    public var undeliveredMilliseconds: Int64 = 0
    /// Whether the store fails fast now (its breaker is open).
    public var failsFast = false
    /// Owed removals taken in from the journal a killed process left in the cache directory.
    public var restoredRemovals: UInt64 = 0
    /// Failed writes of that journal (the removals stay owed in memory).
    public var journalFailures: UInt64 = 0
    /// Values the store gave that were not served (misses instead): the fleet's delivery watermark
    /// was older than ``RemoteTierOptions/maxDisconnectedStaleness``, so an instance may have returned a
    /// write of the key that had not reached the store yet (see <doc:RunningAFleet>).
    public var withheld: UInt64 = 0
    /// Remote hits served but not kept in the local tiers: the change feed was not confirmed recently,
    /// a write of the key by this instance was under way, or a change of the key was reported while it
    /// was fetched. The next read of such a key asks the store again.
    public var unkept: UInt64 = 0
    /// Local copies a read found but could not serve (past their staleness bound, or older than a change
    /// the feed may have missed): each such read went on to the store. Part of the memory and disk hits,
    /// not of ``CacheStatistics/hits``.
    public var unservedCopies: UInt64 = 0
    /// Reads the local tiers could not answer that the store answered (part of ``CacheStatistics/hits``).
    public var readHits: UInt64 = 0
    /// Reads that no tier answered (``CacheStatistics/misses``).
    public var readMisses: UInt64 = 0
    /// Versioned writes and removals the store refused because it held a newer version of the key (a
    /// later write from another instance, or this one's own later write that got there first).
    public var fenced: UInt64 = 0
    /// Load leases taken (this instance ran the loader for the fleet).
    public var leasesAcquired: UInt64 = 0
    /// Loads that found the lease taken and waited.
    public var leaseWaits: UInt64 = 0
    /// Loads that got the lease holder's value instead of loading.
    public var sharedLoads: UInt64 = 0

    /// All zero.
    public init() {}
}

/// The remote tier's counters (``RemoteTier/counters``), shared by its parts and by the composer that reads
/// through it; read into ``RemoteTierStatistics``.
final class RemoteCounters: Sendable {
    let hits = Atomic<UInt64>(0)
    let misses = Atomic<UInt64>(0)
    let errors = Atomic<UInt64>(0)
    let oomRefusals = Atomic<UInt64>(0)
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

    /// A failed call to the store: counted in `errors`, and in `oomRefusals` when refused for lack of
    /// memory; whether it was.
    @discardableResult
    func failed(_ error: any Error) -> Bool {
        errors.add(1, ordering: .relaxed)
        guard MagpieError.code(of: error) == .remoteFull else { return false }
        oomRefusals.add(1, ordering: .relaxed)
        return true
    }
}

extension RemoteTier {
    var statistics: RemoteTierStatistics {
        var s = RemoteTierStatistics()
        s.hits = counters.hits.load(ordering: .relaxed)
        s.misses = counters.misses.load(ordering: .relaxed)
        s.outdated = counters.outdated.load(ordering: .relaxed)
        s.corrupt = counters.corrupt.load(ordering: .relaxed)
        s.errors = counters.errors.load(ordering: .relaxed)
        s.oomRefusals = counters.oomRefusals.load(ordering: .relaxed)
        s.stores = counters.stores.load(ordering: .relaxed)
        s.removals = counters.removals.load(ordering: .relaxed)
        s.queuedRemovals = counters.queuedRemovals.load(ordering: .relaxed)
        s.replayedRemovals = counters.replayedRemovals.load(ordering: .relaxed)
        s.owedRemovals = owed.count
        s.pendingOverflows = counters.pendingOverflows.load(ordering: .relaxed)
        s.invalidations = coherence.invalidations.load(ordering: .relaxed)
        s.pushesApplied = counters.pushesApplied.load(ordering: .relaxed)
        s.copiesDropped = counters.copiesDropped.load(ordering: .relaxed)
        s.ownMessages = counters.ownMessages.load(ordering: .relaxed)
        s.staleMessages = counters.staleMessages.load(ordering: .relaxed)
        s.sequenceGaps = coherence.gaps.load(ordering: .relaxed)
        s.shortPartitions = coherence.shortChecks.load(ordering: .relaxed)
        s.partitionLosses = coherence.partitionLosses.load(ordering: .relaxed)
        s.ownWritesFetched = counters.ownWritesFetched.load(ordering: .relaxed)
        s.epochBumps = coherence.epochBumps.load(ordering: .relaxed)
        s.sequenceRestarts = coherence.sequenceRestarts.load(ordering: .relaxed)
        s.confirmations = coherence.confirmations.load(ordering: .relaxed)
        s.lastLagMilliseconds = coherence.lastLag.load(ordering: .relaxed)
        s.maxLagMilliseconds = coherence.maxLag.load(ordering: .relaxed)
        s.unconfirmedMilliseconds = max(0, clock.now() - coherence.confirmed.load(ordering: .relaxed))
        let delivered = coherence.delivered.load(ordering: .relaxed)
        s.undeliveredMilliseconds = delivered == .max ? 0 : max(0, clock.now() - delivered)
        s.failsFast = store.failsFast
        s.fenced = counters.fenced.load(ordering: .relaxed)
        s.restoredRemovals = counters.restoredRemovals.load(ordering: .relaxed)
        s.journalFailures = counters.journalFailures.load(ordering: .relaxed)
        s.withheld = counters.withheld.load(ordering: .relaxed)
        s.unkept = counters.unkept.load(ordering: .relaxed)
        s.unservedCopies = counters.unserved.load(ordering: .relaxed)
        s.readHits = counters.readHits.load(ordering: .relaxed)
        s.readMisses = counters.readMisses.load(ordering: .relaxed)
        s.leasesAcquired = counters.leasesAcquired.load(ordering: .relaxed)
        s.leaseWaits = counters.leaseWaits.load(ordering: .relaxed)
        s.sharedLoads = counters.sharedLoads.load(ordering: .relaxed)
        return s
    }
}
