import Logging
import NIOCore
import NIOPosix
import Synchronization

/// A client of a Redis Cluster (or Valkey cluster): routes each command to the master that owns its key's
/// hash slot, follows `MOVED` and `ASK` redirections, and keeps the slot map current.
///
/// ```swift
/// let cluster = try RedisClusterClient(RedisConfiguration(url: "redis://10.0.0.1:7000,10.0.0.2:7000"))
/// try await cluster.set("user:{42}:name", Array("Ada".utf8))
/// let name = try await cluster.get("user:{42}:name")
/// await cluster.shutdown()
/// ```
///
/// ### Implementation Notes
///
/// **Discovery.** The slot map comes from `CLUSTER SHARDS` (falling back to `CLUSTER SLOTS` on servers
/// before Redis 7), asked of the known masters and then of the seeds (``RedisConfiguration/endpoints``)
/// until one answers. Only masters are used. Discovery starts when the client is made; the first commands
/// wait for it. It runs again every ``RedisConfiguration/Cluster/topologyRefreshInterval``, shortly after a
/// `MOVED` (debounced: one refresh serves a burst of them), at once when a `MOVED` names a node the client
/// does not know, and after a connection-level failure. Concurrent refreshes are coalesced into one.
///
/// **Routing.** The map is 16384 `UInt16` node indices plus the node list, kept together under one lock;
/// routing a command costs that lock and one array read. A command without a key goes to any master,
/// round robin. Each master has its own connection pool (connections, breaker); a pool whose node left
/// the topology is shut down after the command timeout, so that commands in flight on it complete.
///
/// **Redirections.** `MOVED` updates the slot's entry at once and resends to the new owner. `ASK` sends
/// `ASKING` and the command back to back on one connection of the named node, without touching the map.
/// `TRYAGAIN`, `CLUSTERDOWN` and `LOADING` wait ``RedisConfiguration/Cluster/retryDelay`` (times the
/// attempt) and resend. A command follows at most ``RedisConfiguration/Cluster/maximumRedirections`` of
/// these, then fails with ``RedisError/Code/tooManyRedirections``. A connection-level failure
/// (``RedisError/Code/connectFailed``, ``RedisError/Code/circuitOpen``, ``RedisError/Code/connectionClosed``)
/// refreshes the topology, then retries once on the slot's owner when that is safe: always for a read-only
/// command; for a write only when it cannot have been sent (the connect failed or the breaker was open)
/// and the slot now belongs to another node.
public final class RedisClusterClient: RedisCommandSender {
    /// The configuration the client was made with; its ``RedisConfiguration/endpoints`` are the seeds.
    public let configuration: RedisConfiguration
    let group: any EventLoopGroup
    let sslContext: TLSContext?
    let logger: Logger
    let counters = RedisCounters()
    /// The slot map and the pools: read by every command.
    let routing = RedisLock(Routing())
    /// Refresh coordination: off the hot path.
    let control = RedisLock(RefreshControl())

    /// The routing state, swapped as a whole by a refresh and patched in place by a `MOVED`.
    struct Routing {
        /// 16384 indices into ``nodes`` (``ClusterTopology/unassigned`` for a slot without an owner); empty
        /// before the first discovery.
        var slots: [UInt16] = []
        /// The pools of the known masters.
        var nodes: [RedisNodePool] = []
        /// The next node for a command without a key.
        var roundRobin = 0
        var shutDown = false
    }

    struct RefreshControl {
        /// The refresh under way; callers that need one join it.
        var running: Task<Void, any Error>?
        /// When the last refresh finished (successfully or not).
        var lastFinished: ContinuousClock.Instant?
        /// A debounced refresh is waiting to start.
        var scheduled: Task<Void, Never>?
        var periodic: Task<Void, Never>?
        /// Pools of nodes that left the topology, shut down after a grace period.
        var retiring: [ObjectIdentifier: RedisNodePool] = [:]
        var shutDown = false
    }

    /// How long a `MOVED` waits before the refresh it asks for (more `MOVED`s meanwhile share it).
    static let movedRefreshDelay: Duration = .milliseconds(100)
    /// A connection-level failure does not start a new refresh within this time of the last one.
    static let failureRefreshSpacing: Duration = .milliseconds(200)

