/// A value found by ``Cache/lookup(_:)-(String)`` and where it was found.
public struct CacheHit: Sendable, Hashable {
    /// Which tier answered a read.
    public enum Tier: Sendable, Hashable {
        /// The memory tier.
        case memory
        /// The disk tier (the value was promoted into memory unless stored disk-only).
        case disk
    }

    /// The value.
    public var value: [UInt8]
    /// The tier that answered.
    public var tier: Tier

    /// A hit of `value` in `tier`.
    public init(value: [UInt8], tier: Tier) {
        self.value = value
        self.tier = tier
    }
}

/// How many entries an operation removed from each tier (an entry held by both counts in both).
public struct RemovedEntries: Sendable, Hashable {
    /// Entries removed from memory.
    public var memory: Int
    /// Entries removed from disk.
    public var disk: Int

    /// Counts per tier.
    public init(memory: Int = 0, disk: Int = 0) {
        self.memory = memory
        self.disk = disk
    }
}
