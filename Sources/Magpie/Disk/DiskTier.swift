import Glibc
import Logging
import Synchronization

/// The disk tier: a directory of a fixed set of fixed-name bucket files, each a file of regions of
/// checksummed records, within a byte budget.
///
/// ```
/// <directory>/MANIFEST      format version, bucket count, hash seed (written once, atomically)
/// <directory>/LOCK          flock'ed by the one DiskTier that has the directory open
/// <directory>/buckets/00 …  one file per bucket; names never derive from keys
/// ```
///
/// A key's hash picks its bucket (high bits); each bucket has its own lock, in-memory index (16-byte
/// slots), memtables and a share of the budget, which buckets lend each other (see **Budget**). The
/// record format and the file layout are described once, in `Disk/Format/OnDiskFormat.swift`; the
/// eviction in `Disk/Bucket.swift`.
///
/// **Writes.** A store copies its record into its bucket's memtable, under the bucket's lock, and
/// returns: it neither compresses nor hashes nor writes (a few hundred nanoseconds for 4 KiB). The record
/// is readable at once (from the memtable). When the memtable is full (``Configuration/writeBufferSize``,
/// 64 KiB) a background thread compresses its values with zstd where that pays (values of at least
/// ``Configuration/minimumCompressibleLength`` bytes that do not look like noise), hashes them, and
/// appends them to the bucket's newest region, in one `pwrite`. A removal, and an overwrite of a value
/// already in the file, write a small tombstone before they return. Nothing is ever rewritten in place.
/// That thread runs under Linux's `SCHED_BATCH` policy where the system allows it: the same CPU share, but
/// its wake-ups do not preempt a running thread; it runs when that thread blocks or its slice ends.
///
/// **Eviction.** A bucket that needs a new region takes a free slot of its file, else grows its file
/// (borrowing from the tier's budget), else reclaims its oldest region: the entries there that were read
/// often enough since they were written, for their size, are copied into the newest region; the others
/// are evicted; nothing else is copied (see `Disk/Bucket.swift`). ``Configuration/reinsertionThreshold``
/// sets how often is often enough.
///
/// **Reads.** Under the bucket's lock, a read verifies the record's first bytes (header, key, group,
/// metadata) in a copy in its thread's read scratch, then copies the payload once, out of a read-only
/// mapping of the bucket file (or with `pread`, see ``Configuration/mappedReads``; or out of a memtable),
/// straight into the array it returns, and checks it against its hash; a compressed value is
/// decompressed from its copy outside the lock. With ``Configuration/hugePageFiles`` bucket files grow in
/// whole 2 MiB ranges that the kernel caches as huge pages, so that the mapping's random reads rarely miss
/// the TLB (`Disk/Bucket+HugePages.swift`).
///
/// **Budget.** Everything the tier writes in its directory — bucket files, the index snapshots a close
/// leaves, SIZES, MANIFEST and LOCK, the journal of owed removals — stays within ``Configuration/budget``
/// bytes (file sizes; `du` adds block rounding). The budget acts as one: a bucket that fills borrows room
/// the others do not use, so a store evicts nothing while the tier has room, and a value of up to
/// ``largestStorableValue`` bytes (about half the budget) is stored whatever the bucket count. The rules
/// are in `Disk/DiskLedger.swift`. Memtables are memory, not disk: up to about twice
/// ``Configuration/writeBufferSize`` per bucket.
///
/// **Trust.** The directory is held open and every file is reached relative to it, never through a
/// symbolic link; a directory another user owns or can write to is refused, files are created 0600
/// and directories 0700 (see ``Configuration/fileMode``), and a directory removed or replaced while
/// open is reported as ``MagpieError/Code/directoryReplaced``. See `Disk/CacheDirectory.swift`.
///
/// **Durability.** A removal or group removal has reached the kernel's page cache when the call
/// returns: it survives the process being killed, not a power loss. So has an overwrite's tombstone. A
/// store has reached the kernel once its memtable is written: by the background thread when the
/// memtable fills, by ``writeBuffers()`` (a `Cache` calls it every second), ``flush()`` or ``close()``;
/// with ``Configuration/writeBufferSize`` 0, before the call returns. If the process dies first the
/// store is lost: its key then reads as a miss after the restart, never as the value it replaced (that
/// value's tombstone was written before the store returned). ``flush()`` makes everything stored so far
/// durable (the memtables written, fsync of every bucket file and of the directories). After a crash,
/// recent stores may be lost, but a read returns either nothing or exactly a value that was stored for its
/// key (never one a later store replaced), and a removal or group removal that returned is never undone
/// by a restart. ``removeAll()`` empties bucket after bucket: a crash in the middle leaves the buckets it
/// had not reached.
///
/// **Reopening.** Opening takes the same time whatever the directory holds: each bucket's file is opened
/// and its index loaded at its first use or by a background thread meanwhile (see
/// `Disk/IndexLoader.swift`). ``close()`` leaves an index snapshot per bucket, so a load after a clean
/// close reads the snapshot instead of scanning every record (see `Disk/Bucket+Snapshot.swift`), and
/// last `buckets/SIZES`, every bucket file's and snapshot's size: the next open reads that one file,
/// charges those sizes to the budget, and lists, opens and measures nothing else in `buckets/` (strays
/// are removed by the background thread, and by the close that writes SIZES). SIZES is deleted before any bucket
/// file first changes, and a snapshot a get loaded from before its file changes (or by the background
/// thread), so a crash finds either only as long as it is still true; a bucket's load checks its file's
/// real size against what was charged all the same. Without SIZES (after a crash, or one that is
/// damaged or not ours), the open lists `buckets/`, removes strays, and opens and measures every bucket
/// file, as before; after a crash a bucket whose snapshot went is scanned and verified in full when it
/// loads. A bucket file that is not a regular file of ours is found at the open without SIZES, and at
/// its bucket's load with it: a link or a missing file is replaced by an empty bucket (counted in
/// ``DiskTierStatistics/missingBucketFiles``), another user's file fails that bucket's operations
/// with ``MagpieError/Code/directoryUnsafe``, and so does a failure to open it (say, out of file
/// descriptors). If SIZES or a kept snapshot cannot be deleted, the change that needed it fails (with
/// the I/O error) rather than leave a description of the files that is no longer true.
///
/// **Errors.** Every failure is a ``MagpieError``; after one, the tier is still consistent and usable.
/// Damage found in a bucket file costs misses, never a wrong value: a corrupt record is skipped and
/// counted; damage that may hide a tombstone drops every entry of that bucket indexed before it
/// (``DiskTierStatistics/droppedForDamage``); a file cut short since the last clean close is emptied (see
/// <doc:DurabilityAndCrashSafety>).
public final class DiskTier: Sendable {
    /// The longest key, in bytes.
    public static let maximumKeyLength = HashedKey.maximumLength
    /// The longest group name, in UTF-8 bytes.
    public static let maximumGroupLength = 65_535
    /// The most buckets a directory may have.
    public static let maximumBucketCount = 4096
    /// The most bytes one bucket file may hold (its index stores offsets / 8 in 32 bits).
    public static let maximumBucketBudget = Int(UInt32.max) * 8