    /// A client of the cluster that `configuration.endpoints` (the seeds) belong to.
    ///
    /// Discovery starts in the background; the first commands wait for it (at most the connect timeout
    /// and a command timeout per seed tried).
    ///
    /// - Parameters:
    ///   - configuration: the seeds, deadlines, pool, breaker and ``RedisConfiguration/Cluster`` settings.
    ///     ``RedisConfiguration/database`` must be 0 (a cluster has one database).
    ///   - eventLoopGroup: where connections run.
    ///   - logger: receives topology changes and connection events.
    /// - Throws: ``RedisError/Code/invalidConfiguration`` when the configuration or its TLS settings are
    ///   invalid.
    public init(_ configuration: RedisConfiguration,
                eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "magpie.redis.cluster")) throws {
        try configuration.validate()
        guard configuration.database == 0 else {
            throw RedisError(.invalidConfiguration, "a cluster has only database 0")
        }
        guard configuration.cluster.maximumRedirections >= 0, configuration.cluster.retryDelay >= .zero,
              configuration.cluster.topologyRefreshInterval > .zero
        else {
            throw RedisError(.invalidConfiguration,
                             "cluster: need maximumRedirections ≥ 0, retryDelay ≥ 0, topologyRefreshInterval > 0")
        }
        self.configuration = configuration
        self.group = eventLoopGroup
        self.logger = logger
        self.sslContext = try configuration.makeSSLContext()
        let interval = configuration.cluster.topologyRefreshInterval
        control.withLock { control in
            _ = startRefresh(&control)
            control.periodic = Task { [weak self] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: interval)
                    guard let self, !Task.isCancelled else { return }
                    try? await self.refreshTopology()
                }
            }
        }
    }

    // MARK: Public API

    /// Sends a command to the master that owns its key's slot (any master for a command without a key),
    /// following redirections; returns its reply.
    ///
    /// - Throws: ``RedisError`` — ``RedisError/Code/server`` for an error reply,
    ///   ``RedisError/Code/tooManyRedirections`` past ``RedisConfiguration/Cluster/maximumRedirections``,
    ///   and the node's connection errors (see ``RedisClient``).
    public func send(_ command: RedisCommand) async throws -> RESPValue {
        let node = try await owner(of: command)
        do {
            return try await node.send(command)
        } catch let error as RedisError {
            return try await execute(command, after: error, on: node)
        }
    }

    /// Counts since the client was made, all nodes together (redirections and refreshes included).
    public var statistics: RedisClientStatistics { counters.snapshot }

    /// The masters the client knows now (empty before the first discovery).
    public var masters: [RedisEndpoint] { routing.withLock { $0.nodes.map(\.endpoint) } }

    /// Whether the circuit breaker of the master at `endpoint` is open (false for an unknown node).
    public func isBreakerOpen(for endpoint: RedisEndpoint) -> Bool {
        routing.withLock { $0.nodes.first { $0.endpoint == endpoint } }?.isBreakerOpen ?? false
    }

    /// Discovers the topology now (joining a discovery already under way) and installs it.
    ///
    /// - Throws: ``RedisError/Code/connectFailed`` when no known node or seed answered;
    ///   ``RedisError/Code/shutDown`` after ``shutdown()``.
    public func refreshTopology() async throws {
        let task = try control.withLock { control -> Task<Void, any Error> in
            if control.shutDown { throw RedisError(.shutDown, "the client was shut down") }
            return startRefresh(&control)
        }
        try await task.value
    }

    /// A dedicated connection for pub/sub and tracking to one node (see ``RedisSubscriber``).
    public func makeSubscriber(for endpoint: RedisEndpoint) -> RedisSubscriber {
        RedisSubscriber(endpoint: endpoint, configuration: configuration, sslContext: sslContext, group: group,
                        logger: logger)
    }

    /// A subscriber for `SSUBSCRIBE`: connected to the master that owns the shard channel's slot now (the
    /// first seed before the first discovery). When the slot moves, the server ends the subscription and
    /// the stream reports it lost; make a new subscriber then.
    public func makeSubscriber(forShardChannel channel: String) -> RedisSubscriber {
        let slot = Int(RedisHashSlot.slot(of: channel.utf8))
        let owner = routing.withLock { routing -> RedisEndpoint? in
            guard !routing.slots.isEmpty, routing.slots[slot] != ClusterTopology.unassigned else { return nil }
            return routing.nodes[Int(routing.slots[slot])].endpoint
        }
        return makeSubscriber(for: owner ?? configuration.endpoints[0])
    }

    /// Stops the refreshes and closes every connection; calls in flight fail with
    /// ``RedisError/Code/shutDown``, and so does every later call.
    public func shutdown() async {
        let tasks = control.withLock { control -> [Task<Void, Never>] in
            control.shutDown = true
            let tasks = [control.periodic, control.scheduled].compactMap { $0 }
            control.periodic = nil
            control.scheduled = nil
            control.running?.cancel()
            return tasks
        }
        for task in tasks { task.cancel() }
        let nodes = routing.withLock { routing -> [RedisNodePool] in
            routing.shutDown = true
            let nodes = routing.nodes
            routing.nodes = []
            return nodes
        }
        let retiring = control.withLock { control -> [RedisNodePool] in
            let pools = Array(control.retiring.values)
            control.retiring = [:]
            return pools
        }
        for pool in nodes + retiring { await pool.shutdown() }
    }

    // MARK: Routing

    /// The pool of the node that owns the command's slot (round robin without a slot); waits for the first
    /// discovery when there is no map yet.
    func owner(of command: RedisCommand) async throws -> RedisNodePool {
        if let node = try route(command.slot) { return node }
        try await refreshTopology()
        if let node = try route(command.slot) { return node }
        throw RedisError(.connectFailed, "no cluster node is known")
    }

    /// The major version of the node that owns `slot`, from its newest connection's `HELLO` (nil: no
    /// map or no connection yet).
    func serverMajorVersion(owning slot: UInt16) -> Int? {
        (try? route(slot))?.serverMajorVersion
    }

    /// The hot path: one lock, one array read.
    func route(_ slot: UInt16?) throws(RedisError) -> RedisNodePool? {
        try routing.withLock { routing throws(RedisError) -> RedisNodePool? in
            if routing.shutDown { throw RedisError(.shutDown, "the client was shut down") }
            if let slot, !routing.slots.isEmpty {
                let index = routing.slots[Int(slot)]
                if index != ClusterTopology.unassigned { return routing.nodes[Int(index)] }
            }
            guard !routing.nodes.isEmpty else { return nil }
            routing.roundRobin &+= 1
            return routing.nodes[Int(UInt(bitPattern: routing.roundRobin) % UInt(routing.nodes.count))]
        }
    }

    /// The pool of the node at `endpoint`, made (and started) when the node is new; with `slot`, records
    /// that the node owns it (a `MOVED`).
    func node(at endpoint: RedisEndpoint, owning slot: UInt16?) throws(RedisError) -> RedisNodePool {
        let (node, created) = try routing.withLock { routing throws(RedisError) -> (RedisNodePool, Bool) in
            if routing.shutDown { throw RedisError(.shutDown, "the client was shut down") }
            var created = false
            let index: Int
            if let known = routing.nodes.firstIndex(where: { $0.endpoint == endpoint }) {
                index = known
            } else {
                // A redirection to yet another node: bounded like a topology (one node per slot at most).
                guard routing.nodes.count < RedisHashSlot.count else {
                    throw RedisError(.unexpectedReply, "redirected to more nodes than there are slots", endpoint: endpoint)
                }
                index = routing.nodes.count
                let node = makePool(endpoint)
                node.start()  // under the lock, so that a concurrent shutdown finds it started
                routing.nodes.append(node)
                created = true
            }
            if let slot {
                if routing.slots.isEmpty {
                    routing.slots = Array(repeating: ClusterTopology.unassigned, count: RedisHashSlot.count)
                }
                routing.slots[Int(slot)] = UInt16(index)
            }
            return (routing.nodes[index], created)
        }
        if created {
            logger.info("redis cluster: redirected to a new node", metadata: ["node": "\(endpoint)"])
            requestRefresh(after: .zero)
        }
        return node
    }

    func makePool(_ endpoint: RedisEndpoint) -> RedisNodePool {
        RedisNodePool(endpoint: endpoint, configuration: configuration, sslContext: sslContext, group: group,
                      logger: logger, counters: counters)
    }

    // MARK: Redirections

    /// Handles `error` (the outcome of sending `command` to `node`) and resends as it says, until a reply,
    /// an error that is final, or too many redirections.
    func execute(_ command: RedisCommand, after error: RedisError, on node: RedisNodePool) async throws -> RESPValue {
        var error = error
        var node = node
        var redirections = 0
        var retriedAfterFailure = false
        while true {
            var asking = false
            if let serverError = error.serverError, error.code == .server {
                switch serverError.kind {
                case .moved(let slot, let to):
                    try count(&redirections, error)
                    counters.movedRedirections.add(1, ordering: .relaxed)
                    node = try self.node(at: Self.resolve(to, from: node), owning: slot)
                    requestRefresh(after: Self.movedRefreshDelay)
                case .ask(_, let to):
                    try count(&redirections, error)
                    counters.askRedirections.add(1, ordering: .relaxed)
                    node = try self.node(at: Self.resolve(to, from: node), owning: nil)
                    asking = true
                case .tryAgain, .clusterDown, .loading:
                    try count(&redirections, error)
                    counters.retries.add(1, ordering: .relaxed)
                    try? await Task.sleep(for: configuration.cluster.retryDelay * redirections)
                    node = try await owner(of: command)
                default:
                    throw error
                }
            } else {
                switch error.code {
                case .connectFailed, .circuitOpen, .connectionClosed:
                    let lost = error.code == .connectionClosed
                    guard !retriedAfterFailure, command.isReadOnly || !lost else {
                        // No retry (done already, or a write that may have run): refresh in the background.
                        requestRefresh(after: .zero)
                        throw error
                    }
                    retriedAfterFailure = true
                    await refreshAfterFailure()
                    let owner = try await owner(of: command)
                    // Retry only what cannot run twice (a read, or a write that was never sent), and only
                    // where it may now succeed: on the slot's new owner, or, after a lost connection, on a
                    // new connection to the same node (a read only). A node that refused is not asked again.
                    let moved = owner !== node
                    guard command.isReadOnly ? (moved || lost) : (moved && !lost) else { throw error }
                    node = owner
                case .shutDown where !routing.withLock({ $0.shutDown }):
                    // The node left the topology and its pool is retired: the command was not sent there.
                    try count(&redirections, error)
                    node = try await owner(of: command)
                default:
                    throw error
                }
            }
            do {
                return asking ? try await sendAsking(command, to: node) : try await node.send(command)
            } catch let next as RedisError {
                error = next
            }
        }
    }

    private func count(_ redirections: inout Int, _ error: RedisError) throws(RedisError) {
        redirections += 1
        guard redirections <= configuration.cluster.maximumRedirections else {
            throw RedisError(.tooManyRedirections,
                             "more than \(configuration.cluster.maximumRedirections) redirections; last: \(error.message)",
                             endpoint: error.endpoint, serverError: error.serverError)
        }
    }

    /// `ASKING` then the command, back to back on one connection of `node`; the command's reply.
    private func sendAsking(_ command: RedisCommand, to node: RedisNodePool) async throws -> RESPValue {
        let connection = try await node.connection(reserving: true)
        let replies = try await connection.sendRaw(batch: [RedisCommand.asking.encoded, command.encoded],
                                                   timeout: configuration.commandTimeout, reserved: true)
        counters.commands.add(2, ordering: .relaxed)
        guard replies.count == 2 else {
            throw RedisError(.unexpectedReply, "ASKING pipeline returned \(replies.count) replies", endpoint: node.endpoint)
        }
        if let serverError = replies[1].serverError { throw RedisError.server(serverError, endpoint: node.endpoint) }
        return replies[1]
    }

    /// A redirection's target; an empty host (`MOVED 3999 :6381`) means the host of the node that replied.
    static func resolve(_ endpoint: RedisEndpoint, from node: RedisNodePool) -> RedisEndpoint {
        endpoint.host.isEmpty ? RedisEndpoint(host: node.endpoint.host, port: endpoint.port) : endpoint
    }
}
