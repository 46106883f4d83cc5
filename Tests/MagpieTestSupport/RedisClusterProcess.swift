import Foundation
import Glibc
import Magpie

// MARK: - A cluster

/// A Redis cluster of masters without replicas, each a ``RedisServerProcess`` with
/// ``RedisServerProcess/Options/cluster``, the 16384 slots split evenly in ranges.
///
/// Made as redis-cli's `--cluster create` makes one (`CLUSTER ADDSLOTSRANGE`, `SET-CONFIG-EPOCH`, `MEET`),
/// without its one-second waits, and for any number of masters. A cluster master turns `ok` no sooner
/// than two seconds after it started (Redis's `CLUSTER_WRITABLE_DELAY`): that is most of the start's time.
package final class RedisClusterProcess: Sendable {
    /// The masters, in slot order: the first owns the first range.
    package let nodes: [RedisServerProcess]
    /// A directory for the logs of reshards.
    let directory: String
    let reshards = Locked(0)

    private init(nodes: [RedisServerProcess], directory: String) {
        self.nodes = nodes
        self.directory = directory
    }

    deinit { stop() }

    /// Every node's ``RedisServerProcess/url``.
    package var seedURLs: [String] { nodes.map(\.url) }

    /// Starts `masters` cluster nodes with `options` (its ``RedisServerProcess/Options/port`` is ignored;
    /// ``RedisServerProcess/Options/cluster`` is implied), joins them, assigns the slots, and waits until
    /// the cluster is stable (see ``waitUntilStable(timeout:)``), up to `timeout`.
    ///
    /// - Throws: ``RedisHarnessError`` (every node already started is stopped).
    package static func start(
        masters: Int = 3, options: RedisServerProcess.Options = .init(), timeout: Duration = .seconds(20)
    ) throws -> RedisClusterProcess {
        guard (1...16384).contains(masters) else {
            throw RedisHarnessError(.invalidUse, "a cluster of \(masters) masters")
        }
        var nodeOptions = options
        nodeOptions.cluster = true
        nodeOptions.port = nil
        let directory = try makeTemporaryDirectory("cluster")
        registry.withLock { $0[directory] = 0 }
        let nodes: [RedisServerProcess]
        do { nodes = try RedisServerProcess.startAll(count: masters, nodeOptions) } catch {
            try? FileManager.default.removeItem(atPath: directory)
            registry.withLock { $0[directory] = nil }
            throw error
        }
        let cluster = RedisClusterProcess(nodes: nodes, directory: directory)
        do {
            for (index, node) in nodes.enumerated() {
                let first = index * 16384 / masters
                let last = (index + 1) * 16384 / masters - 1
                _ = try node.cli(["CLUSTER", "ADDSLOTSRANGE", String(first), String(last)])
                _ = try node.cli(["CLUSTER", "SET-CONFIG-EPOCH", String(index + 1)])
            }
            for node in nodes.dropFirst() {
                _ = try nodes[0].cli([
                    "CLUSTER", "MEET", node.host, String(node.port), String(node.clusterBusPort ?? 0),
                ])
            }
            try cluster.waitUntilStable(timeout: timeout)
        } catch {
            cluster.stop()
            throw error
        }
        return cluster
    }

    /// Stops every node and removes the directories. Calling it again does nothing.
    package func stop() {
        for node in nodes { node.stop() }
        try? FileManager.default.removeItem(atPath: directory)
        registry.withLock { $0[directory] = nil }
    }

    /// The node's id (`CLUSTER MYID`).
    package func nodeID(of node: RedisServerProcess) throws -> String {
        try node.cli(["CLUSTER", "MYID"])
    }

    /// The node that owns `slot` by its own account (during a migration: the source), or nil if no
    /// running node claims it.
    package func slotOwner(_ slot: Int) throws -> RedisServerProcess? {
        for node in nodes where node.isRunning {
            if try ownedSlots(of: node).contains(where: { $0.contains(slot) }) { return node }
        }
        return nil
    }

    /// The slot ranges the node owns by its own account.
    package func ownedSlots(of node: RedisServerProcess) throws -> [ClosedRange<Int>] {
        let view = ClusterView(try node.cli(["CLUSTER", "NODES"]))
        return view.entries.first(where: \.isMyself)?.slots ?? []
    }

    /// Waits until every node reports `cluster_state:ok` and knows every other one, no slot is being
    /// migrated, no node is flagged failing or in handshake, and all nodes agree on who owns which slot.
    ///
    /// - Throws: ``RedisHarnessError`` with `clusterNotReady` (and the last disagreement) after `timeout`.
    package func waitUntilStable(timeout: Duration = .seconds(20)) throws {
        let deadline = ContinuousClock.now + timeout
        var problem = ""
        while ContinuousClock.now < deadline {
            do {
                guard let found = try instability() else { return }
                problem = found
            } catch {
                problem = "\(error)"
            }
            usleep(20_000)
        }
        throw RedisHarnessError(.clusterNotReady, "the cluster is not stable after \(timeout): \(problem)")
    }

    /// Why the cluster is not stable yet, or nil if it is.
    private func instability() throws -> String? {
        var agreed: [String]?
        for node in nodes {
            let info = try node.cli(["CLUSTER", "INFO"])
            guard info.contains("cluster_state:ok") else { return "\(node.endpointDescription) is not ok" }
            guard
                info.contains("cluster_known_nodes:\(nodes.count)\r")
                    || info.contains("cluster_known_nodes:\(nodes.count)\n")
            else { return "\(node.endpointDescription) does not know all \(nodes.count) nodes" }
            let view = ClusterView(try node.cli(["CLUSTER", "NODES"]))
            if let problem = view.problem { return "\(node.endpointDescription) sees \(problem)" }
            let map = view.slotMap
            if let agreed, agreed != map {
                return
                    "\(node.endpointDescription) sees the slots as \(map), \(nodes[0].endpointDescription) as \(agreed)"
            }
            agreed = map
        }
        return nil
    }
}