    /// The configuration it was opened with (``Configuration/bucketCount`` as found or created).
    public let configuration: Configuration
    /// The number of bucket files.
    public let bucketCount: Int
    /// A bucket's share of the budget: (budget − 128) / bucketCount. Buckets lend each other room beyond
    /// it, so it bounds no value (see ``largestStorableValue``).
    public let bucketBudget: Int
    let hasher: KeyHash

    let buckets: [Locked<BucketState>]
    /// The same buckets, reached without retain and release on the read and write paths. Valid while
    /// `buckets` holds them (as long as this tier lives).
    let unownedBuckets: [Unmanaged<Locked<BucketState>>]
    /// Where a read's first misses lie, to ask for them before the bucket's lock (Disk/BucketReadHints.swift).
    let readHints: BucketReadHints
    let compression: ZstdPool
    /// The buckets apart from this object, for the sealer thread (Disk/BucketSet.swift).
    let bucketSet: BucketSet
    /// What every bucket shares (their files' region size, the compression of sealed records, …).
    var shared: BucketShared { bucketSet.shared }
    /// The thread that writes full memtables (Disk/Sealer.swift).
    var sealer: Sealer { bucketSet.sealer }
    /// Damage and failures, each kind logged at most twice per ``Configuration/logInterval``.
    let logs: DiskLogs
    let compresses: Bool
    let lockFile: Locked<Int32>
    /// The open, verified directory every file is reached through (see `Disk/CacheDirectory.swift`).
    let directory: CacheDirectory
    /// The budget beyond the buckets' limits (see `Disk/DiskLedger.swift`).
    let ledger: DiskLedger
    /// The remote tier's journal of owed removals (DiskTier+JournalFile.swift).
    let journal: Locked<JournalState>
    /// Set once the directory was found removed or replaced; every call then throws its error.
    let health: TierHealth
    /// ``Configuration/directoryCheckInterval`` in ms; nil: writes never check.
    let checkInterval: Int64?
    /// When a write last checked the directory (monotonic ms).
    let lastCheck = Atomic<Int64>(0)
    /// Bucket files that were absent at open although the directory had a MANIFEST.
    let missingBucketFiles: Int
    /// Held by whatever removes strays from `buckets/`: the loader thread, a close.
    let strayLock: Locked<UInt64>
    /// Loads the buckets' indexes in the background after the open (see ``IndexLoader``).
    let loader: IndexLoader
    /// The SIZES the last clean close left, until the first change to a bucket file deletes it.
    let sizesFile: SizesFile

