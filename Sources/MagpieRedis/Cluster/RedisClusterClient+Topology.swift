import NIOCore

// Discovery and refresh of the slot map: which node to ask, how concurrent refreshes are coalesced, and how
// a new map replaces the old one (pools kept, made or retired).
extension RedisClusterClient {
    /// The refresh under way, or a new one. Called with `control` locked.
    func startRefresh(_ state: inout RefreshControl) -> Task<Void, any Error> {
        if let running = state.running { return running }
        let task = Task { [self] in
            defer {
                control.withLock { control in
                    control.running = nil
                    control.lastFinished = .now
                }
            }
            let topology = try await discover()
            install(topology)
        }
        state.running = task
        return task
    }

    /// Asks for a refresh in the background after `delay`; requests made meanwhile share it.
    func requestRefresh(after delay: Duration) {
        control.withLock { control in
            guard !control.shutDown, control.scheduled == nil else { return }
            control.scheduled = Task { [weak self] in
                if delay > .zero { try? await Task.sleep(for: delay) }
                guard let self, !Task.isCancelled else { return }
                let task = self.control.withLock { control -> Task<Void, any Error>? in
                    control.scheduled = nil
                    return control.shutDown ? nil : self.startRefresh(&control)
                }
                _ = try? await task?.value
            }
        }
    }

    /// After a connection-level failure: joins the refresh under way, or starts one unless the last one
    /// finished moments ago (a burst of failures on a dead node costs one refresh, not one each).
    func refreshAfterFailure() async {
        let task = control.withLock { control -> Task<Void, any Error>? in
            if control.shutDown { return nil }
            if control.running == nil, let last = control.lastFinished,
               last.duration(to: .now) < Self.failureRefreshSpacing {
                return nil
            }
            return startRefresh(&control)
        }
        _ = try? await task?.value
    }

    // MARK: Discovery

    /// Asks the known masters (those whose breaker is closed first), then the seeds the client does not
    /// know as masters, for the topology; the first that answers with a slot map wins.
    func discover() async throws -> ClusterTopology {
        let known = routing.withLock { $0.nodes }
        let candidates = known.filter { !$0.isBreakerOpen } + known.filter(\.isBreakerOpen)
        var lastError: (any Error)?
        for pool in candidates {
            if Task.isCancelled { break }
            do {
                return try await topology(from: pool.endpoint) { try await pool.send($0) }
            } catch {
                lastError = error
                logger.debug("redis cluster: discovery via a node failed",
                             metadata: ["node": "\(pool.endpoint)", "error": "\(error)"])
            }
        }
        let knownEndpoints = Set(known.map(\.endpoint))
        for seed in configuration.endpoints where !knownEndpoints.contains(seed) {
            if Task.isCancelled { break }
            do {
                let connection = try await RedisConnection.connect(
                    to: seed, configuration: configuration, sslContext: sslContext, eventLoop: group.next(),
                    logger: logger)
                defer { connection.close(reason: "discovery done") }
                let timeout = configuration.commandTimeout
                return try await topology(from: seed) { try await connection.send($0, timeout: timeout) }
            } catch {
                lastError = error
                logger.debug("redis cluster: discovery via a seed failed",
                             metadata: ["node": "\(seed)", "error": "\(error)"])
            }
        }
        throw RedisError(.connectFailed, "no cluster node answered CLUSTER SHARDS / SLOTS; last error: "
                         + (lastError.map { "\($0)" } ?? "none (cancelled)"))
    }

    /// The topology as `node` sees it: `CLUSTER SHARDS`, or `CLUSTER SLOTS` where SHARDS is unknown.
    private func topology(from node: RedisEndpoint,
                          send: (RedisCommand) async throws -> RESPValue) async throws -> ClusterTopology {
        var topology: ClusterTopology
        do {
            let reply = try await send(RedisCommand("CLUSTER", ["SHARDS"], readOnly: true))
            topology = try ClusterTopology(shards: reply, answeringHost: node.host, tls: configuration.tls != nil)
        } catch let error as RedisError where error.code == .server {
            let reply = try await send(RedisCommand("CLUSTER", ["SLOTS"], readOnly: true))
            topology = try ClusterTopology(slots: reply, answeringHost: node.host)
        }
        topology.dropMastersWithoutSlots()
        guard !topology.masters.isEmpty else {
            throw RedisError(.unexpectedReply, "the node serves no slots (not part of a configured cluster)",
                             endpoint: node)
        }
        return topology
    }

    // MARK: Installing

    /// Replaces the slot map: pools of masters already known are kept, new masters get a started pool,
    /// and the pools of nodes that are no longer masters are retired.
    func install(_ topology: ClusterTopology) {
        let (created, removed, changed) = routing.withLock { routing -> ([RedisNodePool], [RedisNodePool], Bool) in
            if routing.shutDown { return ([], [], false) }
            var byEndpoint: [RedisEndpoint: RedisNodePool] = [:]
            for node in routing.nodes { byEndpoint[node.endpoint] = node }
            var nodes: [RedisNodePool] = []
            var created: [RedisNodePool] = []
            nodes.reserveCapacity(topology.masters.count)
            for endpoint in topology.masters {
                if let node = byEndpoint.removeValue(forKey: endpoint) {
                    nodes.append(node)
                } else {
                    // Started under the lock, so that a concurrent shutdown finds it started and stops it.
                    let node = makePool(endpoint)
                    node.start()
                    created.append(node)
                    nodes.append(node)
                }
            }
            let changed = routing.slots != topology.slots || routing.nodes.map(\.endpoint) != topology.masters
            routing.nodes = nodes
            routing.slots = topology.slots
            return (created, Array(byEndpoint.values), changed)
        }
        counters.topologyRefreshes.add(1, ordering: .relaxed)
        if !created.isEmpty {
            logger.debug("redis cluster: new masters", metadata: ["nodes": "\(created.map(\.endpoint))"])
        }
        for node in removed { retire(node) }
        if changed {
            logger.info("redis cluster topology", metadata: [
                "masters": "\(topology.masters.map(\.description).joined(separator: ","))",
                "unassignedSlots": "\(RedisHashSlot.count - topology.assignedSlots)",
            ])
        }
    }

    /// Shuts a pool down once the commands in flight on it have had their time (the command timeout and a
    /// second); the client's shutdown takes it at once.
    private func retire(_ pool: RedisNodePool) {
        let grace = configuration.commandTimeout + .seconds(1)
        logger.info("redis cluster: node left the topology", metadata: ["node": "\(pool.endpoint)"])
        let clientShutDown = control.withLock { control -> Bool in
            guard !control.shutDown else { return true }
            control.retiring[ObjectIdentifier(pool)] = pool
            return false
        }
        Task { [weak self] in
            if clientShutDown {
                await pool.shutdown()
                return
            }
            try? await Task.sleep(for: grace)
            let mine = self?.control.withLock { $0.retiring.removeValue(forKey: ObjectIdentifier(pool)) } != nil
            if mine || self == nil { await pool.shutdown() }
        }
    }
}
