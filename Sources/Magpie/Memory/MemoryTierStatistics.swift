/// A snapshot of a ``MemoryTier``'s counters, summed over its shards.
///
/// Counters are cumulative since the tier was created (``MemoryTier/removeAll()`` keeps them);
/// ``entries`` and ``chargedBytes`` describe the contents at the moment of the snapshot. Each shard is
/// read under its lock, one after another, so a snapshot taken while other threads write is a sum of
/// per-shard snapshots, not one instant.
public struct MemoryTierStatistics: Sendable, Hashable {
    /// Reads that found the key.
    public var hits: UInt64 = 0
    /// Reads that did not.
    public var misses: UInt64 = 0
    /// Stores of a key that was not present.
    public var inserts: UInt64 = 0
    /// Stores that replaced a present key's value.
    public var updates: UInt64 = 0
    /// Inserts sent straight to the main queue because the key had been missed often enough for its
    /// size (see "Admission" in `Memory/ShardStorage+Admission.swift`); part of ``inserts``.
    public var admittedByMisses: UInt64 = 0
    /// Inserts sent straight to the main queue because a ghost remembered the key's eviction, within
    /// the ghosts' window (see `Memory/ShardStorage+Ghost.swift`); part of ``inserts``.
    public var admittedByGhost: UInt64 = 0
    /// Entries removed by ``MemoryTier/removeValue(forKey:)-(String)``, ``MemoryTier/removeAll()`` or
    /// ``MemoryTier/removeAll(inGroup:)``, or
    /// dropped because a store that would have replaced them was refused. With ``inserts`` and
    /// ``evictions`` and ``expirations`` it accounts for every entry:
    /// `entries == inserts - removals - evictions - expirations`.
    public var removals: UInt64 = 0
    /// Entries evicted to make room: in their own shard, or in another one that lent room for a large
    /// entry.
    public var evictions: UInt64 = 0
    /// Entries dropped because their expiry passed (when read, or by ``MemoryTier/removeExpired()``).
    public var expirations: UInt64 = 0
    /// Stores refused: the entry is longer than ``MemoryTier/largestStorableValue`` allows, or memory
    /// could not be allocated.
    /// A refused store leaves its key absent.
    public var refusals: UInt64 = 0
    /// Live entries.
    public var entries: Int = 0
    /// The sum of the charges (key + value + ``MemoryTier/entryOverhead``) of live entries and of removed
    /// entries whose memory is not reclaimed yet (see ``MemoryTier/chargedBytes``).
    public var chargedBytes: Int = 0
    /// Bytes held beyond ``chargedBytes`` for the lock-free reads: removed entries not freed yet because
    /// a read that began before they were removed might still be copying them (freed in batches once
    /// those reads end; a read lasts a key comparison and a copy), and up to 32 such blocks per shard
    /// kept for the shard's next stores. See `Memory/LockFreeRead.swift`.
    public var unreclaimedBytes: Int = 0

    /// Creates an all-zero snapshot.
    public init() {}

    /// hits / (hits + misses), or 0 before the first read.
    public var hitRatio: Double {
        let reads = hits + misses
        return reads == 0 ? 0 : Double(hits) / Double(reads)
    }

    mutating func add(_ other: MemoryTierStatistics) {
        hits += other.hits
        misses += other.misses
        inserts += other.inserts
        updates += other.updates
        admittedByMisses += other.admittedByMisses
        admittedByGhost += other.admittedByGhost
        removals += other.removals
        evictions += other.evictions
        expirations += other.expirations
        refusals += other.refusals
        entries += other.entries
        chargedBytes += other.chargedBytes
        unreclaimedBytes += other.unreclaimedBytes
    }
}
