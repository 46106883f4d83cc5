import Glibc
import Synchronization

// The directory: its lock, MANIFEST, bucket file names, stray files, and reset.

extension DiskTier {
    /// Opens LOCK (a regular file of ours, never through a link) and takes an exclusive `flock` on it
    /// (which also conflicts with a second open of the same directory in this process). Returns the
    /// descriptor, whose closing releases the lock.
    ///
    /// A held lock is retried for up to `lockWait` before `directoryLocked`: a lock just released can
    /// still be held for a moment by a child process that another thread is spawning (between fork and
    /// exec the child shares the descriptor, O_CLOEXEC notwithstanding), so a close and reopen in a
    /// process that also spawns processes would otherwise fail now and then.
    static func lock(_ root: RootDirectory) throws(MagpieError) -> Int32 {
        let path = root.path + "/LOCK"
        let fd: Int32
        do {
            fd = try root.openOrCreate("LOCK")
        } catch {
            if error.code == .directoryUnsafe { throw error }
            throw MagpieError(.directoryUnusable, "cannot open the lock file: \(error.message)", errno: error.errno, path: path)
        }
        var waited: UInt32 = 0
        var pause: UInt32 = 1_000  // µs, doubling
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            if code == EWOULDBLOCK && waited < lockWait {
                usleep(pause)
                waited += pause
                pause = min(pause * 2, 64_000)
                continue
            }
            Glibc.close(fd)
            if code == EWOULDBLOCK {
                throw MagpieError(.directoryLocked, "another DiskTier has this directory open", errno: code, path: root.path)
            }
            throw FileIO.error("flock", code, path)
        }
        return fd
    }

    /// How long `lock` waits for a held lock, in µs.
    static let lockWait: UInt32 = 250_000

    /// Reads the MANIFEST, or writes one for a new directory.
    static func openManifest(_ configuration: Configuration, _ directory: CacheDirectory) throws(MagpieError) -> Manifest {
        let path = directory.path(.root, "MANIFEST")
        guard let bytes = try directory.readFile(.root, "MANIFEST") else {
            let foreign = try directory.list(.root).filter { !["LOCK", "MANIFEST.tmp", "buckets"].contains($0) }
            if try !directory.list(.buckets).isEmpty {
                throw MagpieError(
                    .directoryUnusable,
                    "the MANIFEST is missing but bucket files remain; DiskTier.destroy(directory:) resets the directory",
                    path: path)
            }
            guard foreign.isEmpty else {
                throw MagpieError(
                    .directoryUnusable, "the directory has no MANIFEST but holds \(foreign.sorted().prefix(5)); refusing to use it",
                    path: directory.path)
            }
            let count = configuration.bucketCount ?? defaultBucketCount(budget: configuration.budget)
            _ = try bucketBudget(configuration.budget, count: count)  // refuse before creating anything
            let manifest = Manifest(
                bucketCount: count,
                seed: configuration.hashSeed ?? KeyHash.random().seed, created: CacheClock.system.now())
            try directory.writeAtomically(.root, "MANIFEST", manifest.encoded())
            return manifest
        }
        guard let manifest = Manifest.decode(bytes), isValidBucketCount(manifest.bucketCount) else {
            throw MagpieError(
                .directoryUnusable, "the MANIFEST is unreadable; DiskTier.destroy(directory:) resets the directory", path: path)
        }
        guard manifest.formatVersion == Manifest.formatVersion else {
            throw MagpieError(
                .manifestMismatch, "format version \(manifest.formatVersion); this Magpie reads \(Manifest.formatVersion)", path: path)
        }
        if let wanted = configuration.bucketCount, wanted != manifest.bucketCount {
            throw MagpieError(
                .manifestMismatch, "the directory has \(manifest.bucketCount) buckets, not \(wanted)", path: path)
        }
        return manifest
    }

    /// Before a bucket file is opened: an entry at its name that is not a regular file (a link someone
    /// planted, a FIFO, a socket) is unlinked — the link, never its target — so that the open creates
    /// a fresh file in its place. Returns whether the bucket's file was missing or replaced although the
    /// directory had a MANIFEST (its entries are lost: misses). A directory at the name is left for the
    /// open to refuse.
    static func prepareBucketFile(_ context: BucketContext, hadManifest: Bool) throws(MagpieError) -> Bool {
        let kind = context.directory.kind(.buckets, context.name)
        if let kind, kind != S_IFREG && kind != S_IFDIR {
            try context.directory.unlink(.buckets, context.name)
            try? context.directory.unlink(.buckets, context.name + ".index")  // it indexed another file
        }
        return hadManifest && kind != S_IFREG
    }

    /// The bucket count a new directory gets when ``Configuration/bucketCount`` is nil: 4 MiB of budget
    /// per bucket, at least 16 and at most 256 buckets.
    public static func defaultBucketCount(budget: Int) -> Int {
        var count = 16
        while count < 256 && budget / count > 4 << 20 { count *= 2 }
        return count
    }

    /// A bucket's share (see `Disk/DiskLedger.swift`), if a bucket of that size can hold a record and be
    /// indexed.
    static func bucketBudget(_ budget: Int, count: Int) throws(MagpieError) -> Int {
        let share = DiskLedger.share(budget: budget, count: count)
        guard share >= BucketFileHeader.size + RegionHeader.minimumRegionSize else {
            throw MagpieError(.invalidConfiguration, "a budget of \(budget) bytes is too small for \(count) buckets")
        }
        // Index slots hold offset / 8 in 32 bits: a bucket file may not pass 32 GiB.
        guard share <= maximumBucketBudget else {
            throw MagpieError(
                .invalidConfiguration,
                "a budget of \(budget) bytes over \(count) buckets exceeds \(maximumBucketBudget) bytes per bucket; use more buckets")
        }
        return share
    }

    /// The region size of a new bucket file: a sixteenth of a share (so a bucket at its share has 16
    /// regions, and a reclaim evicts at most a sixteenth of it at a time), a multiple of 1 KiB from 1 KiB
    /// to 4 MiB.
    static func regionSize(share: Int) -> Int {
        max(RegionHeader.minimumRegionSize, min(4 << 20, share / 16) / 1024 * 1024)
    }

    /// The bucket of a hash: its high bits.
    static func bucket(of hash: UInt64, count: Int) -> Int {
        count == 1 ? 0 : Int(hash >> UInt64(64 - count.trailingZeroBitCount))
    }

    static func isValidBucketCount(_ count: Int) -> Bool {
        count >= 1 && count <= maximumBucketCount && count & (count - 1) == 0
    }

    /// "00" … "ff" for 256 buckets; at least two hex digits, as many as the largest number needs.
    package static func bucketName(_ number: Int, count: Int) -> String {
        // Formatted by hand: the open names every bucket, and these are small strings (no allocation).
        let digits = max(2, (Int.bitWidth - max(1, count - 1).leadingZeroBitCount + 3) / 4)
        return String(unsafeUninitializedCapacity: digits) { bytes in
            for position in 0..<digits {
                let nibble = UInt8((number >> (4 * (digits - 1 - position))) & 0xF)
                bytes[position] = nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
            }
            return digits
        }
    }

    /// Deletes the entries of buckets/ that are not bucket files (or their index snapshots): leftover
    /// `.compact` and `.tmp` files of an interrupted compaction or close, strays (they would count against
    /// the budget), and SIZES unless `keepingSizes` (and it is a regular file, or of a kind the file system
    /// does not say). Links are removed, never followed. One listing; names are recognised by parsing
    /// them, not by building every bucket's names: "00" … "ff" (as ``bucketName(_:count:)`` writes them,
    /// lower-case hex of exactly its digit count) and the same followed by ".index".
    static func removeStrays(in directory: CacheDirectory, count: Int, keepingSizes: Bool) throws(MagpieError) {
        let digits = max(2, String(count - 1, radix: 16).count)
        let index = Array(".index".utf8)
        let sizesName = Array(BucketSizes.fileName.utf8)
        var strays: [String] = []
        try directory.forEachEntry(.buckets) { name, type in
            let isSnapshot = name.count == digits + index.count && name.suffix(index.count).elementsEqual(index)
            var number = isSnapshot || name.count == digits ? 0 : -1
            for byte in name.prefix(digits) where number >= 0 {
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): number = number * 16 + Int(byte - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): number = number * 16 + Int(byte - UInt8(ascii: "a")) + 10
                default: number = -1
                }
            }
            if number >= 0 && number < count { return }  // a bucket file or its snapshot
            if keepingSizes && name.elementsEqual(sizesName) && (type == UInt8(DT_REG) || type == UInt8(DT_UNKNOWN)) { return }
            strays.append(String(decoding: name, as: UTF8.self))
        }
        for name in strays {
            do {
                try directory.unlink(.buckets, name)
            } catch {
                throw MagpieError(.directoryUnusable, "cannot remove the stray file", errno: error.errno, path: error.path)
            }
        }
    }

    /// The sizes SIZES records, or nil if it is not an intact SIZES of this directory (or not a regular
    /// file of ours: never read through a link).
    static func readSizes(_ directory: CacheDirectory, count: Int, seed: UInt64) -> BucketSizes? {
        let length = BucketSizes.length(bucketCount: count)
        guard let bytes = (try? directory.readFile(.buckets, BucketSizes.fileName, limit: length)) ?? nil else { return nil }
        return BucketSizes.decode(bytes, bucketCount: count, seed: seed)
    }

    /// Deletes a cache directory's Magpie files (MANIFEST, buckets, LOCK), so the next open starts empty.
    /// Other files in the directory are left alone. The documented way to reset a directory whose
    /// MANIFEST is unreadable or whose bucket count should change. It never follows a link (a link
    /// planted at `buckets` is removed, not entered) and refuses a directory owned by another user or
    /// writable by all; unlike an open it accepts a group-writable one (it only removes).
    /// - Throws: ``MagpieError/Code/directoryLocked`` if a tier has it open;
    ///   ``MagpieError/Code/directoryUnsafe`` (see ``MagpieError/Code/directoryUnsafe``); I/O errors.
    public static func destroy(directory path: String) throws(MagpieError) {
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        let root = try RootDirectory(path: path, directoryMode: 0o700, fileMode: 0o600, allowsGroupWritable: true)
        defer { Glibc.close(root.fd) }
        let fd = try lock(root)
        defer { Glibc.close(fd) }
        let bucketsPath = path + "/buckets"
        var kind = stat()
        if fstatat(root.fd, "buckets", &kind, AT_SYMLINK_NOFOLLOW) == 0 && kind.st_mode & S_IFMT == S_IFDIR {
            let buckets = try CacheDirectory.openDirectory(
                at: root.fd, "buckets", path: bucketsPath, allowsGroupWritable: true)
            defer { Glibc.close(buckets.fd) }
            for name in try FileIO.list(buckets.fd, path: bucketsPath) {
                try FileIO.unlinkAt(buckets.fd, name, path: bucketsPath + "/" + name)
            }
            try FileIO.unlinkAt(root.fd, "buckets", path: bucketsPath, directory: true)
        } else {
            try FileIO.unlinkAt(root.fd, "buckets", path: bucketsPath)  // a link or a file: removed, not followed
        }
        for name in ["MANIFEST", "MANIFEST.tmp", journalName, journalName + ".tmp", "LOCK"] {
            try FileIO.unlinkAt(root.fd, name, path: path + "/" + name)
        }
    }

    // MARK: The directory's health

    /// Checks that the directory, `buckets/` and every bucket file are still the ones opened (see
    /// `CacheDirectory.check`); if not, marks the tier failed and throws
    /// ``MagpieError/Code/directoryReplaced`` (now and from every later call).
    func verifyDirectory() throws(MagpieError) {
        if let failure = health.failure { throw failure }
        var problem = directory.check(bucketFiles: [])
        for bucket in buckets where problem == nil {
            problem = bucket.withLock { state in
                state.isOpen ? directory.check(bucketFiles: [(state.layout.fd, state.context.name)]) : nil
            }
        }
        if let problem {
            health.fail(problem)
            configuration.logger?.error("magpie: the cache directory changed under the tier", metadata: ["error": "\(problem)"])
            throw problem
        }
        lastCheck.store(Self.monotonicMilliseconds(), ordering: .relaxed)
    }

    /// ``verifyDirectory()`` when ``Configuration/directoryCheckInterval`` has passed since the last
    /// check (a coarse clock read otherwise); throws a failure found earlier at once.
    @inline(__always)
    func checkDirectoryIfDue() throws(MagpieError) {
        if let failure = health.failure { throw failure }
        if directoryCheckIsDue { try verifyDirectory() }
    }

    /// Whether the next write checks the directory (``checkDirectoryIfDue()``: a few `fstat` calls per bucket).
    var directoryCheckIsDue: Bool {
        guard let interval = checkInterval else { return false }
        return Self.monotonicMilliseconds() - lastCheck.load(ordering: .relaxed) >= interval
    }

    static func monotonicMilliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC_COARSE, &now)
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(0, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }

    /// Every byte of the budget as the ledger accounts for it (DiskLedger.swift): the MANIFEST allowance,
    /// each bucket's limit and the snapshot it is charged for, SIZES while it is
    /// there, the journal's reservation and the pool. Equal to the budget whenever no operation is under
    /// way (for tests; it takes every bucket's lock).
    package var ledgerTotal: Int {
        var total = DiskLedger.manifestAllowance + sizesFile.heldBytes + journal.withLock { $0.reserved }
        for bucket in buckets { total += bucket.withLock { $0.layout.limit + $0.life.snapshotCharge } }
        return total + ledger.pool.available
    }

    /// How many buckets have their file open (for tests of the open; it takes every bucket's lock).
    package var openBucketFileCount: Int {
        buckets.reduce(0) { count, bucket in count + (bucket.withLock { $0.layout.fd >= 0 } ? 1 : 0) }
    }

    /// How many buckets have their index loaded (for tests of the open; it takes every bucket's lock).
    package var loadedBucketCount: Int {
        buckets.reduce(0) { count, bucket in count + (bucket.withLock { $0.life.loaded } ? 1 : 0) }
    }

    /// The counters and sizes of all buckets. Waits for the buckets whose indexes are still loading
    /// after the open, and for the loader thread's end (see `Disk/IndexLoader.swift`): a bucket that
    /// fails to load counts as empty. Read one bucket at a time, and read again (up to 3 times) if a
    /// bucket's file lost slots meanwhile: room that a lender gave up after it was read, and that a
    /// borrower grew by before it was read, counted twice, and `bytesOnDisk` exceeded the budget (seen in
    /// a test, once in 300 runs under load: 4.92 MB of 4 MiB). After that, read with every bucket's lock
    /// held at once (taken in order; no other code holds two), which stalls each bucket's operations
    /// while a later bucket's lock is awaited.
    public var statistics: DiskTierStatistics {
        var total = DiskTierStatistics()
        var consistent = false
        for _ in 0..<3 where !consistent {
            let cuts = ledger.fileCutCount
            total = DiskTierStatistics()
            for bucket in buckets {
                bucket.withLock { state in
                    try? state.loadIfNeeded()
                    Self.add(state, to: &total)
                }
            }
            consistent = ledger.fileCutCount == cuts
        }
        if !consistent {
            total = DiskTierStatistics()
            sumLocked(from: 0, into: &total)
        }
        loader.waitUntilFinished()  // and for the strays an open that read SIZES left to it
        total.missingBucketFiles = missingBucketFiles + health.bucketFilesRecreatedSinceOpen
        total.originalValueBytes = bucketSet.originalBytes.load(ordering: .relaxed)
        total.storedValueBytes = bucketSet.storedBytes.load(ordering: .relaxed)
        return total
    }

    /// Adds bucket `number`'s counters and those of every bucket after it to `total`, holding the lock of
    /// each until all are read. (A bucket that fails to load counts as empty; no load is tried with every
    /// lock held: the read above tried.)
    private func sumLocked(from number: Int, into total: inout DiskTierStatistics) {
        guard number < buckets.count else { return }
        buckets[number].withLock { state in
            Self.add(state, to: &total)
            sumLocked(from: number + 1, into: &total)
        }
    }

    /// Adds one bucket's counters and sizes to `total` (under its lock).
    private static func add(_ state: borrowing BucketState, to total: inout DiskTierStatistics) {
        let c = state.counters
        total.hits += c.hits
        total.misses += c.misses
        total.writes += c.writes
        total.removals += c.removals
        total.evictions += c.evictions
        total.regionsReclaimed += c.reclaims
        total.regionsEvacuated += c.evacuations
        total.reinsertions += c.reinsertions
        total.reinsertedBytes += c.reinsertedBytes
        total.bytesWritten += c.bytesWritten
        total.corruptRecords += c.corruptRecords
        total.truncatedTails += c.truncatedTails
        total.expired += c.expired
        if c.openedFromSnapshot { total.bucketsOpenedFromSnapshot += 1 }
        total.entries += state.index.count
        total.liveBytes += state.tally.liveBytes
        total.bytesOnDisk += state.layout.size
        total.bufferedBytes += (state.memtables.active?.count ?? 0) + (state.memtables.sealing?.count ?? 0)
        total.regions += state.layout.regions.count
        total.lostBufferedStores += c.lostBufferedRecords
        total.droppedForDamage += c.droppedForDamage
        total.indexBytes += state.index.bytes
    }
}

/// Whether the tier's directory is still its own: set once, when it was found removed or replaced.
final class TierHealth: Sendable {
    private let failed = Atomic<Bool>(false)
    private let error = Locked<MagpieError?>(nil)

    /// The failure, or nil while healthy (one relaxed load).
    var failure: MagpieError? {
        guard failed.load(ordering: .acquiring) else { return nil }
        return error.withLock { $0 }
    }

    private let recreated = Atomic<Int>(0)

    /// Bucket files found missing or replaced when their bucket was loaded, after an open that had
    /// listed them as regular files (see `BucketState.openRecordedFile`).
    var bucketFilesRecreatedSinceOpen: Int { recreated.load(ordering: .relaxed) }

    func noteBucketFileRecreated() { recreated.add(1, ordering: .relaxed) }

    func fail(_ problem: MagpieError) {
        error.withLock { if $0 == nil { $0 = problem } }
        failed.store(true, ordering: .releasing)
    }
}
