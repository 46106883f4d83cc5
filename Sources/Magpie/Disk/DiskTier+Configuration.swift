import Logging

extension DiskTier {
    /// How to open a disk tier.
    public struct Configuration: Sendable {
        /// The cache directory; created if missing (its parent must exist).
        public var directory: String
        /// The most bytes the tier's files may hold together (see **Budget** above).
        public var budget: Int
        /// Buckets (a power of two, 1 to ``DiskTier/maximumBucketCount``), fixed at creation. Nil: the
        /// directory's own for an existing directory, else from the budget (4 MiB per bucket, 16 to 256).
        public var bucketCount: Int?
        /// The zstd level for new values; nil stores every value raw.
        public var compressionLevel: Int?
        /// Values shorter than this are stored raw.
        public var minimumCompressibleLength: Int
        /// The clock for expiry.
        public var clock: CacheClock
        /// The hash seed of a directory created by this open; nil picks a random one (the default:
        /// keys chosen by an attacker then cannot pile into one bucket). An existing directory keeps
        /// the seed in its MANIFEST. Set it for reproducible tests and benchmarks.
        public var hashSeed: UInt64?
        /// Where corruption found on disk (and healed) is logged; nil logs nothing.
        public var logger: Logger?
        /// Damage that repeats (corrupt records met by reads, frames that do not decompress, damaged
        /// bucket files at open) is logged at most twice per this interval and kind: the first at once,
        /// then one line summarising the rest (how many, how many keys, the last error). The statistics
        /// count every one. Default 10 s.
        public var logInterval: Duration = .seconds(10)
        /// Read records through a read-only mapping of each bucket file (the default) instead of a
        /// `pread` per read: 0.5–0.6 µs less per 4 KiB read on our machine (docs/lab-notes/disk.md). To survive
        /// a bucket file being truncated behind its back, or a page the kernel cannot read, the tier then
        /// installs a process-wide SIGBUS handler (once, on the first open), which turns such a fault
        /// inside its own copy into a fallback to `pread` and passes every other SIGBUS on to the handler
        /// installed before it. Set false to keep the process's signal handling untouched.
        public var mappedReads = true
        /// Grow each bucket file in whole 2 MiB ranges that the kernel caches as one huge page each, so that
        /// reads through the mapping (``mappedReads``) take one TLB entry per 2 MiB instead of 512: about 150 ns
        /// less per random 4 KiB read of a page-cache-hot tier on our machine, enough to read faster than LMDB
        /// (docs/lab-notes/disk.md). Off by default, for what it costs:
        /// - **Growth.** When a bucket's growth reaches into a new 2 MiB range of its file and the whole range
        ///   fits within the bucket's limit, the file is extended to the range's end (a hole: no block is
        ///   allocated) and the kernel is asked to cache the range as one folio of zeros, which the bucket's
        ///   writes then fill. The kernel zero-fills 2 MiB, under the bucket's lock: 1–6 ms each on our VM
        ///   (whose host backs guest memory on first touch; a fraction of that where memory is backed), so a
        ///   tier filling from empty stores about 5 × slower (100 k against 500 k stores/s of 4 KiB values, 256
        ///   buckets, p99.9 4–5 ms). A tier whose files are at their limits (a full cache) no longer grows.
        /// - **Memory.** The page cache holds each range whole from its first use: a bucket whose file has not
        ///   reached its limit keeps up to 2 MiB of zeros cached beyond its records (reclaimable, as any clean
        ///   page cache). Files are as long as their slots (charged to the budget as before); the unused ends
        ///   are holes on disk. A bucket lends its unused slots to the others only when they must evict to get
        ///   room (the lending that cuts a file's last slots), not before. The kernel counts a write into a large folio as a write of the whole folio in
        ///   the process's I/O accounting (`/proc/self/io`), not in the blocks it writes.
        /// - **Where it holds.** Only ranges the tier grew with this on, while the page cache keeps them: a file
        ///   read back after its pages were dropped (a reboot) is cached in small pages again. File systems
        ///   without large folios (ext4 before Linux 6.16) and transparent huge pages `never` gain nothing, nor
        ///   buckets whose share is under 2 MiB (budgets under 512 MiB at 256 buckets, under 32 MiB at 16).
        /// Off with ``mappedReads`` off.
        public var hugePageFiles = false
        /// Bytes of each bucket's memtable (at most an eighth of ``DiskTier/bucketBudget``): a store copies
        /// its record there and returns; a background thread compresses and writes the memtable when it is
        /// full (see ``DiskTier``, **Writes**). The price: a store reaches the kernel only when its memtable
        /// is written (when full, by ``DiskTier/writeBuffers()``, ``DiskTier/flush()`` or
        /// ``DiskTier/close()``; a `Cache` calls `writeBuffers()` every second), so a process crash loses the
        /// stores still in memtables; they read as misses after a restart, never as older values. Memory:
        /// up to about twice this per bucket. 0 compresses and writes every record before the store returns.
        public var writeBufferSize = 64 * 1024
        /// When a bucket reclaims its oldest region, an entry there is copied into the newest region
        /// (reinserted) rather than evicted when it was read at least `reinsertionThreshold` times since it
        /// was written or last reinserted — scaled by its size against the bucket's mean record, so a
        /// record half the mean's size needs half as many reads, one twice as large twice as many — and at
        /// most 7 reads count. Lower keeps more of what is read (a higher hit ratio) and writes more; high
        /// (say 1000) reinserts nothing: a plain FIFO, which writes every byte once. Default 5: on the
        /// eviction-heavy benchmark (BENCHMARKS.md) it keeps small, hot values and lets large ones go.
        public var reinsertionThreshold = 5
        /// The mode of the files the tier creates (0600: only the owner reads the data and the MANIFEST's
        /// hash seed). The process's umask can only narrow it.
        public var fileMode: UInt32 = 0o600
        /// The mode of the directories the tier creates (the cache directory if missing, `buckets/`).
        public var directoryMode: UInt32 = 0o700
        /// Accept a cache directory (and `buckets/`) that its group may write to, for a directory shared
        /// by a trusted group. Off by default: such a directory is refused with
        /// ``MagpieError/Code/directoryUnsafe``. A directory writable by all users, or owned by another
        /// user, is always refused. (Even in a group-writable directory the tier never follows a link
        /// anyone plants; see `Disk/CacheDirectory.swift`.)
        public var allowsGroupWritableDirectory = false
        /// How often, at most, a write checks that the directory, `buckets/` and the bucket files are
        /// still the ones the tier opened (a few `fstat` calls per bucket; a bucket file from when its
        /// bucket opened it, see ``DiskTier``, **Reopening**); `flush()` and
        /// `writeBuffers()` always check. Once one was removed or replaced, every call throws
        /// ``MagpieError/Code/directoryReplaced``. Nil: only `flush()` and `writeBuffers()` check.
        public var directoryCheckInterval: Duration? = .seconds(1)
        /// Whether a thread writes full memtables (true), or the store that filled one does, before it
        /// returns (false: for tests that need the same file layout from run to run).
        package var sealsInBackground = true
        /// Whether a thread loads the buckets' indexes after the open (true), or only their first use
        /// does (false: for tests that need buckets left unloaded; see `Disk/IndexLoader.swift`).
        package var loadsInBackground = true

        /// A configuration with defaults: zstd level 1, values of 64 bytes or more compressed.
        public init(
            directory: String, budget: Int, bucketCount: Int? = nil, compressionLevel: Int? = 1,
            minimumCompressibleLength: Int = 64, clock: CacheClock = .system, hashSeed: UInt64? = nil
        ) {
            self.hashSeed = hashSeed
            self.directory = directory
            self.budget = budget
            self.bucketCount = bucketCount
            self.compressionLevel = compressionLevel
            self.minimumCompressibleLength = minimumCompressibleLength
            self.clock = clock
        }
    }
}
