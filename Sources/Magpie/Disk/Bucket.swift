import Glibc
import Logging

// MARK: - A bucket: one file of regions, its memtables, its index, its lock
//
// Every operation on a bucket runs with its lock held (`Locked<BucketState>`), so a bucket's file,
// regions, memtables and index always change together. I/O that fails leaves the index describing only
// records that are in the file or in a memtable.
//
// Writes. A store copies its record, unsealed, into the bucket's active memtable and points the key's
// index slot at it (Disk/Memtable.swift); the tier's sealer thread later compresses and hashes the
// memtable's records outside the lock and writes the live ones into the file under it
// (Disk/Bucket+Seal.swift). A removal, and an overwrite of a record already in the file, write a small
// tombstone at once (so that a returned removal, or a returned overwrite whose new value was still in a
// memtable, survives the process being killed); a removal of a record still in a memtable writes nothing.
// Nothing in the file is ever changed in place: liveness is the index's, and tombstones'.
//
// The file is a header and slots of `regionSize` bytes; records are appended to the newest region, and
// when it is full a new region opens in a free slot (Format/OnDiskFormat.swift; Disk/Bucket+Regions.swift).
// A bucket short of slots first grows its file, borrowing room from the tier (DiskLedger.swift,
// Bucket+Room.swift); only when the tier has none left does it reclaim its oldest region (FIFO):
//
//   Reclaim. The oldest region's live entries are evicted — all but those read often enough since they
//   were written (or last reinserted) for their size: credits × mean record length ≥ `reinsertion` ×
//   length (`DiskTier.Configuration.reinsertionThreshold`, default 5; credits count reads, up to 7), which
//   are copied into the newest region (reinserted, with their credits back to 0), at most three quarters of
//   a region's worth per reclaim. Then the region's slot is reused (its header overwritten) or its header
//   zeroed. Its tombstones go with it: everything they cover is older, so it was in that region or an
//   older one, which are gone. So a reclaim copies only the entries that were read, never cold ones (the
//   write amplification of a plain FIFO plus what is reinserted), and needs no temporary file: the whole
//   budget holds entries.
//
// Why size-aware: on the eviction-heavy benchmark a 4 KiB random value costs 7 times the bytes of a
// compressed JSON value to reinsert, for the same hit; reinserting every read entry raised the hit ratio
// by 5 points over FIFO but the bytes written by 45 % (a Python model, docs/lab-notes/disk.md).
//
// The state, by role. `BucketState` is what the lock guards; it holds a part per role, each a struct with
// its own fields (and the methods that need nothing else), the way foyer-storage gives its region manager,
// indexer, flusher and reclaimer each their own state:
//   layout     BucketLayout: the file (descriptor, mapping), its slots and regions oldest first, the free
//              slots, the sequence numbers the next region and record take, and the limit the file may grow
//              to. Its geometry (a region's start and capacity, free runs) is its own; appending, opening and
//              reclaiming regions (Bucket+Regions.swift, Bucket+Reclaim.swift) and lending room
//              (Bucket+Room.swift, Bucket+HugePages.swift) change it.
//   index      BucketIndex: key tag → record, in the file or in a memtable; with `tally` (IndexTally), its
//              live and pending bytes, kept by `insert` and `drop` only.
//   memtables  BucketMemtables: the active and the sealing memtable, whether a thread has claimed the
//              latter, what the sealer is owed, a failed seal's error, and a seal's write done without the
//              lock until it is settled (Bucket+Seal.swift, Bucket+RecordWrite.swift).
//   damage     BucketDamage: damage found and not yet healed, and the region a failed write may have left
//              records in that no slot points at (Bucket+Heal.swift).
//   life       BucketLife: loaded, closed; the snapshot it was loaded from and its charge, the size SIZES
//              recorded, the header's closed length and a header huge pages took away — what the open found
//              beside the file and what must go before the file first changes (Bucket+Recovery.swift,
//              Bucket+Snapshot.swift).
//   counters   BucketCounters, read by the tier's statistics.
// The operations that cross parts (a store, a read, a seal's commit, a reclaim, a heal, a load) stay on
// `BucketState`, each in the file of its role. Why parts and not objects of their own: one lock already
// orders every change to a bucket, and the invariants cross the parts (an index slot points into a region
// or a memtable; a snapshot must go before a region changes), so each part is a struct stored inline —
// a read reaches a field at a fixed offset in the one state the lock guards, as before the split (a
// class per part would add a pointer chase and a reference count to every read, and lock nothing more).

