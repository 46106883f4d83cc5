/// A snapshot of a ``DiskTier``'s counters, summed over its buckets (each read under its lock).
public struct DiskTierStatistics: Sendable, Hashable {
    /// Reads that found a live, intact, unexpired record.
    public var hits: UInt64 = 0
    /// Reads that did not.
    public var misses: UInt64 = 0
    /// Values written.
    public var writes: UInt64 = 0
    /// Live entries removed by a remove, a group removal or remove-all.
    public var removals: UInt64 = 0
    /// Live entries evicted to keep the tier within its budget (only when no bucket had room to lend).
    public var evictions: UInt64 = 0
    /// Regions reclaimed, oldest first, to make room (their entries evicted but for those reinserted).
    public var regionsReclaimed: UInt64 = 0
    /// Regions emptied out of turn: to heal damage met by a read, or to give room back to the tier.
    public var regionsEvacuated: UInt64 = 0
    /// Entries a reclaim (or a heal) copied into the newest region rather than evict, and their bytes.
    public var reinsertions: UInt64 = 0
    public var reinsertedBytes: UInt64 = 0
    /// Bytes the tier wrote to its bucket files since the open: records (reinserted ones too) and region
    /// headers. Divided by the bytes of keys and values stored, the tier's own write amplification.
    public var bytesWritten: UInt64 = 0
    /// Regions in the bucket files.
    public var regions: Int = 0
    /// Records (or byte ranges, or whole bucket files) found corrupt by their checksums or structure,
    /// on open or on read. Each was skipped and dropped; none was ever returned.
    public var corruptRecords: UInt64 = 0
    /// Bucket files whose end was cut off on open (a torn last append, or garbage after the last record).
    public var truncatedTails: UInt64 = 0
    /// Bucket files absent (or links) when the tier opened a directory that has a MANIFEST (deleted
    /// from outside) — or, after an open that read SIZES and opened no bucket file, when their bucket
    /// loaded: each was recreated empty, and the entries it held became misses.
    public var missingBucketFiles = 0
    /// Entries dropped because they had expired.
    public var expired: UInt64 = 0
    /// Buckets whose index came from the snapshot of a clean close instead of a full scan.
    public var bucketsOpenedFromSnapshot = 0
    /// Live entries.
    public var entries: Int = 0
    /// Bytes of the live entries' records.
    public var liveBytes: Int = 0
    /// Bytes of all bucket files (never more than the budget).
    public var bytesOnDisk: Int = 0
    /// Bytes of the buckets' memtables: stores not yet written to the files (see
    /// ``DiskTier/Configuration/writeBufferSize``); memory, not disk.
    public var bufferedBytes: Int = 0
    /// Entries a recovery dropped because damage it could not read followed them in their bucket (it may
    /// have held their removal or a newer value: see ``DiskTier``, **Errors**).
    public var droppedForDamage: UInt64 = 0
    /// Stores that had returned but were lost while in a memtable, because writing it failed (they read
    /// as misses).
    public var lostBufferedStores: UInt64 = 0
    /// Bytes of the in-memory indexes.
    public var indexBytes: Int = 0
    /// Value bytes given to ``DiskTier/set(_:forKey:expiry:group:)-(Sequence<UInt8>,Sequence<UInt8>,_,_)`` since open.
    public var originalValueBytes: UInt64 = 0
    /// Payload bytes those values took on disk after compression.
    public var storedValueBytes: UInt64 = 0

    /// Creates an all-zero snapshot.
    public init() {}

    /// storedValueBytes / originalValueBytes: below 1 when compression pays (1 before any write).
    public var compressionRatio: Double {
        originalValueBytes == 0 ? 1 : Double(storedValueBytes) / Double(originalValueBytes)
    }

    /// Index bytes per live entry.
    public var indexBytesPerEntry: Double {
        entries == 0 ? 0 : Double(indexBytes) / Double(entries)
    }
}
