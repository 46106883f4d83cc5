import Glibc
import Logging

// MARK: - A bucket: one append-only file, its index, its lock
//
// Every operation on a bucket runs with its lock held (`Locked<BucketState>`), so a bucket's file,
// size and index always change together. I/O that fails leaves the index as it was before the call.
//
// Room: the file never grows past the bucket's `limit`, which it may raise by borrowing from the tier
// (see DiskLedger.swift and Bucket+Room.swift). When the tier has no room left to lend, the clock hand
// evicts live entries until the live records fit in 3/4 of the limit, then the bucket is compacted: its
// live records are copied to `<name>.compact`, which is fsynced and renamed over the file, and the
// directory fsynced. One compaction runs at a time in the whole tier, and its temporary file fits the
// headroom the ledger keeps for it, so everything in the directory stays within the budget.
//
// What goes (Bucket+Room.swift), in S3-FIFO's spirit on a log: entries never read since they were stored
// or since their credits ran out (the small queue's kind) go first, the oldest first (by offset: a log
// is in the order records were stored, and a compaction copies records in file order) — down to
// what the read entries leave of the target, and no further than a tenth of the target while the read
// entries take more than the rest. Then a CLOCK over every other entry (it passes over the unread ones
// kept, as S3-FIFO's main queue never evicts from its small one), counting reads up to three (2 bits in
// the index slot's length, `DiskSlot.credits`): each read gives the entry a credit, the hand takes one
// from each entry it passes and evicts an entry that has none, so an entry read n times (n ≤ 3) since
// the hand last passed survives n passes. An overwrite keeps its key's credits. On the shared trace this
// misses 0.9–3.1 points less than the 1-bit clock it replaced, at every budget from 1 to 40 %
// (`replay --tier disk`; other trace families in BENCHMARKS.md, where it loses on two budgets of
// eight). No ghost: one (S3-FIFO's, of evicted tags) helped and hurt by turns, and would cost DRAM per
// entry.

/// What every bucket of a tier shares: one object, so that a bucket's context (and every copy of its
/// state) holds three references, not a dozen (the open builds one per bucket).
final class BucketShared: Sendable {
    let directory: CacheDirectory
    let share: Int
    let hasher: KeyHash
    /// The clock expiry is judged by.
    let clock: CacheClock
    let bucketCount: Int
    /// Held while compacting: one temporary file at a time in the whole tier.
    /// (It holds the tier's count of compactions begun rather than Void: Thread Sanitizer reports the
    /// zero-sized state's accesses as racing with reads of the lock's own fields.)
    let compaction: Locked<UInt64>
    /// The tier's budget beyond the buckets' own limits (DiskLedger.swift).
    let ledger: DiskLedger
    /// The tier's health: once the directory was found replaced, every operation fails.
    let health: TierHealth
    /// Where damage and failures are logged (each kind at most twice per interval).
    let logs: DiskLogs
    /// Read through a mapping of the file (``DiskTier/Configuration/mappedReads``).
    let mappedReads: Bool
    /// Bytes of appends gathered before one write to the file (Bucket+WriteBuffer.swift); 0 writes
    /// every record through.
    let writeBuffer: Int
    /// The SIZES a clean close left, deleted before any bucket file first changes (Bucket+Snapshot.swift).
    let sizesFile: SizesFile

