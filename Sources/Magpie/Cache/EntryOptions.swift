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

    /// Options with the given expiry, group and tiers. The defaults: never expires, no group, both tiers.
    public init(memoryExpiry: Expiry = .never, diskExpiry: Expiry? = nil, group: String? = nil, tiers: Tiers = .memoryAndDisk) {
        self.memoryExpiry = memoryExpiry
        self.diskExpiry = diskExpiry
        self.group = group
        self.tiers = tiers
    }

    /// Options where both tiers expire together.
    public static func expiring(_ expiry: Expiry, group: String? = nil, tiers: Tiers = .memoryAndDisk) -> EntryOptions {
        EntryOptions(memoryExpiry: expiry, diskExpiry: nil, group: group, tiers: tiers)
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