/// One node's `CLUSTER NODES`, parsed.
private struct ClusterView {
    struct Entry {
        var id: String
        var port: Int
        var flags: Set<Substring>
        var linkState: Substring
        var slots: [ClosedRange<Int>]
        var openSlots: [Substring]  // "[slot->-id]", "[slot-<-id]"

        var isMyself: Bool { flags.contains("myself") }
    }

    var entries: [Entry] = []

    /// Parses lines `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`.
    init(_ text: String) {
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 8 else { continue }
            let address = fields[1].split(separator: "@")[0]
            let port = address.split(separator: ":").last.flatMap { Int($0) } ?? 0
            var slots: [ClosedRange<Int>] = []
            var open: [Substring] = []
            for field in fields.dropFirst(8) {
                if field.hasPrefix("[") {
                    open.append(field)
                } else if let dash = field.firstIndex(of: "-"), let low = Int(field[..<dash]),
                    let high = Int(field[field.index(after: dash)...])
                {
                    slots.append(low...high)
                } else if let slot = Int(field) {
                    slots.append(slot...slot)
                }
            }
            entries.append(
                Entry(
                    id: String(fields[0]), port: port, flags: Set(fields[2].split(separator: ",")),
                    linkState: fields[7], slots: slots, openSlots: open))
        }
    }

    /// What keeps this view from being stable, if anything.
    var problem: String? {
        for entry in entries {
            if let bad = entry.flags.first(where: {
                ["fail", "fail?", "handshake", "noaddr", "nofailover"].contains($0)
            }) {
                return "node \(entry.port) flagged \(bad)"
            }
            if !entry.isMyself && entry.linkState != "connected" { return "node \(entry.port) \(entry.linkState)" }
            if !entry.openSlots.isEmpty { return "open slots \(entry.openSlots) on \(entry.port)" }
        }
        return nil
    }

    /// "port: ranges" for every master, sorted: equal across nodes that agree.
    var slotMap: [String] {
        entries.map { entry in
            "\(entry.id)@\(entry.port): "
                + entry.slots.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ",")
        }.sorted()
    }
}

// MARK: - Key slots

/// The cluster slot of `key` (CRC16-XMODEM of the key, or of its hash tag `{...}`, modulo 16384), computed
/// here independently of the client.
package func redisKeySlot(_ key: String) -> Int {
    var bytes = Array(key.utf8)
    if let open = bytes.firstIndex(of: UInt8(ascii: "{")),
        let close = bytes[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1
    {
        bytes = Array(bytes[(open + 1)..<close])
    }
    var crc: UInt16 = 0
    for byte in bytes {
        crc ^= UInt16(byte) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
    }
    return Int(crc % 16384)
}

/// A hash tag whose keys (`"{TAG}anything"`) all fall in `slot`.
package func redisHashTag(forSlot slot: Int) -> String {
    var candidate = 0
    while redisKeySlot("{t\(candidate)}") != slot { candidate += 1 }
    return "t\(candidate)"
}