    /// Opens the directory, creating it if needed; the bucket files are opened (after a clean close) and
    /// their indexes loaded after it returns, at each bucket's first use and on a background thread, so
    /// it takes the same time whatever the directory holds (see **Reopening**). A bucket whose file then
    /// fails to open or load throws from the operation that needed it.
    /// - Throws: ``MagpieError/Code/directoryLocked`` if another tier has it open (after waiting up to
    ///   a quarter of a second for it to be released);
    ///   ``MagpieError/Code/directoryUnusable`` if it cannot be created or written, holds files Magpie
    ///   did not write, or its MANIFEST is unreadable; ``MagpieError/Code/directoryUnsafe`` if it (or
    ///   `buckets/`) is a symbolic link, is owned by another user or writable by others, or LOCK or
    ///   MANIFEST is a link or not ours; ``MagpieError/Code/manifestMismatch`` if it was
    ///   created with another format or bucket count; ``MagpieError/Code/invalidConfiguration`` for a
    ///   budget or bucket count out of range; I/O errors opening the files (a bucket whose index then
    ///   fails to load throws from the operation that needed it, and is tried again by the next).
    public init(_ configuration: Configuration) throws(MagpieError) {
        guard configuration.budget > 0 else {
            throw MagpieError(.invalidConfiguration, "disk budget \(configuration.budget) must be positive")
        }
        if let count = configuration.bucketCount, !Self.isValidBucketCount(count) {
            throw MagpieError(.invalidConfiguration, "bucket count \(count) must be a power of two from 1 to \(Self.maximumBucketCount)")
        }
        let logs = DiskLogs(configuration.logger, interval: configuration.logInterval)
        self.logs = logs
        compression = try ZstdPool(level: configuration.compressionLevel ?? 1)
        compresses = configuration.compressionLevel != nil
        let root = try RootDirectory(
            path: configuration.directory, directoryMode: mode_t(configuration.directoryMode),
            fileMode: mode_t(configuration.fileMode), allowsGroupWritable: configuration.allowsGroupWritableDirectory)
        let lockFD: Int32
        let directory: CacheDirectory
        do throws(MagpieError) {
            lockFD = try Self.lock(root)
            do throws(MagpieError) {
                directory = try CacheDirectory(
                    root: root, directoryMode: mode_t(configuration.directoryMode),
                    allowsGroupWritable: configuration.allowsGroupWritableDirectory)
            } catch {
                Glibc.close(lockFD)
                throw error
            }
        } catch {
            Glibc.close(root.fd)
            throw error
        }
        do throws(MagpieError) {
            let hadManifest = directory.kind(.root, "MANIFEST") != nil
            let manifest = try Self.openManifest(configuration, directory)
            let count = manifest.bucketCount
            let share = try Self.bucketBudget(configuration.budget, count: count)
            let hasher = KeyHash(seed: manifest.seed)
            // SIZES, if the last close was clean, gives every bucket file's and snapshot's size, so that
            // nothing in buckets/ need be listed or opened now. It stays until just before the first
            // change to any bucket file (`SizesFile`), so a crash finds it only while it is still true.
            // Without it, one listing of buckets/ removes strays, and every bucket file is opened and
            // measured (see "Reopening" above).
            let sizes = Self.readSizes(directory, count: count, seed: manifest.seed)
            // (With no loader thread, which removes them in the background, strays are removed now.)
            if sizes == nil || !configuration.loadsInBackground {
                try Self.removeStrays(in: directory, count: count, keepingSizes: sizes != nil)  // an unusable SIZES too
            }
            // Held by whatever removes strays from buckets/ (the loader thread, a close).
            let strayLock = Locked<UInt64>(0)
            let health = TierHealth()
            let ledger = DiskLedger(
                pool: 0, share: share, maximumLimit: Self.maximumBucketBudget)
            let sizesFile = SizesFile(
                present: sizes != nil, charge: BucketSizes.length(bucketCount: count), directory: directory, ledger: ledger)
            var buckets: [Locked<BucketState>] = []
            var missing = 0
            var journalReserved = 0
            var journalSize = 0
            var held = sizesFile.charge  // SIZES, while it stays
            let shared = BucketShared(
                    directory: directory, share: share, hasher: hasher, clock: configuration.clock, bucketCount: count,
                    ledger: ledger, health: health, logs: logs, mappedReads: configuration.mappedReads,
                    hugePages: configuration.mappedReads && configuration.hugePageFiles,
                    writeBuffer: max(0, min(configuration.writeBufferSize, share / 8)), sizesFile: sizesFile,
                    regionSize: Self.regionSize(share: share), reinsertionThreshold: max(1, configuration.reinsertionThreshold),
                    compression: configuration.compressionLevel == nil ? nil : compression,
                    minimumCompressibleLength: configuration.minimumCompressibleLength)
            do throws(MagpieError) {
                buckets.reserveCapacity(count)
                let prefix = directory.path(.buckets, "")
                for number in 0..<count {
                    let name = Self.bucketName(number, count: count)
                    let context = BucketContext(number: number, name: name, path: prefix + name, shared: shared)
                    let state: BucketState
                    if let sizes {
                        // As the last close left it: not even opened until its load (Bucket+Recovery.swift).
                        state = BucketState(
                            context: context, recordedFileSize: sizes.files[number], snapshotCharge: sizes.snapshots[number])
                    } else {
                        // Only the file is opened (and its size read, for its limit): the index loads at
                        // the bucket's first use or on the loader thread (Bucket+Recovery.swift).
                        let (opened, recreated) = try BucketState.open(context: context, hadManifest: hadManifest)
                        if recreated {
                            // Deleted or replaced from outside: it is recreated empty, and its entries are lost (misses).
                            missing += 1
                            logs.bucketRecreated.record(metadata: ["path": "\(context.path)"])
                        }
                        state = opened
                    }
                    held += state.layout.limit + state.life.snapshotCharge
                    buckets.append(Locked(state))
                }
                // Whatever the buckets do not hold is the pool (below zero if the files hold more than
                // this budget allows: buckets then repay as they give room back).
                // A journal of owed removals left in the directory is charged at once (DiskTier+JournalFile.swift).
                journalSize = Self.leftJournalSize(directory)
                journalReserved = Self.rounded(journalSize)
                ledger.pool.give(configuration.budget - DiskLedger.manifestAllowance - held - journalReserved)
            } catch {
                for bucket in buckets { bucket.withLock { $0.close() } }
                throw error
            }
            var resolved = configuration
            resolved.bucketCount = count
            self.configuration = resolved
            self.bucketCount = count
            self.bucketBudget = share
            self.hasher = hasher
            self.buckets = buckets
            self.unownedBuckets = buckets.map { Unmanaged.passUnretained($0) }
            let readHints = BucketReadHints(count: count)
            readHints.register(buckets)
            self.readHints = readHints
            self.lockFile = Locked(lockFD)
            self.missingBucketFiles = missing
            self.directory = directory
            self.health = health
            self.ledger = ledger
            self.journal = Locked(JournalState(size: journalSize, reserved: journalReserved))
            self.checkInterval = configuration.directoryCheckInterval.map { Self.milliseconds($0) }
            self.sizesFile = sizesFile
            self.loader = IndexLoader(
                buckets, start: configuration.loadsInBackground,
                strays: sizes == nil ? nil : IndexLoader.Strays(directory: directory, bucketCount: count, lock: strayLock))
            self.strayLock = strayLock
            let set = BucketSet(buckets: buckets, shared: shared, sealer: Sealer(bucketCount: count), sealsInBackground: configuration.sealsInBackground)
            self.bucketSet = set
            // The sealer thread holds the bucket set, never this object (Disk/BucketSet.swift).
            bucketSet.sealer.setWork { number in set.sealInBackground(number) }
        } catch {
            Glibc.close(lockFD)  // releases the flock
            throw error
        }
    }

