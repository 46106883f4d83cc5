// The change messages a store reports and where it reports them (see RemoteStore's **Changes**).

/// One change message (see ``RemoteStore``): what a write through the store published.
public struct RemoteChangeMessage: Sendable, Equatable {
    /// The logical key written.
    public var key: [UInt8]
    /// The write's version (the fence of a versioned write), 0 for an unversioned write.
    public var version: UInt64
    /// Whether this store's own instance made the write (the cache that made it keeps what it wrote).
    public var own: Bool
    /// The key's partition and the message's place in it (1, 2, 3, …; 0: not sequenced).
    public var partition: Int
    public var sequence: UInt64
    /// The value as stored (versioned), when the write pushed it.
    public var value: [UInt8]?

    public init(key: [UInt8], version: UInt64, own: Bool, partition: Int, sequence: UInt64, value: [UInt8]? = nil) {
        self.key = key
        self.version = version
        self.own = own
        self.partition = partition
        self.sequence = sequence
        self.value = value
    }
}

/// Where a ``RemoteStore`` reports changes: given to it by the cache (``RemoteStore/startReporting(to:)``).
/// Every method returns at once (the cache applies the changes in order on a thread of its own).
public final class RemoteChanges: Sendable {
    /// The most partitions a store may have (a Redis Cluster's hash slots).
    public static let maximumPartitions = 16_384

    let sink: @Sendable (RemoteChange) -> Void
    let clock: CacheClock
    let ownDelivery: @Sendable () -> Int64
    let wantsSequences: @Sendable () -> Bool

    init(
        clock: CacheClock, delivered: @escaping @Sendable () -> Int64 = { Int64.max },
        wantsSequences: @escaping @Sendable () -> Bool = { false }, sink: @escaping @Sendable (RemoteChange) -> Void
    ) {
        self.clock = clock
        self.ownDelivery = delivered
        self.wantsSequences = wantsSequences
        self.sink = sink
    }

    /// The cache's clock (ms since 1970): the instants given to ``confirm(through:total:)`` come from it.
    public func now() -> Int64 { clock.now() }

    /// A change message, in the order the store received it.
    public func changed(_ message: RemoteChangeMessage) {
        sink(.changed(message))
    }

    /// The partitions' sequence numbers as the store holds them (partitions absent: 0), reported after
    /// every message published before they were read: a partition whose messages stopped short of its
    /// number missed some, and its local copies are dropped. The first report after the feed starts
    /// sets where each partition's sequence continues.
    public func sequences(_ numbers: [Int: UInt64]) {
        sink(.sequences(numbers))
    }

    /// The store's sequence numbers restarted from 0 in every partition (its counters were lost, and made
    /// anew), and the message or confirmation reported next is the first of the new numbering: the cache
    /// counts from 0 again (a first number above 1 is a gap), where it would otherwise take every number
    /// up to the old ones for a repeat and miss the gaps among them. Drops no copy.
    public func sequencesRestarted() {
        sink(.sequencesRestarted)
    }

    /// Whether the cache found its messages fall short of a total the store reported
    /// (``confirm(through:total:)``): the store then reads and reports every partition's number
    /// (``sequences(_:)``), which finds the partitions that missed messages.
    public var sequencesWanted: Bool { wantsSequences() }

    /// Messages of these partitions may have been missed (a feed that lost a heartbeat, a partition that
    /// moved): their local copies are misses from now on.
    public func partitionsLost(_ partitions: [Int]) {
        guard !partitions.isEmpty else { return }
        sink(.partitionsLost(partitions))
    }

    /// `keys` (logical keys, as the cache passed them to the store) changed or went away, by a program
    /// that is not a cache (or an expiry, an eviction): the copies go.
    public func invalidate(keys: [[UInt8]]) {
        guard !keys.isEmpty else { return }
        sink(.keys(keys))
    }

    /// Anything may have changed: the change feed was interrupted and is back, or the store was emptied.
    /// Every local entry stored or fetched before this call is a miss from now on.
    public func invalidateAll() {
        sink(.all)
    }

    /// Every change made in the store before `instant` (from ``now()``) has been reported. `total`, when
    /// the store can give it: how many sequenced messages were published in all (the sum of the
    /// partitions' numbers), checked against what was reported.
    public func confirm(through instant: Int64, total: UInt64? = nil) {
        sink(.confirmed(instant, total: total))
    }

    /// The instant (from ``now()``) before which every write this cache returned to its callers has
    /// reached the store: its writes under way and the removals it owes hold it back. A store that
    /// serves several instances publishes it for the others (see ``allDelivered(through:)``).
    public func ownWritesDelivered() -> Int64 {
        min(clock.now(), ownDelivery())
    }

    /// Every write that any instance sharing the store returned to its callers before `instant` has
    /// reached the store (the least of the instances' ``ownWritesDelivered()``, over those the store
    /// still waits for). Until it passes an instant, neither a local copy nor a value fetched from the
    /// store is trusted past ``RemoteTierOptions/maxDisconnectedStaleness`` after it: an instance's
    /// write that could not reach the store (owed, replayed later) may have replaced it. Report it in
    /// order with the confirmations, after the changes before it. A store that never calls this
    /// leaves the cache trusting every confirmed copy.
    public func allDelivered(through instant: Int64) {
        sink(.delivered(instant))
    }
}

enum RemoteChange: Sendable {
    case changed(RemoteChangeMessage)
    case sequences([Int: UInt64])
    case sequencesRestarted
    case partitionsLost([Int])
    case keys([[UInt8]])
    case all
    case confirmed(Int64, total: UInt64?)
    case delivered(Int64)
}
