/// Where an entry is kept.
public enum Tiers: Sendable, Hashable {
    /// In memory and on disk (the default). A read that misses memory finds it on disk and promotes it.
    case memoryAndDisk
    /// In memory only. Storing it removes any older value of the key from disk.
    case memoryOnly
    /// On disk only: reads never copy it into memory. Storing it removes the key from memory.
    case diskOnly
}

/// How one entry is stored: its expiry in each tier, its group and its tiers.
///
/// ```swift
/// // Five minutes in memory, a day on disk, removed with the rest of "user-42"'s entries:
/// let options = EntryOptions(memoryExpiry: .after(.seconds(300)), diskExpiry: .after(.seconds(86_400)),
///                            group: "user-42")
/// ```
public struct EntryOptions: Sendable, Hashable {
    /// How long the entry is served from memory.
    ///
    /// ``Expiry/after(_:)`` is a lifetime in memory: it starts when the value is stored, and again each
    /// time a read promotes the value from disk into memory. ``Expiry/at(millisecondsSince1970:)`` is a
    /// fixed instant. A copy promoted from disk never outlives the disk entry's own expiry.
    public var memoryExpiry: Expiry
    /// When the disk copy stops being served; nil: the same as ``memoryExpiry`` (measured from the store).
    public var diskExpiry: Expiry?
    /// The group ("owner") to remove the entry with, see `Cache.removeAll(inGroup:)`; nil for none.
    public var group: String?
    /// Which tiers keep the entry.
    public var tiers: Tiers
    /// How long the value is *fresh*, from the store (for a loaded value: from the start of its load).
    /// After it the value is *stale*: the plain reads (`cache[key]`, ``Cache/value(forKey:)-(String)``)
    /// still return it until its expiry, and the loader API serves it while it refreshes it, or when
    /// the loader fails or is slow (see ``LoaderOptions``). Nil: fresh until it expires. Both tiers keep
    /// the instant, across reopen. See <doc:FreshnessAndLoaders>.
    public var freshFor: Duration?
    /// A random spread added to the entry's lifetimes: each store adds one offset, drawn from 0 up to
    /// `jitter`, to ``freshFor`` and to every expiry given as ``Expiry/after(_:)``, so that entries
    /// written together do not go stale or expire together. Zero (the default): none. Fixed instants
    /// (``Expiry/at(millisecondsSince1970:)``) are never moved, nor is the lifetime a promotion from
    /// disk re-applies.
    public var jitter: Duration

    /// Options with the given expiry, group and tiers. The defaults: never expires, no group, both
    /// tiers, fresh until it expires, no jitter.
    public init(
        memoryExpiry: Expiry = .never, diskExpiry: Expiry? = nil, group: String? = nil, tiers: Tiers = .memoryAndDisk,
        freshFor: Duration? = nil, jitter: Duration = .zero
    ) {
        self.memoryExpiry = memoryExpiry
        self.diskExpiry = diskExpiry
        self.group = group
        self.tiers = tiers
        self.freshFor = freshFor
        self.jitter = jitter
    }

    /// Options where both tiers expire together.
    public static func expiring(_ expiry: Expiry, group: String? = nil, tiers: Tiers = .memoryAndDisk) -> EntryOptions {
        EntryOptions(memoryExpiry: expiry, diskExpiry: nil, group: group, tiers: tiers)
    }

    /// Options for a loaded value that is fresh for `fresh`, then stale (served by the loader API while
    /// it refreshes) until `expiry` after the store, in both tiers.
    public static func fresh(
        for fresh: Duration, staleUntil expiry: Expiry, group: String? = nil, tiers: Tiers = .memoryAndDisk,
        jitter: Duration = .zero
    ) -> EntryOptions {
        EntryOptions(memoryExpiry: expiry, diskExpiry: nil, group: group, tiers: tiers, freshFor: fresh, jitter: jitter)
    }

    /// The deadlines of a store at `now` (ms since 1970) of a key with hash `hash` (which, with `now`,
    /// draws the jitter). The clock is read only when a lifetime needs it.
    @inline(__always)
    func stamp(now: @autoclosure () -> Int64, hash: UInt64) -> StoreStamp {
        guard freshFor != nil || memoryExpiry != .never || (diskExpiry != nil && diskExpiry != .never) else {
            return StoreStamp()
        }
        let now = now()
        var spread: Int64 = 0
        if jitter > .zero {
            let range = UInt64(jitter.wholeMilliseconds) &+ 1
            var mixed = (hash ^ UInt64(bitPattern: now)) &* 0x9E37_79B9_7F4A_7C15
            mixed ^= mixed &>> 29
            spread = Int64(mixed % range)
        }
        func deadline(_ expiry: Expiry) -> Int64 {
            guard case .after = expiry else { return expiry.deadline(now: now) }
            let base = expiry.deadline(now: now)
            let sum = base.addingReportingOverflow(spread)
            return sum.overflow ? Int64.max : sum.partialValue
        }
        var stamp = StoreStamp(memory: deadline(memoryExpiry), disk: deadline(effectiveDiskExpiry))
        if let freshFor {
            stamp.freshness = Freshness(freshUntil: max(1, deadline(.after(max(freshFor, .zero)))), loadedAt: max(1, now))
        }
        return stamp
    }

    /// The disk expiry in effect.
    var effectiveDiskExpiry: Expiry { diskExpiry ?? memoryExpiry }

    /// The memory expiry as stored beside the disk record: 0 none, > 0 an instant, < 0 minus a lifetime.
    var encodedMemoryPolicy: Int64 {
        switch memoryExpiry {
        case .never:
            return 0
        case .after(let duration):
            guard duration > .zero else { return 1 }  // no lifetime at all: an instant long past
            let lifetime = Expiry.after(duration).deadline(now: 0)  // in ms, ≥ 1, Int64.max on overflow
            return -min(lifetime, Int64.max - 1)
        case .at(let instant):
            return max(1, instant)
        }
    }

    /// The memory deadline (ms since 1970, 0 = never) of a copy promoted at `now` from a disk record
    /// with `policy` and disk deadline `diskDeadline`.
    static func promotedDeadline(policy: Int64, diskDeadline: Int64, now: Int64) -> Int64 {
        var deadline: Int64
        if policy > 0 {
            deadline = policy
        } else if policy < 0 {
            let lifetime = policy == .min ? Int64.max : -policy  // a foreign record may hold Int64.min
            let sum = now.addingReportingOverflow(lifetime)
            deadline = sum.overflow ? Int64.max : sum.partialValue
        } else {
            deadline = 0
        }
        if diskDeadline != 0 { deadline = deadline == 0 ? diskDeadline : min(deadline, diskDeadline) }
        return deadline
    }
}

/// The deadlines of one store, computed once (ms since 1970; 0 = none): the memory and disk expiries
/// and the freshness.
struct StoreStamp: Sendable {
    var memory: Int64 = 0
    var disk: Int64 = 0
    var freshness = Freshness.none
    /// A cache with a remote tier: the coherence stamp the local copies carry (Remote/Coherence.swift),
    /// and the version of the remote write they hold, kept beside the value in both tiers; 0 without a
    /// remote tier.
    var coherence: Int64 = 0
    var version: UInt64 = 0
}
