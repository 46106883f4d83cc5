import CoreMetrics
import Logging

extension Cache {
    /// Everything a ``Cache`` is opened with: each tier's own configuration, and what the cache adds. Every
    /// field has a default; a disk configuration (a directory) turns the disk tier on.
    ///
    /// ```swift
    /// var configuration = Cache.Configuration(directory: "/var/cache/my-service")
    /// configuration.memory.budget = 256 << 20
    /// configuration.disk?.budget = 4 << 30
    /// let cache = try Cache(configuration)
    /// ```
    ///
    /// A tier's settings are set on its configuration (``memory``, ``disk``), so every tier setting can be
    /// set through a `Cache`. The settings the tiers share are set here, once: ``clock``, ``hashSeed``,
    /// ``logger`` and ``logInterval``. A tier configuration that leaves them at their defaults takes the
    /// cache's; one that sets another value is refused (``MagpieError/Code/invalidConfiguration``), never
    /// silently replaced.
    public struct Configuration: Sendable {
        /// The memory tier: budget (default 64 MiB) and shard count.
        public var memory: MemoryTier.Configuration
        /// The disk tier: directory, budget (default 1 GiB), buckets, compression, write buffer, trust
        /// settings; nil keeps the cache in memory only. One ``Cache`` at a time may have a directory open.
        public var disk: DiskTier.Configuration?
        /// The options of a store that passes none.
        public var defaultOptions: EntryOptions
        /// The clock expiry is measured by, in both tiers; inject one in tests.
        public var clock: CacheClock
        /// The hash seed of a new directory, or of a memory-only cache; nil picks a random one. An existing
        /// directory keeps the seed in its MANIFEST, and the memory tier then uses it too (one hash per
        /// operation serves both tiers). Set it for reproducible benchmarks.
        public var hashSeed: UInt64?
        /// Threads that run disk I/O for the async API. Default 2.
        public var ioThreadCount: Int
        /// Whether an async read that misses memory (``AsyncCache/value(forKey:)-(String)``, `lookup`,
        /// `contains`, and a loader's read of the local tiers) first tries its disk read on the caller's
        /// task, when that read cannot wait: the key's stripe (taken by the reads that promote) and the
        /// bucket's lock free, the bucket's index loaded, and the record's pages in the page cache
        /// (`mincore`). A disk hit then costs no hop to an I/O thread and back (two thread wake-ups, tens of
        /// microseconds on a VM, against a few for the read). Otherwise, and for every write, the work
        /// hops as before, and so does the read of a cancelled task (which throws `CancellationError`
        /// there). Default true; false: every async disk read runs on an I/O thread (a caller's
        /// thread then never takes a disk tier lock, nor copies from a file's mapping).
        public var inlineResidentDiskReads: Bool
        /// Whether an async store without a remote tier (``AsyncCache/set(_:forKey:options:)-(_,String,_)``)
        /// first tries to run on the caller's task, when it cannot wait: the key's stripe and the bucket's
        /// lock free within a short spin, and the disk's half a plain memtable append (no record of the key
        /// in the file, whose tombstone would be written; room in the memtables; the bucket loaded and with
        /// nothing to heal; a value that fits a memtable). It then costs no hop (two thread wake-ups) and
        /// keeps every guarantee of the store that hops. Otherwise it hops as before: overwrites of values
        /// in the file, memory-only stores, expiries already past, cancelled tasks, no write buffer.
        /// Default true; false: every async store with a disk tier runs on an I/O thread.
        public var inlineDiskStores: Bool
        /// Where disk I/O errors and corruption found on disk are logged.
        public var logger: Logger
        /// A failure that repeats (failed loads, subscript failures, disk I/O errors, corrupt records)
        /// is logged at most twice per this interval and kind: the first at once, in full, then one line
        /// summarising the rest ("a load failed: 412 more in the last 10 s, 3 keys", with the last
        /// error). ``Cache/statistics`` and the metrics count every one. Default 10 s.
        public var logInterval: Duration = .seconds(10)
        /// How statistics reach swift-metrics; nil reports nothing.
        public var metrics: MetricsOptions?
        /// How often the cache writes its disk buckets' write buffers to the kernel (on an I/O thread,
        /// without fsync), so that no store waits longer than about this for a crash to spare it; nil
        /// writes them only when full, on a removal, `flush()` and `close()`. See
        /// ``DiskTier/Configuration/writeBufferSize``.
        public var diskBufferWriteInterval: Duration? = .seconds(1)
        /// The loader options of a loader call that passes none (see ``LoaderOptions``).
        public var defaultLoaderOptions = LoaderOptions()
        /// Threads that run the synchronous loader API's loads when they must not run on the caller's
        /// thread (background refreshes, and loads a caller may stop waiting for). Default 4.
        public var loaderThreadCount = 4
        /// A remote tier shared with other instances (`MagpieRedis`'s `RedisRemoteStore`), after disk: reads
        /// go memory → disk → remote, stores and removals go through to it, and local copies are kept
        /// coherent with it (see <doc:RunningAFleet>). Nil (the default): none.
        public var remote: RemoteTierOptions? = nil

        /// A configuration with the defaults; pass a directory for a two-tier cache.
        public init(
            directory: String? = nil, memoryBudget: Int = 64 << 20, diskBudget: Int = 1 << 30,
            defaultOptions: EntryOptions = EntryOptions()
        ) {
            memory = MemoryTier.Configuration(budget: memoryBudget)
            disk = directory.map { DiskTier.Configuration(directory: $0, budget: diskBudget) }
            self.defaultOptions = defaultOptions
            clock = .system
            hashSeed = nil
            ioThreadCount = 2
            inlineResidentDiskReads = true
            inlineDiskStores = true
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
    /// `_loader_coalesced`, `_loader_failures`, `_disk_errors`, `_subscript_failures`, `_inline_disk_reads`. Gauges:
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

extension Cache.Configuration {
    /// This configuration with the settings both tiers share (the clock, the hash seed, the logger and
    /// the log interval) given to each tier: a tier's own left at its default takes the cache's; one set
    /// to something else is refused.
    func sharingItsSettings() throws(MagpieError) -> Cache.Configuration {
        func shared<T: Equatable>(_ name: String, _ tier: String, _ value: T, default: T, _ cache: T) throws(MagpieError) -> T {
            guard value == `default` || value == cache else {
                throw MagpieError(
                    .invalidConfiguration,
                    "the \(tier) tier's \(name) differs from Cache.Configuration.\(name): set it there, once for both tiers")
            }
            return cache
        }
        var resolved = self
        resolved.memory.clock = try shared("clock", "memory", memory.clock, default: .system, clock)
        resolved.memory.hashSeed = try shared("hashSeed", "memory", memory.hashSeed, default: nil, hashSeed)
        if let disk {
            resolved.disk?.clock = try shared("clock", "disk", disk.clock, default: .system, clock)
            resolved.disk?.hashSeed = try shared("hashSeed", "disk", disk.hashSeed, default: nil, hashSeed)
            resolved.disk?.logInterval = try shared("logInterval", "disk", disk.logInterval, default: .seconds(10), logInterval)
            if disk.logger == nil { resolved.disk?.logger = logger }
        }
        return resolved
    }
}