/// What every bucket of a tier shares: one object, so that a bucket's context (and every copy of its
/// state) holds three references, not a dozen (the open builds one per bucket).
final class BucketShared: Sendable {
    let directory: CacheDirectory
    let share: Int
    let hasher: KeyHash
    /// The clock expiry is judged by.
    let clock: CacheClock
    let bucketCount: Int
    /// The tier's budget beyond the buckets' own limits (DiskLedger.swift).
    let ledger: DiskLedger
    /// The tier's health: once the directory was found replaced, every operation fails.
    let health: TierHealth
    /// Where damage and failures are logged (each kind at most twice per interval).
    let logs: DiskLogs
    /// Read through a mapping of the file (``DiskTier/Configuration/mappedReads``).
    let mappedReads: Bool
    /// Grow the file in whole 2 MiB ranges held as huge pages (``DiskTier/Configuration/hugePageFiles``,
    /// Bucket+HugePages.swift).
    let hugePages: Bool
    /// Bytes of a memtable (Disk/Memtable.swift); 0: every store is written before it returns.
    let writeBuffer: Int
    /// The SIZES a clean close left, deleted before any bucket file first changes (Bucket+Snapshot.swift).
    let sizesFile: SizesFile
    /// The region size of a new (or emptied) bucket file.
    let regionSize: Int
    /// Reinsert an entry when credits × mean length ≥ this × its length (see the top of this file).
    let reinsertionThreshold: Int
    /// Compression of the sealed records; nil stores every value raw.
    let compression: ZstdPool?
    /// Values shorter than this are stored raw.
    let minimumCompressibleLength: Int

    init(
        directory: CacheDirectory, share: Int, hasher: KeyHash, clock: CacheClock, bucketCount: Int, ledger: DiskLedger,
        health: TierHealth, logs: DiskLogs, mappedReads: Bool, hugePages: Bool, writeBuffer: Int, sizesFile: SizesFile, regionSize: Int,
        reinsertionThreshold: Int, compression: ZstdPool?, minimumCompressibleLength: Int
    ) {
        self.directory = directory
        self.share = share
        self.hasher = hasher
        self.clock = clock
        self.bucketCount = bucketCount
        self.ledger = ledger
        self.health = health
        self.logs = logs
        self.mappedReads = mappedReads
        self.hugePages = hugePages
        self.writeBuffer = writeBuffer
        self.sizesFile = sizesFile
        self.regionSize = regionSize
        self.reinsertionThreshold = reinsertionThreshold
        self.compression = compression
        self.minimumCompressibleLength = minimumCompressibleLength
    }
}

/// What tells a bucket apart, and (through `shared`) what every bucket of its tier shares.
struct BucketContext: Sendable {
    let number: Int
    /// The file's name in `buckets/` ("00" … "ff").
    let name: String
    /// The file's path, for messages and fault injection (files are reached through `directory`).
    let path: String
    let shared: BucketShared

    var directory: CacheDirectory { shared.directory }
    var share: Int { shared.share }
    var hasher: KeyHash { shared.hasher }
    var clock: CacheClock { shared.clock }
    var bucketCount: Int { shared.bucketCount }
    var ledger: DiskLedger { shared.ledger }
    var health: TierHealth { shared.health }
    var logs: DiskLogs { shared.logs }
    var mappedReads: Bool { shared.mappedReads }
    var hugePages: Bool { shared.hugePages }
    var writeBuffer: Int { shared.writeBuffer }
    var sizesFile: SizesFile { shared.sizesFile }
}

