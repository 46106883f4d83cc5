import Glibc

// The directory: its lock, MANIFEST, bucket file names, stray files, and reset.

extension DiskTier {
    /// Opens LOCK and takes an exclusive `flock` on it (which also conflicts with a second open of the
    /// same directory in this process). Returns the descriptor, whose closing releases the lock.
    ///
    /// A held lock is retried for up to `lockWait` before `directoryLocked`: a lock just released can
    /// still be held for a moment by a child process that another thread is spawning (between fork and
    /// exec the child shares the descriptor, O_CLOEXEC notwithstanding), so a close and reopen in a
    /// process that also spawns processes would otherwise fail now and then.
    static func lock(_ directory: String) throws(MagpieError) -> Int32 {
        let path = directory + "/LOCK"
        let fd: Int32
        do {
            fd = try FileIO.open(path, O_RDWR | O_CREAT)
        } catch {
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
                throw MagpieError(.directoryLocked, "another DiskTier has this directory open", errno: code, path: directory)
            }
            throw FileIO.error("flock", code, path)
        }
        return fd
    }

    /// How long `lock` waits for a held lock, in µs.
    static let lockWait: UInt32 = 250_000

    /// Reads the MANIFEST, or writes one for a new directory.
    static func openManifest(_ configuration: Configuration) throws(MagpieError) -> Manifest {
        let directory = configuration.directory
        let path = directory + "/MANIFEST"
        guard let bytes = try FileIO.readFile(path) else {
            let foreign = (FileIO.list(directory) ?? []).filter { !["LOCK", "MANIFEST.tmp"].contains($0) }
            if foreign.contains("buckets") {
                throw MagpieError(
                    .directoryUnusable,
                    "the MANIFEST is missing but bucket files remain; DiskTier.destroy(directory:) resets the directory",
                    path: path)
            }
            guard foreign.isEmpty else {
                throw MagpieError(
                    .directoryUnusable, "the directory has no MANIFEST but holds \(foreign.sorted().prefix(5)); refusing to use it",
                    path: directory)
            }
            let count = configuration.bucketCount ?? defaultBucketCount(budget: configuration.budget)
            _ = try bucketBudget(configuration.budget, count: count)  // refuse before creating anything
            let manifest = Manifest(
                bucketCount: count,
                seed: configuration.hashSeed ?? KeyHash.random().seed, created: CacheClock.system.now())
            try FileIO.writeFileAtomically(path, manifest.encoded(), directory: directory)
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

    /// The bucket count a new directory gets when ``Configuration/bucketCount`` is nil: 4 MiB of budget
    /// per bucket, at least 16 and at most 256 buckets.
    public static func defaultBucketCount(budget: Int) -> Int {
        var count = 16
        while count < 256 && budget / count > 4 << 20 { count *= 2 }
        return count
    }

    /// "00" … "ff" for 256 buckets; at least two hex digits, as many as the largest number needs.
    static func bucketName(_ number: Int, count: Int) -> String {
        let digits = max(2, String(count - 1, radix: 16).count)
        let hex = String(number, radix: 16)
        return String(repeating: "0", count: digits - hex.count) + hex
    }

    /// Deletes files in buckets/ that are not bucket files (or their index snapshots) of this count: leftover `.compact`
    /// temporaries of an interrupted compaction, and strays (they would count against the budget).
    static func removeStrays(in directory: String, count: Int) throws(MagpieError) {
        let buckets = (0..<count).map { bucketName($0, count: count) }
        let names = Set(buckets + buckets.map { $0 + ".index" })
        for name in FileIO.list(directory) ?? [] where !names.contains(name) {
            let path = directory + "/" + name
            if unlink(path) != 0 && errno != ENOENT {
                throw MagpieError(.directoryUnusable, "cannot remove the stray file", errno: errno, path: path)
            }
        }
    }

    /// Deletes a cache directory's Magpie files (MANIFEST, buckets, LOCK), so the next open starts empty.
    /// Other files in the directory are left alone. The documented way to reset a directory whose
    /// MANIFEST is unreadable or whose bucket count should change.
    /// - Throws: ``MagpieError/Code/directoryLocked`` if a tier has it open; I/O errors.
    public static func destroy(directory: String) throws(MagpieError) {
        guard FileIO.list(directory) != nil else { return }
        let fd = try lock(directory)
        defer { Glibc.close(fd) }
        let buckets = directory + "/buckets"
        for name in FileIO.list(buckets) ?? [] { unlink(buckets + "/" + name) }
        rmdir(buckets)
        unlink(directory + "/MANIFEST")
        unlink(directory + "/MANIFEST.tmp")
        unlink(directory + "/LOCK")
    }

    /// The counters and sizes of all buckets.
    public var statistics: DiskTierStatistics {
        var total = DiskTierStatistics()
        for bucket in buckets {
            bucket.withLock { state in
                let c = state.counters
                total.hits += c.hits
                total.misses += c.misses
                total.writes += c.writes
                total.removals += c.removals
                total.evictions += c.evictions
                total.compactions += c.compactions
                total.corruptRecords += c.corruptRecords
                total.truncatedTails += c.truncatedTails
                total.expired += c.expired
                if c.openedFromSnapshot { total.bucketsOpenedFromSnapshot += 1 }
                total.entries += state.index.count
                total.liveBytes += state.liveBytes
                total.bytesOnDisk += state.size
                total.bufferedBytes += state.pending.count
                total.lostBufferedStores += c.lostBufferedRecords
                total.indexBytes += state.index.bytes
            }
        }
        total.missingBucketFiles = missingBucketFiles
        total.originalValueBytes = originalBytes.load(ordering: .relaxed)
        total.storedValueBytes = storedBytes.load(ordering: .relaxed)
        return total
    }
}
