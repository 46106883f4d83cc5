/// What one discovery found: the masters, and which of them owns each of the 16384 slots.
///
/// Built from a node's `CLUSTER SHARDS` reply (Redis ≥ 7, Valkey) or, from older servers, `CLUSTER
/// SLOTS`. Only masters are kept: a cache client sends reads and writes alike to the slot's master. A node
/// the cluster reports without a usable address (an empty host, or `?` when the cluster's preferred
/// endpoint type has no value for it) is reached at the host of the node that answered, as Redis documents.
struct ClusterTopology: Sendable, Hashable {
    /// The masters that own at least one slot, in the order the reply named them.
    private(set) var masters: [RedisEndpoint] = []
    /// Each master's index in ``masters``: a reply names a master once per range it owns, and a search of
    /// ``masters`` per range made a hostile reply of 16,384 masters cost 134 million comparisons (12 s
    /// in a debug build, where the test of that reply spent them).
    private var indexOfMaster: [RedisEndpoint: Int] = [:]
    /// 16384 entries: the index in ``masters`` of each slot's owner, or ``unassigned``.
    var slots: [UInt16] = Array(repeating: ClusterTopology.unassigned, count: RedisHashSlot.count)

    /// The entry of a slot no master serves.
    static let unassigned = UInt16.max

    /// Slots with an owner.
    var assignedSlots: Int { slots.count { $0 != Self.unassigned } }

    /// Records that `endpoint` owns the slots `first…last` (bounds checked: a bad range is an error).
    mutating func assign(_ first: Int64, _ last: Int64, to endpoint: RedisEndpoint) throws(RedisError) {
        guard 0 <= first, first <= last, last < RedisHashSlot.count else {
            throw RedisError(.unexpectedReply, "cluster slot range \(first)-\(last) is out of bounds", endpoint: endpoint)
        }
        let index: Int
        if let known = indexOfMaster[endpoint] {
            index = known
        } else {
            // At most one master per slot: more is a reply no cluster sends (and would not fit UInt16).
            guard masters.count < RedisHashSlot.count else {
                throw RedisError(.unexpectedReply, "the cluster reply names more masters than there are slots", endpoint: endpoint)
            }
            index = masters.count
            masters.append(endpoint)
            indexOfMaster[endpoint] = index
        }
        for slot in Int(first)...Int(last) { slots[slot] = UInt16(index) }
    }

    /// Drops the masters whose every slot a later range gave to another (no pool is made for them).
    mutating func dropMastersWithoutSlots() {
        var used = Array(repeating: false, count: masters.count)
        for index in slots where index != Self.unassigned { used[Int(index)] = true }
        guard used.contains(false) else { return }
        var renumbered = Array(repeating: Self.unassigned, count: masters.count)
        var kept: [RedisEndpoint] = []
        for (index, endpoint) in masters.enumerated() where used[index] {
            renumbered[index] = UInt16(kept.count)
            kept.append(endpoint)
        }
        masters = kept
        indexOfMaster = Dictionary(uniqueKeysWithValues: kept.enumerated().map { ($1, $0) })
        for slot in slots.indices where slots[slot] != Self.unassigned { slots[slot] = renumbered[Int(slots[slot])] }
    }

    // MARK: CLUSTER SHARDS

    /// Parses a `CLUSTER SHARDS` reply: an array of shards, each a map (an array of alternating keys and
    /// values under RESP2) with `slots` (a flat list of start / end pairs) and `nodes` (maps with `ip`,
    /// `endpoint`, `port`, `tls-port`, `role`, `health`).
    ///
    /// - Parameters:
    ///   - answeringHost: the host of the node that replied, for nodes reported without an address.
    ///   - tls: whether the client connects with TLS (then a node's `tls-port` is used when present).
    init(shards reply: RESPValue, answeringHost: String, tls: Bool) throws(RedisError) {
        guard let shards = reply.arrayValue else {
            throw RedisError(.unexpectedReply, "CLUSTER SHARDS replied \(reply)")
        }
        for shard in shards {
            guard let fields = Self.fields(of: shard), let ranges = fields["slots"]?.arrayValue,
                  let nodes = fields["nodes"]?.arrayValue
            else { throw RedisError(.unexpectedReply, "CLUSTER SHARDS: malformed shard \(shard)") }
            guard !ranges.isEmpty else { continue }  // a shard without slots (a new, empty master)
            let master = nodes.lazy.compactMap(Self.fields(of:)).first { node in
                let role = node["role"]?.string
                return role == "master" || role == "primary"
            }
            guard let master, let endpoint = Self.endpoint(of: master, answeringHost: answeringHost, tls: tls) else {
                continue  // no master known for now (a failover under way): its slots stay unassigned
            }
            guard ranges.count.isMultiple(of: 2) else {
                throw RedisError(.unexpectedReply, "CLUSTER SHARDS: odd slot list \(ranges)")
            }
            var index = 0
            while index < ranges.count {
                guard let first = Self.integer(ranges[index]), let last = Self.integer(ranges[index + 1]) else {
                    throw RedisError(.unexpectedReply, "CLUSTER SHARDS: bad slot range in \(ranges)")
                }
                try assign(first, last, to: endpoint)
                index += 2
            }
        }
    }

    private static func endpoint(of node: [String: RESPValue], answeringHost: String, tls: Bool) -> RedisEndpoint? {
        let portValue = (tls ? node["tls-port"] : nil) ?? node["port"] ?? node["tls-port"]
        guard let port = portValue.flatMap(integer), (1...65535).contains(port) else { return nil }
        var host = node["endpoint"]?.string ?? ""
        if host.isEmpty || host == "?" { host = node["ip"]?.string ?? "" }
        if host.isEmpty || host == "?" { host = answeringHost }
        return RedisEndpoint(host: host, port: Int(port))
    }

    // MARK: CLUSTER SLOTS

    /// Parses a `CLUSTER SLOTS` reply: an array of `[start, end, [host, port, id, …], replica…]`; the first
    /// node of each range is its master.
    init(slots reply: RESPValue, answeringHost: String) throws(RedisError) {
        guard let ranges = reply.arrayValue else {
            throw RedisError(.unexpectedReply, "CLUSTER SLOTS replied \(reply)")
        }
        for range in ranges {
            guard let items = range.arrayValue, items.count >= 3, let first = Self.integer(items[0]),
                  let last = Self.integer(items[1]), let node = items[2].arrayValue, node.count >= 2,
                  let port = Self.integer(node[1]), (1...65535).contains(port)
            else { throw RedisError(.unexpectedReply, "CLUSTER SLOTS: malformed range \(range)") }
            var host = node[0].string ?? ""
            if host.isEmpty || host == "?" { host = answeringHost }
            try assign(first, last, to: RedisEndpoint(host: host, port: Int(port)))
        }
    }

    // MARK: Helpers

    /// A map's entries by key (RESP3), or the same from an array of alternating keys and values (RESP2).
    private static func fields(of value: RESPValue) -> [String: RESPValue]? {
        var fields: [String: RESPValue] = [:]
        switch value.value {
        case .map(let pairs):
            for pair in pairs {
                if let key = pair.key.string { fields[key] = pair.value }
            }
        case .array(let items) where items.count.isMultiple(of: 2):
            var index = 0
            while index < items.count {
                if let key = items[index].string { fields[key] = items[index + 1] }
                index += 2
            }
        default:
            return nil
        }
        return fields
    }

    /// An integer, or a bulk string of digits (some proxies send those).
    private static func integer(_ value: RESPValue) -> Int64? {
        if let number = value.integerValue { return number }
        return value.string.flatMap { Int64($0) }
    }
}