struct BucketCounters {
    var hits: UInt64 = 0
    var misses: UInt64 = 0
    var writes: UInt64 = 0
    var removals: UInt64 = 0
    var evictions: UInt64 = 0
    /// Regions reclaimed (oldest first) to make room.
    var reclaims: UInt64 = 0
    /// Regions emptied out of turn: to heal damage, or to give room back to the tier.
    var evacuations: UInt64 = 0
    /// Entries copied into a newer region by a reclaim or an evacuation, and their bytes.
    var reinsertions: UInt64 = 0
    var reinsertedBytes: UInt64 = 0
    /// Bytes written to the file: records, region headers.
    var bytesWritten: UInt64 = 0
    var corruptRecords: UInt64 = 0
    var truncatedTails: UInt64 = 0
    var expired: UInt64 = 0
    /// Stores lost because writing their memtable failed.
    var lostBufferedRecords: UInt64 = 0
    /// Entries recovery dropped because unknown damage followed them (Bucket+Recovery.swift).
    var droppedForDamage: UInt64 = 0
    var openedFromSnapshot = false
}

/// What a store did besides storing.
enum DiskStoreOutcome {
    /// Stored; the bucket's memtables need nothing now.
    case stored
    /// Stored, and a memtable was detached: it must be handed to the sealer (or, with no write buffer,
    /// sealed before the store returns).
    case storedAndDetached
    /// Not stored: the active memtable is full and the sealing one is still being written. The caller
    /// waits for it (or writes it), then tries again.
    case busy
}

/// A bucket's state, the value its lock guards (`Locked<BucketState>`): the parts described at the top of
/// this file, each stored inline (a read reaches any field at a fixed offset, as before the split).
struct BucketState {
    let context: BucketContext
    /// Where records lie: the file, its slots and regions, its limit (Bucket+Regions.swift, Bucket+Room.swift).
    var layout: BucketLayout
    /// Key tag → record, for the live entries of the file and of the memtables (BucketIndex.swift). Empty
    /// (no slots allocated) until the load.
    var index = BucketIndex(capacity: 0)
    /// What `index` holds, in counts and bytes (kept by `insert` and `drop`).
    var tally = IndexTally()
    /// The memtables and the seal under way (Bucket+Seal.swift, Bucket+RecordWrite.swift).
    var memtables = BucketMemtables()
    /// Damage found and not yet healed, and records a failed write may have left (Bucket+Heal.swift).
    var damage = BucketDamage()
    /// Open, loaded, closed; and what the open found beside the file (Bucket+Recovery.swift,
    /// Bucket+Snapshot.swift).
    var life = BucketLife()
    var counters = BucketCounters()

    init(context: BucketContext) {
        self.context = context
        self.layout = BucketLayout(regionSize: context.shared.regionSize, limit: context.share)
    }

    /// A bucket as SIZES describes it: its file not opened yet (its load opens it), its limit from the
    /// recorded size, its snapshot charged.
    init(context: BucketContext, recordedFileSize: Int, snapshotCharge: Int) {
        self.context = context
        self.layout = BucketLayout(regionSize: context.shared.regionSize, limit: max(context.share, recordedFileSize))
        life.recordedFileSize = recordedFileSize
        life.snapshotCharge = snapshotCharge
    }

    var isOpen: Bool { !life.closed }

    func checkOpen() throws(MagpieError) {
        guard isOpen else { throw MagpieError(.closed, "the disk tier is closed", path: context.path) }
        if let failure = context.health.failure { throw failure }
    }

    /// Live entries in the file (not pending).
    var fileEntryCount: Int { index.count - tally.pendingCount }

