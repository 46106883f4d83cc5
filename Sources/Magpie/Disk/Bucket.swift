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

struct BucketState {
    let context: BucketContext
    var fd: Int32 = -1
    /// The size of this file's slots: its header's (the tier's for a new or emptied file).
    var regionSize: Int
    /// Slots in the file: it takes `BucketFileHeader.size + slotCount × regionSize` bytes of the budget
    /// (`size`), and is as long as what was written of them, no longer (its last slot may be written in
    /// part only, and a free slot past the end of what was written is not in it).
    var slotCount = 0
    /// The file's regions, oldest first; records are appended to the last (Bucket+Regions.swift).
    var regions: [Region] = []
    /// Per slot: whether no region holds it.
    var freeSlots: [Bool] = []
    /// Regions open only in slots below this (while the file shrinks: Bucket+Room.swift).
    var allocationCeiling = Int.max
    /// The sequence number of the next region opened.
    var nextRegionSequence: UInt64 = 1
    /// The highest record sequence number written; the bucket stamps its next record with the one after.
    var maximumSequence: UInt64 = 0
    /// Bytes of the budget the file takes: its header and its slots (the file itself may be shorter).
    var size: Int { BucketFileHeader.size + slotCount * regionSize }
    /// Bytes of the live records in the file (the index's slots that are not pending).
    var liveBytes = 0
    /// Live records still in a memtable, and their bytes.
    var pendingCount = 0
    var pendingBytes = 0
    /// The memtable stores append to, and the one being written (Disk/Memtable.swift).
    var active: Memtable? = nil
    var sealing: Memtable? = nil
    /// Whether a thread has taken `sealing` to write it.
    var sealingClaimed = false
    /// The parity of the next memtable made.
    var nextParity = 0
    /// Empty (no slots allocated) until the load.
    var index = BucketIndex(capacity: 0)
    var counters = BucketCounters()
    /// The file's mapping for reads (see FileMapping.swift); nil: reads use `pread`.
    var mapping: FileMapping? = nil
    /// Healing (Bucket+Heal.swift), done when the operation that found damage ends (not at once: it may
    /// still hold index positions): regions (by sequence) whose damage is known (a value whose payload
    /// does not verify), emptied into the newest region; regions whose damage may hide tombstones, which go
    /// with every older region; whether a read met damage, so that every region is checked.
    var damaged: [UInt64] = []
    var hiddenDamage: [UInt64] = []
    var needsScrub = false
    /// A memtable that failed to be written, its stores lost: thrown by the next store, `writeBuffers` or
    /// `flush`.
    var sealFailure: MagpieError? = nil
    /// A write that failed may have left records in the file that no slot points at (the sequence of its
    /// region; `.max` after a freed region's header could not be zeroed, see `zeroHeaders`): until that
    /// region is gone, removals and overwrites of keys that are not indexed write a tombstone all the
    /// same, and the close writes no snapshot.
    var unindexedRegion: UInt64? = nil
    /// A store detached the active memtable but did not return `.storedAndDetached` (its tombstone needed
    /// room first, or failed): the next store that succeeds returns it, so that the sealer is told.
    var sealingNotHandedOver = false
    /// The file's header is not in the file: emptying it for its first 2 MiB range took it away, and writing
    /// it back failed (Bucket+HugePages.swift). The next change of the file writes it first.
    var headerMissing = false
    /// A seal's records placed in the file, their write not yet settled (Bucket+Flight.swift): settled
    /// before anything else changes the file.
    var flight: SealFlight? = nil
    /// The most bytes the file may hold now: its share, plus what it borrowed, less what it lent.
    var limit: Int
    /// Whether the index has been loaded (Bucket+Recovery.swift): until then `index`, the regions and
    /// `liveBytes` say nothing of the file.
    var loaded = false
    /// The bytes of the index snapshot found at the open, charged to the tier's budget until it is
    /// deleted (see ``DiskLedger``).
    var snapshotCharge = 0
    /// Loaded from its snapshot, which is still in the directory (see Bucket+Snapshot.swift): it must
    /// be deleted (``beforeFileChange()``) before the file changes.
    var keepsSnapshot = false
    /// The closed length the file's header holds (OnDiskFormat.swift); set back to 0 in the file before
    /// its first change (``beforeFileChange()``).
    var closedLength = 0
    /// For a bucket whose file the open did not open (SIZES told its size; `fd` is -1 until its load
    /// opens it): that size.
    var recordedFileSize = 0
    /// Set by `close()`: every operation then throws ``MagpieError/Code/closed``.
    var closed = false

    init(context: BucketContext) {
        self.context = context
        self.limit = context.share
        self.regionSize = context.shared.regionSize
    }

    /// A bucket as SIZES describes it: its file not opened yet (its load opens it), its limit from the
    /// recorded size, its snapshot charged.
    init(context: BucketContext, recordedFileSize: Int, snapshotCharge: Int) {
        self.context = context
        self.limit = max(context.share, recordedFileSize)
        self.recordedFileSize = recordedFileSize
        self.snapshotCharge = snapshotCharge
        self.regionSize = context.shared.regionSize
    }

    var isOpen: Bool { !closed }

    func checkOpen() throws(MagpieError) {
        guard isOpen else { throw MagpieError(.closed, "the disk tier is closed", path: context.path) }
        if let failure = context.health.failure { throw failure }
    }

    /// Live entries in the file (not pending).
    var fileEntryCount: Int { index.count - pendingCount }

    /// Removes the slot at `position` from the index and returns it.
    mutating func take(at position: Int) -> DiskSlot {
        let slot = index[position]
        drop(at: position)
        return slot
    }

    /// Removes the slot at `position` from the index (its record becomes garbage).
    mutating func drop(at position: Int) {
        let slot = index[position]
        if slot.isPending {
            pendingCount -= 1
            pendingBytes -= slot.length
        } else {
            liveBytes -= slot.length
        }
        index.remove(at: position)
    }

    /// Adds `slot` to the index.
    mutating func insert(_ slot: DiskSlot) {
        if slot.isPending {
            pendingCount += 1
            pendingBytes += slot.length
        } else {
            liveBytes += slot.length
        }
        index.insert(slot)
    }

    mutating func flush() throws(MagpieError) {
        try checkOpen()
        settleFlight()
        try FileIO.sync(fd, path: context.path)
    }

    mutating func close() {
        settleFlight()  // its write must be done before the descriptor goes
        mapping?.unmap()
        mapping = nil
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
        active = nil
        if !sealingClaimed { sealing = nil }
        closed = true
    }

    /// Maps the current file for reads, replacing the mapping of any previous one. Called with the lock
    /// held whenever `fd` changes or the file grows past the mapping, before anything reads through it.
    mutating func remap(length: Int? = nil) {
        mapping?.unmap()
        mapping = context.mappedReads && fd >= 0 ? FileMapping.map(fd, length: length ?? max(context.share, limit)) : nil
    }

}