    init(
        directory: CacheDirectory, share: Int, hasher: KeyHash, clock: CacheClock, bucketCount: Int,
        compaction: Locked<UInt64>, ledger: DiskLedger, health: TierHealth, logs: DiskLogs, mappedReads: Bool,
        writeBuffer: Int, sizesFile: SizesFile
    ) {
        self.directory = directory
        self.share = share
        self.hasher = hasher
        self.clock = clock
        self.bucketCount = bucketCount
        self.compaction = compaction
        self.ledger = ledger
        self.health = health
        self.logs = logs
        self.mappedReads = mappedReads
        self.writeBuffer = writeBuffer
        self.sizesFile = sizesFile
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
    var compaction: Locked<UInt64> { shared.compaction }
    var ledger: DiskLedger { shared.ledger }
    var health: TierHealth { shared.health }
    var logs: DiskLogs { shared.logs }
    var mappedReads: Bool { shared.mappedReads }
    var writeBuffer: Int { shared.writeBuffer }
    var sizesFile: SizesFile { shared.sizesFile }
}

struct BucketCounters {
    var hits: UInt64 = 0
    var misses: UInt64 = 0
    var writes: UInt64 = 0
    var removals: UInt64 = 0
    var evictions: UInt64 = 0
    var compactions: UInt64 = 0
    var corruptRecords: UInt64 = 0
    var truncatedTails: UInt64 = 0
    var expired: UInt64 = 0
    /// Buffered records lost because writing the buffer failed.
    var lostBufferedRecords: UInt64 = 0
    var openedFromSnapshot = false
}

struct BucketState {
    let context: BucketContext
    var fd: Int32 = -1
    /// Bytes of the log in the file: header and records up to the last complete write.
    var written = BucketFileHeader.size
    /// Records appended but not yet written to the file (see Bucket+WriteBuffer.swift): they belong
    /// at `written`. (A read of a written record never touches the buffer, not even its count.)
    var buffer = WriteBuffer()
    /// Bytes of the log: `written` and the buffered records after them.
    var size: Int { written + buffer.count }
    /// Bytes of the records the index points at.
    var liveBytes = 0
    /// Empty (no slots allocated) until the load.
    var index = BucketIndex(capacity: 0)
    var counters = BucketCounters()
    /// The highest sequence number in the file; the bucket stamps its next record with the one after.
    var maximumSequence: UInt64 = 0
    /// The file's mapping for reads (see FileMapping.swift); nil: reads use `pread`.
    var mapping: FileMapping? = nil
    /// A read met a corrupt record: the file is rewritten without it when the operation ends (not at
    /// once: the operation may still hold index positions, which a compaction can move).
    var needsHealing = false
    /// The most bytes the file may hold now: its share, plus what it borrowed, less what it lent.
    var limit: Int
    /// Whether the index has been loaded (Bucket+Recovery.swift): until then `index`, `written` and
    /// `liveBytes` say nothing of the file.
    var loaded = false
    /// The bytes of the index snapshot found at the open, charged to the tier's budget until it is
    /// deleted (see ``DiskLedger``).
    var snapshotCharge = 0
    /// Loaded from its snapshot, which is still in the directory (see Bucket+Snapshot.swift): it must
    /// be deleted (``beforeFileChange()``) before the file changes.
    var keepsSnapshot = false
    /// For a bucket whose file the open did not open (SIZES told its size; `fd` is -1 until its load
    /// opens it): that size.
    var recordedFileSize = 0
    /// Set by `close()`: every operation then throws ``MagpieError/Code/closed``.
    var closed = false

    init(context: BucketContext) {
        self.context = context
        self.limit = context.share
    }

    /// A bucket as SIZES describes it: its file not opened yet (its load opens it), its limit from the
    /// recorded size, its snapshot charged.
    init(context: BucketContext, recordedFileSize: Int, snapshotCharge: Int) {
        self.context = context
        self.limit = max(context.share, recordedFileSize)
        self.recordedFileSize = recordedFileSize
        self.snapshotCharge = snapshotCharge
    }

    var isOpen: Bool { !closed }

    func checkOpen() throws(MagpieError) {
        guard isOpen else { throw MagpieError(.closed, "the disk tier is closed", path: context.path) }
        if let failure = context.health.failure { throw failure }
    }

    /// Removes the slot at `position` from the index and returns it.
    mutating func take(at position: Int) -> DiskSlot {
        let slot = index[position]
        drop(at: position)
        return slot
    }

    /// Removes the slot at `position` from the index (its record becomes garbage).
    mutating func drop(at position: Int) {
        liveBytes -= index[position].length
        index.remove(at: position)
    }

    // MARK: Writes

    /// Appends a value record for `key` and points the index at it. The previous record of the key, if
    /// any, becomes garbage. On failure the index is as before.
    mutating func store(_ draft: RecordDraft, key: HashedKey, now: Int64, policy: RoomPolicy) throws(MagpieError)
        -> RoomOutcome<Void>
    {
        try checkOpen()
        if let short = reserveRoom(draft.length, policy: policy) { return .short(short) }
        defer { healIfNeeded() }
        let previous = try position(of: key).map { take(at: $0) }
        let offset = try append(draft, replacing: previous, now: now)
        var slot = DiskSlot(hash: key.hash, offset: offset, length: draft.length, expiryMilliseconds: draft.header.expiry)
        slot.credits = previous?.credits ?? 0  // an overwrite keeps the reads the key earned
        index.insert(slot)
        liveBytes += draft.length
        counters.writes += 1
        return .done(())
    }