    /// Removes the slot at `position` from the index and returns it.
    mutating func take(at position: Int) -> DiskSlot {
        let slot = index[position]
        drop(at: position)
        return slot
    }

    /// Removes the slot at `position` from the index (its record becomes garbage).
    mutating func drop(at position: Int) {
        tally.remove(index[position])
        index.remove(at: position)
    }

    /// Adds `slot` to the index.
    mutating func insert(_ slot: DiskSlot) {
        tally.add(slot)
        index.insert(slot)
    }

    mutating func flush() throws(MagpieError) {
        try checkOpen()
        settleDeferredWrite()
        try FileIO.sync(layout.fd, path: context.path)
    }

    mutating func close() {
        settleDeferredWrite()  // its write must be done before the descriptor goes
        layout.mapping?.unmap()
        layout.mapping = nil
        if layout.fd >= 0 { Glibc.close(layout.fd) }
        layout.fd = -1
        memtables.active = nil
        if !memtables.sealingClaimed { memtables.sealing = nil }
        life.closed = true
    }

    /// Maps the current file for reads, replacing the mapping of any previous one. Called with the lock
    /// held whenever `fd` changes or the file grows past the mapping, before anything reads through it.
    mutating func remap(length: Int? = nil) {
        layout.mapping?.unmap()
        layout.mapping =
            context.mappedReads && layout.fd >= 0 ? FileMapping.map(layout.fd, length: length ?? max(context.share, layout.limit)) : nil
    }
}

/// What the index holds, in counts and bytes: the live bytes of the file (slots that are not pending), and
/// the live records still in a memtable with their bytes.
struct IndexTally {
    var liveBytes = 0
    var pendingCount = 0
    var pendingBytes = 0

    /// `slot` went into the index.
    @inline(__always)
    mutating func add(_ slot: DiskSlot) {
        if slot.isPending {
            pendingCount += 1
            pendingBytes += slot.length
        } else {
            liveBytes += slot.length
        }
    }

    /// `slot` left the index.
    @inline(__always)
    mutating func remove(_ slot: DiskSlot) {
        if slot.isPending {
            pendingCount -= 1
            pendingBytes -= slot.length
        } else {
            liveBytes -= slot.length
        }
    }

    /// A pending slot of `pendingLength` bytes now points at its `length`-byte record in the file.
    mutating func settle(pendingLength: Int, length: Int) {
        pendingCount -= 1
        pendingBytes -= pendingLength
        liveBytes += length
    }
}

/// The bucket's life cycle, and what the open found beside the file that must go before the file first
/// changes (``BucketState/beforeFileChange()``): the index snapshot it may have loaded, the closed length
/// the file's header holds, a header that huge pages took away.
struct BucketLife {
    /// Whether the index has been loaded (Bucket+Recovery.swift): until then the index, the regions and
    /// the tally say nothing of the file.
    var loaded = false
    /// Set by `close()`: every operation then throws ``MagpieError/Code/closed``.
    var closed = false
    /// The bytes of the index snapshot found at the open, charged to the tier's budget until it is
    /// deleted (see ``DiskLedger``).
    var snapshotCharge = 0
    /// Loaded from its snapshot, which is still in the directory (see Bucket+Snapshot.swift): it must
    /// be deleted (``BucketState/beforeFileChange()``) before the file changes.
    var keepsSnapshot = false
    /// For a bucket whose file the open did not open (SIZES told its size; the descriptor is -1 until its
    /// load opens it): that size.
    var recordedFileSize = 0
    /// The closed length the file's header holds (OnDiskFormat.swift); set back to 0 in the file before
    /// its first change (``BucketState/beforeFileChange()``).
    var closedLength = 0
    /// The file's header is not in the file: emptying it for its first 2 MiB range took it away, and writing
    /// it back failed (Bucket+HugePages.swift). The next change of the file writes it first.
    var headerMissing = false
}
