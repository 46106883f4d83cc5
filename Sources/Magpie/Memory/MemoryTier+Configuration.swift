extension MemoryTier {
    /// How to create a memory tier. A ``Cache`` takes one as ``Cache/Configuration/memory``.
    public struct Configuration: Sendable {
        /// Bytes the tier may charge (key + value + ``MemoryTier/entryOverhead`` per entry), shared by its
        /// shards. Default 64 MiB.
        public var budget: Int
        /// Shards, a power of two from 1 to ``MemoryTier/maximumShardCount``; nil:
        /// ``MemoryTier/defaultShardCount``.
        public var shardCount: Int?
        /// The seed of the key hash; nil picks a random one (keys chosen by an attacker then cannot pile
        /// into one shard). Set it for reproducible tests and benchmarks. In a ``Cache``, set
        /// ``Cache/Configuration/hashSeed`` instead (another value here is refused); with a disk tier the
        /// directory's seed is used, so that one hash serves both tiers.
        public var hashSeed: UInt64?
        /// The clock expiry is judged by; inject one in tests. In a ``Cache``, leave it at its default and set
        /// ``Cache/Configuration/clock``, which both tiers share (another value is refused).
        public var clock: CacheClock

        /// A configuration with the given budget and defaults for the rest.
        public init(budget: Int = 64 << 20, shardCount: Int? = nil, hashSeed: UInt64? = nil, clock: CacheClock = .system) {
            self.budget = budget
            self.shardCount = shardCount
            self.hashSeed = hashSeed
            self.clock = clock
        }
    }
}
