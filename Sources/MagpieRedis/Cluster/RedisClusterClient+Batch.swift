import NIOCore

extension RedisClusterClient {
    /// Sends commands as one pipeline per master (the masters concurrently) and returns each command's
    /// outcome in the order given.
    ///
    /// Commands are grouped by the owner of their slot (keyless ones go to any master). An entry that
    /// comes back `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or `LOADING`, or whose node's pipeline failed at
    /// the connection level, is then sent again on its own as ``send(_:)`` would (the same redirection
    /// bound and retry rules). Server error replies are `.failure` with ``RedisError/Code/server``.
    ///
    /// - Throws: only when nothing could be sent: every node's pipeline failed before sending (no
    ///   connection, breaker open), and so did every retry.
    public func send(batch commands: [RedisCommand]) async throws -> [Result<RESPValue, RedisError>] {
        if commands.isEmpty { return [] }
        let groups = try await groupByOwner(commands)
        if groups.count == 1, let only = groups.first {
            let outcome = await sendPipeline(only.positions, of: commands, to: only.node)
            return try await finish(commands, [(only.node, only.positions, outcome)])
        }
        let outcomes = await withTaskGroup(
            of: (RedisNodePool, [Int], Result<[RESPValue], RedisError>).self,
            returning: [(RedisNodePool, [Int], Result<[RESPValue], RedisError>)].self
        ) { taskGroup in
            for group in groups {
                taskGroup.addTask {
                    (group.node, group.positions, await self.sendPipeline(group.positions, of: commands, to: group.node))
                }
            }
            var outcomes: [(RedisNodePool, [Int], Result<[RESPValue], RedisError>)] = []
            outcomes.reserveCapacity(groups.count)
            for await outcome in taskGroup { outcomes.append(outcome) }
            return outcomes
        }
        return try await finish(commands, outcomes)
    }

    /// The commands' positions grouped by the pool of their slot's owner, in first-seen order.
    private func groupByOwner(_ commands: [RedisCommand]) async throws -> [(node: RedisNodePool, positions: [Int])] {
        if try route(nil) == nil { try await refreshTopology() }
        let groups = try routing.withLock { routing throws(RedisError) -> [(node: RedisNodePool, positions: [Int])] in
            if routing.shutDown { throw RedisError(.shutDown, "the client was shut down") }
            guard !routing.nodes.isEmpty else { throw RedisError(.connectFailed, "no cluster node is known") }
            var groupOfNode = [Int](repeating: -1, count: routing.nodes.count)
            var groups: [(node: RedisNodePool, positions: [Int])] = []
            for (position, command) in commands.enumerated() {
                var index = Int(ClusterTopology.unassigned)
                if let slot = command.slot, !routing.slots.isEmpty { index = Int(routing.slots[Int(slot)]) }
                if index == Int(ClusterTopology.unassigned) {
                    routing.roundRobin &+= 1
                    index = Int(UInt(bitPattern: routing.roundRobin) % UInt(routing.nodes.count))
                }
                if groupOfNode[index] < 0 {
                    groupOfNode[index] = groups.count
                    groups.append((routing.nodes[index], []))
                }
                groups[groupOfNode[index]].positions.append(position)
            }
            return groups
        }
        return groups
    }

    private func sendPipeline(_ positions: [Int], of commands: [RedisCommand],
                              to node: RedisNodePool) async -> Result<[RESPValue], RedisError> {
        do {
            let replies = try await node.send(batch: positions.map { commands[$0] })
            guard replies.count == positions.count else {
                return .failure(RedisError(.unexpectedReply, "\(replies.count) replies to \(positions.count) commands",
                                           endpoint: node.endpoint))
            }
            return .success(replies)
        } catch let error as RedisError {
            return .failure(error)
        } catch {
            return .failure(RedisError(.connectionClosed, "\(error)", endpoint: node.endpoint))
        }
    }

    /// Files each reply at its position; resends (concurrently, one by one) what was redirected or lost.
    private func finish(
        _ commands: [RedisCommand], _ outcomes: [(RedisNodePool, [Int], Result<[RESPValue], RedisError>)]
    ) async throws -> [Result<RESPValue, RedisError>] {
        var results = [Result<RESPValue, RedisError>?](repeating: nil, count: commands.count)
        var again: [(position: Int, node: RedisNodePool, error: RedisError)] = []
        var anySent = false
        var firstFailure: RedisError?
        for (node, positions, outcome) in outcomes {
            switch outcome {
            case .success(let replies):
                anySent = true
                for (position, reply) in zip(positions, replies) {
                    guard let serverError = reply.serverError else {
                        results[position] = .success(reply)
                        continue
                    }
                    let error = RedisError.server(serverError, endpoint: node.endpoint)
                    switch serverError.kind {
                    case .moved, .ask, .tryAgain, .clusterDown, .loading:
                        again.append((position, node, error))
                    default:
                        results[position] = .failure(error)
                    }
                }
            case .failure(let error):
                if error.code != .circuitOpen && error.code != .connectFailed { anySent = true }
                if firstFailure == nil { firstFailure = error }
                for position in positions { again.append((position, node, error)) }
            }
        }
        if !again.isEmpty {
            let retried = await withTaskGroup(
                of: (Int, Result<RESPValue, RedisError>).self, returning: [(Int, Result<RESPValue, RedisError>)].self
            ) { taskGroup in
                for entry in again {
                    taskGroup.addTask {
                        do {
                            return (entry.position, .success(try await self.execute(commands[entry.position],
                                                                                    after: entry.error, on: entry.node)))
                        } catch let error as RedisError {
                            return (entry.position, .failure(error))
                        } catch {
                            return (entry.position, .failure(RedisError(.connectionClosed, "\(error)", endpoint: entry.node.endpoint)))
                        }
                    }
                }
                var retried: [(Int, Result<RESPValue, RedisError>)] = []
                for await outcome in taskGroup { retried.append(outcome) }
                return retried
            }
            for (position, result) in retried {
                switch result {
                case .success: anySent = true
                case .failure(let error): if error.code == .server || error.code == .tooManyRedirections { anySent = true }
                }
                results[position] = result
            }
        }
        if !anySent, let firstFailure { throw firstFailure }
        return results.map { $0 ?? .failure(RedisError(.unexpectedReply, "no outcome")) }
    }
}
