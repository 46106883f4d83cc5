import NIOCore

// The pool's health check (idle retirement, PING) and its shutdown.
extension RedisNodePool {
    func checkHealth(interval: Duration) {
        let minimum = configuration.pool.minimumConnections
        let idleTimeout = configuration.pool.idleTimeout
        let (toClose, toPing) = state.withLock { state -> ([RedisConnection], [RedisConnection]) in
            var toClose: [RedisConnection] = []
            var toPing: [RedisConnection] = []
            var open = state.connections.count
            var closing: Set<Int> = []
            for index in state.connections.indices {
                let connection = state.connections[index].connection
                let sent = connection.counters.sent.load(ordering: .relaxed)
                if sent != state.connections[index].lastSent || connection.inFlight > 0 || state.connections[index].picked {
                    state.connections[index].lastSent = sent
                    state.connections[index].idleFor = .zero
                    state.connections[index].picked = false
                    continue
                }
                state.connections[index].idleFor += interval
                if open > minimum, state.connections[index].idleFor >= idleTimeout {
                    toClose.append(connection)
                    closing.insert(state.connections[index].id)
                    open -= 1
                } else {
                    toPing.append(connection)
                }
            }
            // Out of the pool first (no caller picks them from now on), then closed once what a caller
            // picked just before is answered: an idle close never fails a command that was sent.
            state.connections.removeAll { closing.contains($0.id) }
            return (toClose, toPing)
        }
        if !toClose.isEmpty { metrics.connections.record(connectionCount) }
        for connection in toClose { connection.closeWhenIdle() }
        let timeout = configuration.commandTimeout
        for connection in toPing {
            Task {
                // A failed PING closes the connection (deadline) or finds it closed; the pool reconnects.
                _ = try? await connection.send(.ping, timeout: timeout)
                // The PING itself must not count as traffic.
                self.state.withLock { state in
                    if let index = state.connections.firstIndex(where: { $0.connection === connection }) {
                        state.connections[index].lastSent = connection.counters.sent.load(ordering: .relaxed)
                    }
                }
            }
        }
    }

    /// Closes every connection and fails what waits; later calls throw ``RedisError/Code/shutDown``.
    func shutdown() async {
        let (connections, waiters, task) = state.withLock { state in
            state.shutDown = true
            let connections = state.connections.map(\.connection)
            state.connections = []
            let waiters = state.waiters
            state.waiters = []
            let task = state.healthCheck
            state.healthCheck = nil
            return (connections, waiters, task)
        }
        task?.cancel()
        let error = RedisError(.shutDown, "the client was shut down", endpoint: endpoint)
        for waiter in waiters { waiter.continuation.resume(throwing: error) }
        for connection in connections {
            connection.close(reason: "the client was shut down")
            try? await connection.closeFuture.get()
        }
    }
}