    /// Removes `key` and appends a tombstone, so the removal survives a restart even if an older record
    /// of the key (say, of an evicted entry) is still in the file. Returns whether the key was live.
    mutating func remove(_ key: HashedKey, tombstone: RecordDraft, now: Int64, policy: RoomPolicy) throws(MagpieError)
        -> RoomOutcome<Bool>
    {
        try checkOpen()
        if let short = reserveRoom(tombstone.length, policy: policy) { return .short(short) }
        defer { healIfNeeded() }
        let previous = try find(tag: DiskSlot.tag(of: key.hash), key: key.bytes).map { take(at: $0.0) }
        _ = try append(tombstone, replacing: previous, now: now, through: true)
        if previous != nil { counters.removals += 1 }
        return .done(previous != nil)
    }

    /// Removes every live entry whose group is `group` and appends a group tombstone (always: older
    /// records of the group may remain in the file). Returns the number of live entries removed.
    mutating func removeGroup(_ group: UnsafeRawBufferPointer, tombstone: RecordDraft, now: Int64, policy: RoomPolicy)
        throws(MagpieError) -> RoomOutcome<Int>
    {
        try checkOpen()
        if let short = reserveRoom(tombstone.length, policy: policy) { return .short(short) }
        var members: [DiskSlot] = []
        for slot in index.slots where !slot.isEmpty {
            let bytes = try readRecord(slot)
            let inGroup = bytes.withUnsafeBytes { raw -> Bool in
                guard let header = RecordHeader.validate(raw), header.groupLength == group.count, !group.isEmpty
                else { return false }
                return memcmp(raw.baseAddress! + header.groupOffset, group.baseAddress!, group.count) == 0
            }
            if inGroup { members.append(slot) }
        }
        for member in members {
            if let position = index.positions(tag: member.tag).first(where: { index[$0].offset8 == member.offset8 }) {
                drop(at: position)
            }
        }
        _ = try append(tombstone, replacing: nil, and: members, now: now, through: true)
        counters.removals += UInt64(members.count)
        return .done(members.count)
    }

    /// Empties the bucket: the file keeps only its header.
    mutating func removeAll() throws(MagpieError) {
        try checkOpen()
        try beforeFileChange()
        try FileIO.truncate(fd, to: BucketFileHeader.size, path: context.path)
        buffer.removeAll()
        counters.removals += UInt64(index.count)
        index.removeAll()
        liveBytes = 0
        written = BucketFileHeader.size
        returnSurplus(keeping: 0)
    }

    /// Drops entries whose expiry has passed; returns how many.
    mutating func removeExpired(now: Int64) -> Int {
        let removed = dropAll { $0.isExpired(nowMilliseconds: now) }
        counters.expired += UInt64(removed)
        return removed
    }

    /// Drops every indexed slot for which `condition` holds, in one pass; returns how many.
    mutating func dropAll(where condition: (DiskSlot) -> Bool) -> Int {
        var removed = 0
        var position = 0
        while position < index.slots.count {
            if !index[position].isEmpty && condition(index[position]) {
                drop(at: position)  // a later slot may shift into `position`: look at it again
                removed += 1
            } else {
                position += 1
            }
        }
        return removed
    }

    mutating func flush() throws(MagpieError) {
        try checkOpen()
        try writePending()
        try FileIO.sync(fd, path: context.path)
    }

    mutating func close() {
        if fd >= 0 && !closed { try? writePending() }  // best effort: `DiskTier.close()` has flushed already
        mapping?.unmap()
        mapping = nil
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
        closed = true
    }

    /// Maps the current file for reads, replacing the mapping of any previous file. Called with the
    /// lock held whenever `fd` changes, before anything reads through it.
    mutating func remap(length: Int? = nil) {
        mapping?.unmap()
        mapping = context.mappedReads && fd >= 0 ? FileMapping.map(fd, length: length ?? max(context.share, limit)) : nil
    }

    // MARK: Room

    /// Appends `draft` in place of the records of `replaced` and `others`, whose slots the caller has
    /// dropped from the index: if the append fails they are put back (unless a compaction since the drop
    /// has discarded them: then they are gone for good); once it succeeds their records are marked dead.
    /// Returns the new record's offset.
    private mutating func append(
        _ draft: RecordDraft, replacing replaced: DiskSlot?, and others: [DiskSlot] = [], now: Int64, through: Bool = false
    ) throws(MagpieError) -> Int {
        let compactions = counters.compactions
        let offset: Int
        do {
            offset = try append(draft, now: now, through: through)
        } catch {
            if counters.compactions == compactions {
                if let replaced { restore(replaced) }
                for slot in others { restore(slot) }
            }
            throw error
        }
        if counters.compactions == compactions {
            if let replaced { markDead(replaced) }
            for slot in others { markDead(slot) }
        }
        return offset
    }