    deinit {
        sealer.stop()  // after the seal it is in
        sealer.setWork(nil)  // the set's only reference to itself
        // Released without `close()`: what the memtables hold is written, best effort (a crash would lose it).
        if buckets.first?.withLock({ $0.isOpen }) == true {
            for number in 0..<bucketCount { try? bucketSet.writeMemtables(number) }
        }
        loader.stop()
        loader.waitUntilFinished()  // before the files and the directory's lock are released
        for bucket in buckets { bucket.withLock { $0.close() } }
        lockFile.withLock { fd in
            if fd >= 0 { Glibc.close(fd) }
        }
    }

    // MARK: Reads

    /// The value stored for `key`, or nil: absent, expired, or its record failed its checksum (counted
    /// in ``DiskTierStatistics/corruptRecords`` and dropped). Never bytes other than those stored.
    /// - Throws: ``MagpieError/Code/keyTooLong``, ``MagpieError/Code/ioFailure`` when the read itself
    ///   fails, ``MagpieError/Code/closed``.
    public func value(forKey key: some Sequence<UInt8>) throws(MagpieError) -> [UInt8]? {
        try withHashedKey(key) { key throws(MagpieError) in try entry(key).flatMap { $0.placement.freshness.negative ? nil : $0.value } }
    }

    /// ``value(forKey:)-(Sequence<UInt8>)`` for a `String` key.
    public func value(forKey key: String) throws(MagpieError) -> [UInt8]? {
        try value(forKey: key.utf8)
    }

