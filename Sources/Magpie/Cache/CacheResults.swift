/// A value found by ``Cache/lookup(_:)-(String)`` and where it was found.
public struct CacheHit: Sendable, Hashable {
    /// Which tier answered a read.
    public enum Tier: Sendable, Hashable {
        /// The memory tier.
        case memory
        /// The disk tier (the value was promoted into memory unless stored disk-only).
        case disk
        /// The remote tier (``Cache/Configuration/remote``); the value was kept locally when it could be.
        case remote
    }

    /// The value.
    public var value: [UInt8]
    /// The tier that answered.
    public var tier: Tier
    /// Whether the value is past its fresh lifetime (``EntryOptions/freshFor``): still served by every
    /// read until it expires, but due a refresh.
    public var isStale: Bool
    /// Until when the value is fresh (ms since 1970); nil when it is fresh until it expires.
    public var freshUntil: Int64?
    /// When the value was stored or loaded (ms since 1970), for an entry stored with a fresh lifetime.
    public var loadedAt: Int64?

    /// A hit of `value` in `tier`.
    public init(value: [UInt8], tier: Tier, isStale: Bool = false, freshUntil: Int64? = nil, loadedAt: Int64? = nil) {
        self.value = value
        self.tier = tier
        self.isStale = isStale
        self.freshUntil = freshUntil
        self.loadedAt = loadedAt
    }

    /// The hit of `entry` (nil for none or a negative entry); the clock is read only for an entry with
    /// a fresh lifetime.
    init?(_ entry: StoredEntry?, tier: Tier, clock: CacheClock) {
        guard let entry, !entry.freshness.negative else { return nil }
        let freshness = entry.freshness
        self.init(
            value: entry.value, tier: tier, isStale: freshness.freshUntil != 0 && !freshness.isFresh(at: clock.now()),
            freshUntil: freshness.freshUntil == 0 ? nil : freshness.freshUntil,
            loadedAt: freshness.freshUntil == 0 ? nil : freshness.loadedAt)
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
