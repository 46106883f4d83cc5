import CoreMetrics
import Logging

extension Cache {
    /// Everything a ``Cache`` is opened with. Every field has a default; a directory turns the disk tier on.
    ///
    /// ```swift
    /// var configuration = Cache.Configuration(directory: "/var/cache/my-service")
    /// configuration.memoryBudget = 256 << 20
    /// configuration.diskBudget = 4 << 30
    /// let cache = try Cache(configuration)
    /// ```
    public struct Configuration: Sendable {
        /// Bytes the memory tier may charge (key + value + ``MemoryTier/entryOverhead`` per entry), shared
        /// by its shards. Default 64 MiB.
        public var memoryBudget: Int
        /// Memory shards, a power of two; nil: ``MemoryTier/defaultShardCount``.
        public var shardCount: Int?
        /// The disk tier's directory; nil keeps the cache in memory only. Created if missing (its parent
        /// must exist). One ``Cache`` at a time may have it open.
        public var directory: String?
        /// Bytes the disk tier's files may hold together (bucket files, a compaction's temporary file,
        /// index snapshots, MANIFEST). Default 1 GiB.
        public var diskBudget: Int
        /// Disk bucket files, a power of two, fixed when the directory is created; nil: the directory's
        /// own, or from the budget for a new one.
        public var bucketCount: Int?
        /// The zstd level for disk values (1 is fast and usually enough); nil stores them raw.
        public var compressionLevel: Int?
        /// The options of a store that passes none.
        public var defaultOptions: EntryOptions
        /// The clock expiry is measured by; inject one in tests.
        public var clock: CacheClock
        /// The hash seed of a new directory, or of a memory-only cache; nil picks a random one. Set it for
        /// reproducible benchmarks.
        public var hashSeed: UInt64?
        /// Threads that run disk I/O for the async API. Default 2.
        public var ioThreadCount: Int
        /// Where disk I/O errors and corruption found on disk are logged.
        public var logger: Logger
        /// How statistics reach swift-metrics; nil reports nothing.
        public var metrics: MetricsOptions?
        /// Read disk records through mappings of the bucket files, with a process-wide SIGBUS guard
        /// (the default); false: a `pread` per read and no signal handler. See
        /// ``DiskTier/Configuration/mappedReads``.
        public var mappedDiskReads = true
        /// Bytes each disk bucket gathers before one write to its file; 0 writes every disk store
        /// through before the call returns. See ``DiskTier/Configuration/writeBufferSize``.
        public var diskWriteBufferSize = 64 * 1024
        /// How often the cache writes its disk buckets' write buffers to the kernel (on an I/O thread,
        /// without fsync), so that no store waits longer than about this for a crash to spare it; nil
        /// writes them only when full, on a removal, `flush()` and `close()`.
        public var diskBufferWriteInterval: Duration? = .seconds(1)
        /// The mode of the files the disk tier creates (0600). See ``DiskTier/Configuration/fileMode``.
        public var diskFileMode: UInt32 = 0o600
        /// The mode of the directories the disk tier creates (0700). See
        /// ``DiskTier/Configuration/directoryMode``.
        public var diskDirectoryMode: UInt32 = 0o700
        /// Accept a cache directory its group may write to (off: refused with
        /// ``MagpieError/Code/directoryUnsafe``). See ``DiskTier/Configuration/allowsGroupWritableDirectory``.
        public var allowsGroupWritableDirectory = false
        /// How often, at most, a disk write checks that the directory is still the one opened (the cache's
        /// periodic buffer write checks too). See ``DiskTier/Configuration/directoryCheckInterval``.
        public var directoryCheckInterval: Duration? = .seconds(1)

        /// A configuration with the defaults; pass a directory for a two-tier cache.
        public init(
            directory: String? = nil, memoryBudget: Int = 64 << 20, diskBudget: Int = 1 << 30,
            defaultOptions: EntryOptions = EntryOptions()
        ) {
            self.directory = directory
            self.memoryBudget = memoryBudget
            self.diskBudget = diskBudget
            self.defaultOptions = defaultOptions
            shardCount = nil
            bucketCount = nil
            compressionLevel = 1
            clock = .system
            hashSeed = nil
            ioThreadCount = 2
            logger = Logger(label: "magpie")
            metrics = MetricsOptions()
        }
    }

    /// How a ``Cache`` reports to swift-metrics.
    ///
    /// Nothing is counted on the hot path for metrics: a reporter reads ``Cache/statistics`` every
    /// ``interval`` (and on ``Cache/reportMetrics()``) and adds the change since the last report to
    /// counters, and sets gauges. Without a bootstrapped metrics backend this costs one snapshot per
    /// interval and reports nowhere.
    ///
    /// Counters (label, with dimension `tier` = `memory` or `disk` where it applies): `<prefix>_hits`,
    /// `_misses`, `_promotions`, `_evictions`, `_writes`, `_corrupt_records`, `_loader_runs`,
    /// `_loader_coalesced`, `_loader_failures`, `_disk_errors`, `_subscript_failures`. Gauges:
    /// `<prefix>_entries`, `_bytes` (per tier).
    public struct MetricsOptions: Sendable {
        /// The label prefix. Default `magpie`.
        public var prefix: String
        /// Dimensions added to every metric, e.g. `[("cache", "thumbnails")]`.
        public var dimensions: [(String, String)]
        /// How often to report; nil: only on ``Cache/reportMetrics()``. Default 10 s.
        public var interval: Duration?
        /// The factory to create metrics with; nil: `MetricsSystem.factory` (the bootstrapped backend).
        public var factory: (any MetricsFactory)?

        /// Options with the given prefix, dimensions and interval.
        public init(
            prefix: String = "magpie", dimensions: [(String, String)] = [], interval: Duration? = .seconds(10),
            factory: (any MetricsFactory)? = nil
        ) {
            self.prefix = prefix
            self.dimensions = dimensions
            self.interval = interval
            self.factory = factory
        }
    }
}