    // MARK: Writes

    /// Stores `value` for `key`, replacing any previous value.
    /// - Parameters:
    ///   - value: the bytes to store.
    ///   - key: the key's bytes.
    ///   - expiry: when the entry stops being served; an instant already past removes the key.
    ///   - group: a group to remove it with, see ``removeAll(inGroup:)``.
    /// - Throws: ``MagpieError/Code/keyTooLong`` (key or group), ``MagpieError/Code/valueTooLarge`` for a
    ///   value longer than ``largestStorableValue`` (measured compressed, with its key and group),
    ///   ``MagpieError/Code/directoryReplaced``, ``MagpieError/Code/noSpace`` and
    ///   ``MagpieError/Code/ioFailure`` (writing the tombstone of the value it replaces, or — with
    ///   ``Configuration/writeBufferSize`` 0 — the value itself), ``MagpieError/Code/closed``. On a throw
    ///   the key keeps its previous value (or, if a region was reclaimed meanwhile, has none).
    public func set(
        _ value: some Sequence<UInt8>, forKey key: some Sequence<UInt8>, expiry: Expiry = .never, group: String? = nil
    ) throws(MagpieError) {
        try withHashedKey(key) { key throws(MagpieError) in
            try withBytes(value) { value in
                Result { () throws(MagpieError) in try store(value, for: key, expiry: expiry, group: group, placement: EntryMetadata()) }
            }.get()
        }
    }

    /// ``set(_:forKey:expiry:group:)-(Sequence<UInt8>,Sequence<UInt8>,_,_)`` for a `String` key (its UTF-8 bytes).
    public func set(_ value: some Sequence<UInt8>, forKey key: String, expiry: Expiry = .never, group: String? = nil)
        throws(MagpieError)
    {
        try set(value, forKey: key.utf8, expiry: expiry, group: group)
    }

    /// Removes `key`, durably (a tombstone is appended). Returns whether it was present.
    @discardableResult
    public func removeValue(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try remove(key) }
    }

    /// ``removeValue(forKey:)-(Sequence<UInt8>)`` for a `String` key.
    @discardableResult
    public func removeValue(forKey key: String) throws(MagpieError) -> Bool {
        try removeValue(forKey: key.utf8)
    }

    // MARK: Helpers

    /// Runs `body` on the bucket of `hash` with its lock held, without retaining the bucket.
    @inline(__always)
    func withBucket<R>(for hash: UInt64, _ body: (inout BucketState) throws(MagpieError) -> R) throws(MagpieError) -> R {
        var failure: MagpieError? = nil
        let result = unownedBuckets[Self.bucket(of: hash, count: bucketCount)]._withUnsafeGuaranteedRef { bucket -> R? in
            bucket.withLock { (state: inout BucketState) -> R? in
                do throws(MagpieError) {
                    try state.loadIfNeeded()
                    return try body(&state)
                } catch {
                    failure = error
                    return nil
                }
            }
        }
        if let failure { throw failure }
        return result.unsafelyUnwrapped  // set whenever `failure` is not
    }

    /// Throws ``MagpieError/Code/closed`` once the tier is closed, and a replaced directory's error.
    func checkOpen() throws(MagpieError) {
        try buckets.first?.withLock { (state: inout BucketState) throws(MagpieError) in try state.checkOpen() }
    }

    /// Runs `body` with `key` hashed by this tier's hasher, its length checked.
    func withHashedKey<R>(_ key: some Sequence<UInt8>, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try withBytes(key) { bytes in Result { () throws(MagpieError) -> R in try body(HashedKey(bytes, hasher: hasher)) } }.get()
    }
}