    /// Makes room if needed, then appends the record stamped with the bucket's next sequence number
    /// (`through`: and writes it and everything buffered before it to the file). Returns its offset.
    private mutating func append(_ draft: RecordDraft, now: Int64, through: Bool = false) throws(MagpieError) -> Int {
        try beforeFileChange()  // the file is about to change
        let length = draft.length
        if size + length > limit { try makeRoom(for: length, now: now) }
        guard size + length <= limit else {
            throw MagpieError(.valueTooLarge, "a \(length)-byte record does not fit the disk tier's budget")
        }
        let sequence = maximumSequence &+ 1
        let offset = size
        try put(draft, sequence: sequence)
        maximumSequence = sequence
        if through { try writePending() }
        return offset
    }

    /// After corruption was found: rewrites the bucket without the damaged bytes (a compaction keeps
    /// only the indexed records that verify again), so that the damage is gone from the file and is
    /// neither met nor counted again. Index positions may move (damaged slots are dropped): call it only
    /// when none is held. A failure leaves the file as it was (still correct: the damage stays skipped)
    /// and is logged.
    mutating func heal() {
        do {
            try compactWithinHeadroom()
        } catch {
            context.logs.healFailed.record(error: "\(error)", metadata: ["path": "\(context.path)"])
        }
    }

    /// Rewrites the live records (buffered ones included) into a new file, in writes of up to
    /// `compactionChunk` bytes, and renames it over the bucket file.
    mutating func compact() throws(MagpieError) {
        try beforeFileChange()
        let temporaryName = context.name + ".compact"
        let temporary = context.path + ".compact"
        let newFD = try context.directory.createExclusive(.buckets, temporaryName)
        var moved = index
        var newSize = BucketFileHeader.size
        // The new file's bytes not yet written: they start at `chunkOffset`.
        var chunk = BucketFileHeader(bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed)
            .encoded()
        chunk.reserveCapacity(Self.compactionChunk)
        var chunkOffset = 0
        do {
            // In the order of the old file, so that offsets keep telling the order records were stored
            // in (the eviction takes unread entries oldest first) and the old file is read front to back.
            var order = (0..<index.slots.count).filter { !index[$0].isEmpty }
            order.sort { index[$0].offset8 < index[$1].offset8 }
            for position in order {
                let slot = index[position]
                let bytes = try readRecord(slot)
                // Verified again: damage done to the file since the record was indexed stays behind
                // (the slot is dropped below) instead of being copied into the new file.
                let intact = bytes.withUnsafeBytes { raw in
                    guard raw.count == slot.length, let header = RecordHeader.validate(raw), header.kind == .value,
                        !header.isDead, header.recordLength == slot.length
                    else { return false }
                    return true
                }
                guard intact else {
                    moved[position].offset8 = Self.damagedOffset8
                    continue
                }
                if chunk.count + bytes.count > Self.compactionChunk && !chunk.isEmpty {
                    try FileIO.write(newFD, chunk, at: chunkOffset, path: temporary)
                    chunkOffset += chunk.count
                    chunk.removeAll(keepingCapacity: true)
                }
                chunk.append(contentsOf: bytes)
                moved[position].offset8 = UInt32(newSize / 8)
                newSize += bytes.count
            }
            try FileIO.write(newFD, chunk, at: chunkOffset, path: temporary)
            try FileIO.sync(newFD, path: temporary)
            try context.directory.rename(.buckets, temporaryName, to: context.name)
        } catch {
            Glibc.close(newFD)
            try? context.directory.unlink(.buckets, temporaryName)
            throw error
        }
        // The renamed file is the bucket now, whatever happens next.
        Glibc.close(fd)
        fd = newFD
        remap()
        written = newSize
        buffer.removeAll()
        index = moved
        counters.compactions += 1
        needsHealing = false
        let damaged = dropAll { $0.offset8 == Self.damagedOffset8 }
        if damaged > 0 {
            counters.corruptRecords += UInt64(damaged)
            context.logs.damagedLeftOut.record(metadata: ["path": "\(context.path)", "records": "\(damaged)"])
        }
        try context.directory.sync(.buckets)
    }

    /// The most bytes a compaction gathers before one write to the new file.
    static let compactionChunk = 256 * 1024

    /// Marks, during a compaction, a slot whose record failed verification (no record starts there:
    /// the largest bucket's last 8 bytes cannot hold one).
    private static let damagedOffset8 = UInt32.max

    /// Rewrites the file without the damage a read of this operation met (see `needsHealing`).
    mutating func healIfNeeded() {
        if needsHealing { heal() }
    }
}
