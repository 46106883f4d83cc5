import Magpie
import Logging
import NIOCore
import Synchronization

/// The connections to one node: multiplexed, grown on demand, health-checked, reconnected with backoff,
/// behind a circuit breaker.
///
/// State machine of the breaker (``RedisConfiguration/Breaker``): *closed* → (failureThreshold
/// consecutive failures: connects that failed, connections lost to an error or a command timeout) →
/// *open*: every call throws ``RedisError/Code/circuitOpen`` after one atomic load, and a background
/// reconnect runs on the backoff schedule (the half-open probe) → the first connection whose handshake
/// succeeds closes the breaker. A successful connect resets the failure count.
final class RedisNodePool: Sendable {
    let endpoint: RedisEndpoint
    let configuration: RedisConfiguration
    private let sslContext: TLSContext?
    private let group: any EventLoopGroup
    private let logger: Logger
    let metrics: RedisNodeMetrics
    let counters: RedisCounters
    /// Read before anything else by every call: the breaker's fast path.
    private let breakerIsOpen = Atomic<Bool>(false)
    /// Whether `consecutiveFailures` is above zero: a successful command then resets it (one relaxed load
    /// on the success path otherwise), so only failures with no success between them open the breaker.
    private let failuresPending = Atomic<Bool>(false)
    private let circuitOpenError: RedisError
    /// While the node answers `LOADING` (it is reading its data set back, after a restart): the uptime
    /// instant (ns; 0: not loading) until which every call fails at once with the server's own `LOADING`
    /// error, without touching the network (``RedisConfiguration/Breaker/loadingHold``). A server that
    /// is loading interleaves its clients' commands with the load, so a fleet that keeps sending while
    /// it fails slows the very load it waits for. The first call after the instant goes to the server
    /// (the probe) and its `LOADING` reply holds calls again; nothing else clears it early.
    let loadingUntil = Atomic<UInt64>(0)
    let loadingError: RedisError
    let state = RedisLock(State())
    /// Called on the event loop for every push frame of a pooled connection (nil: pushes are dropped).
    private let onPush: (@Sendable (RESPValue) -> Void)?

    struct Slot {
        let id: Int
        let connection: RedisConnection
        var lastSent: UInt64 = 0
        var idleFor: Duration = .zero
        /// A caller took it since the last health check (it may not have sent yet): not idle.
        var picked = false
    }

    struct Waiter {
        let continuation: CheckedContinuation<RedisConnection, any Error>
        let reserving: Bool
    }

    struct State {
        var connections: [Slot] = []
        var connecting = 0
        /// Of `connecting`: reconnects waiting out their backoff (not attempting yet).
        var backingOff = 0
        var waiters: [Waiter] = []
        var consecutiveFailures = 0
        var breakerOpen = false
        var reconnectAttempt = 0
        /// Connections lost to an error and not yet replaced (a connect that replaces one is a reconnect).
        var lost = 0
        var nextID = 0
        var shutDown = false
        var lastError: RedisError?
        var healthCheck: RepeatedTask?
    }

    init(endpoint: RedisEndpoint, configuration: RedisConfiguration, sslContext: TLSContext?,
         group: any EventLoopGroup, logger: Logger, counters: RedisCounters,
         onPush: (@Sendable (RESPValue) -> Void)? = nil) {
        self.endpoint = endpoint
        self.configuration = configuration
        self.sslContext = sslContext
        self.group = group
        var logger = logger
        logger[metadataKey: "redis.node"] = "\(endpoint)"
        self.logger = logger
        self.metrics = RedisNodeMetrics(endpoint: endpoint)
        self.counters = counters
        self.onPush = onPush
        self.circuitOpenError = RedisError(.circuitOpen, "the node's circuit breaker is open", endpoint: endpoint)
        self.loadingError = RedisError.server(
            RedisServerError("LOADING Redis is loading the dataset in memory (held by the client after the server said so)"),
            endpoint: endpoint)
    }

    /// Opens the minimum connections (in the background) and starts the health check.
    func start() {
        let interval = configuration.pool.healthCheckInterval
        let task = group.next().scheduleRepeatedTask(initialDelay: TimeAmount(interval), delay: TimeAmount(interval)) {
            [weak self] _ in self?.checkHealth(interval: interval)
        }
        let toOpen = state.withLock { state -> Int in
            state.healthCheck = task
            let count = max(0, configuration.pool.minimumConnections - state.connections.count - state.connecting)
            state.connecting += count
            return count
        }
        for _ in 0..<toOpen { startConnect(after: nil) }
    }

    /// Whether the breaker is open now.
    var isBreakerOpen: Bool { breakerIsOpen.load(ordering: .relaxed) }

    /// Live connections now.
    var connectionCount: Int { state.withLock { $0.connections.count } }

    /// The major version of the server behind the newest live connection, as its `HELLO` told it (nil
    /// before the first connection, or for a version that does not start with a number).
    var serverMajorVersion: Int? {
        state.withLock { $0.connections.last?.connection.serverVersion }.flatMap(Self.majorVersion)
    }

    /// The major version in a server's version string (`"7.0.15"`: 7); nil when it does not start with one.
    static func majorVersion(_ version: String) -> Int? {
        Int(version.prefix { $0 != "." })
    }

    // MARK: Calls

    /// Sends one command. A command that was never written because its connection had just been retired
    /// idle is sent again on another connection (at most twice more).
    nonisolated(nonsending)
    func send(_ command: RedisCommand) async throws -> RESPValue {
        var resends = 0
        while true {
            let connection = try await connection(reserving: true)
            let start = NIODeadline.now()
            let stages = configuration.recordsStages ? CommandStages() : nil
            do {
                let value = try await connection.send(command, timeout: configuration.commandTimeout, reserved: true, stages: stages)
                finished(start: start, count: 1, stages: stages)
                return value
            } catch let error as RedisError where error.notSent && resends < 2 {
                resends += 1
            } catch let error as RedisError {
                failed(error, start: start, count: 1)
                if error.serverError?.kind == .loading { noteLoading() }
                throw error
            }
        }
    }

    /// Sends the commands on one connection, pipelined; each outcome in order. (Resent like ``send(_:)``.)
    nonisolated(nonsending)
    func send(batch commands: [RedisCommand]) async throws -> [RESPValue] {
        guard !commands.isEmpty else { return [] }
        var resends = 0
        while true {
            let connection = try await connection(reserving: true)
            let start = NIODeadline.now()
            let stages = configuration.recordsStages ? CommandStages() : nil
            do {
                let values = try await connection.sendRaw(
                    batch: commands.map(\.encoded), timeout: configuration.commandTimeout, reserved: true, stages: stages)
                finished(start: start, count: commands.count, stages: stages)
                if values.contains(where: Self.isLoadingReply) { noteLoading() }
                return values
            } catch let error as RedisError where error.notSent && resends < 2 {
                resends += 1
            } catch let error as RedisError {
                failed(error, start: start, count: commands.count)
                throw error
            }
        }
    }

    private func finished(start: NIODeadline, count: Int, stages: CommandStages?) {
        if failuresPending.load(ordering: .relaxed) {
            state.withLock { state in
                if !state.breakerOpen { state.consecutiveFailures = 0 }
            }
            failuresPending.store(false, ordering: .relaxed)
        }
        let now = NIODeadline.now()
        metrics.duration.recordNanoseconds((now - start).nanoseconds)
        if let stages { metrics.record(stages, start: start, now: now) }
        metrics.commands.increment(by: count)
        counters.commands.add(UInt64(count), ordering: .relaxed)
    }

    private func failed(_ error: RedisError, start: NIODeadline, count: Int) {
        metrics.commands.increment(by: count)
        counters.commands.add(UInt64(count), ordering: .relaxed)
        metrics.record(error: error)
        if error.code == .timedOut { counters.timeouts.add(1, ordering: .relaxed) }
    }

    /// A connection to send on: the one with the fewest replies outstanding; a new one opens in the
    /// background when all are busy and the pool may grow; with none open, waits for one (at most the
    /// connect timeout).
    ///
    /// - Parameter reserving: count one command in flight on it at once, under the pool's lock (the
    ///   caller then sends with `reserved: true`): the health check can then never retire the connection
    ///   between this pick and the send, however long the caller takes to get there.
    nonisolated(nonsending)
    func connection(reserving: Bool = false) async throws -> RedisConnection {
        if breakerIsOpen.load(ordering: .relaxed) { throw rejected() }
        try rejectWhileLoading()
        enum Decision {
            case use(RedisConnection, grow: Bool)
            case wait(start: Bool)
            case fail(RedisError)
        }
        let maximum = configuration.pool.maximumConnections
        let decision = state.withLock { state -> Decision in
            if state.shutDown { return .fail(RedisError(.shutDown, "the client was shut down", endpoint: endpoint)) }
            if state.breakerOpen { return .fail(circuitOpenError) }
            var best: Int?
            var bestLoad = Int.max
            for index in state.connections.indices {
                let load = state.connections[index].connection.inFlight
                if load < bestLoad {
                    best = index
                    bestLoad = load
                    if load == 0 { break }
                }
            }
            if let index = best {
                state.connections[index].picked = true
                let best = state.connections[index].connection
                if reserving { best.counters.inFlight.add(1, ordering: .relaxed) }
                let grow = bestLoad > 0 && state.connections.count + state.connecting < maximum
                if grow { state.connecting += 1 }
                return .use(best, grow: grow)
            }
            if state.connecting == 0 {
                state.connecting += 1
                return .wait(start: true)
            }
            if state.connecting == state.backingOff {
                // Only a reconnect waiting out its backoff: fail now with the last failure rather than
                // wait for as long as the backoff (the caller must not pay for the pool's schedule).
                return .fail(state.lastError ?? RedisError(.connectFailed, "no connection", endpoint: endpoint))
            }
            return .wait(start: false)
        }
        switch decision {
        case .use(let connection, let grow):
            if grow { startConnect(after: nil) }
            return connection
        case .fail(let error):
            if error.code == .circuitOpen { throw rejected() }
            throw error
        case .wait(let start):
            if start { startConnect(after: nil) }
            // A waiter is resumed by the connecting task, on another thread, with a connection that task
            // made: the hand-off is annotated for TSan as the handler's replies are (ThreadSanitizerHandOff).
            defer { ThreadSanitizerHandOff.received() }
            return try await withCheckedThrowingContinuation { continuation in
                let ready = state.withLock { state -> Result<RedisConnection, RedisError>? in
                    if !state.connections.isEmpty {
                        state.connections[0].picked = true
                        let connection = state.connections[0].connection
                        if reserving { connection.counters.inFlight.add(1, ordering: .relaxed) }
                        return .success(connection)
                    }
                    if state.shutDown { return .failure(RedisError(.shutDown, "the client was shut down", endpoint: endpoint)) }
                    if state.connecting == state.backingOff {
                        return .failure(state.lastError ?? RedisError(.connectFailed, "could not connect", endpoint: endpoint))
                    }
                    state.waiters.append(Waiter(continuation: continuation, reserving: reserving))
                    return nil
                }
                if let ready { continuation.resume(with: ready) }
            }
        }
    }

    private func rejected() -> RedisError {
        counters.breakerRejections.add(1, ordering: .relaxed)
        metrics.breakerRejections.increment()
        return circuitOpenError
    }

    // MARK: Connecting

    /// Runs one connect attempt (after `delay`); the caller has already counted it in `connecting`.
    private func startConnect(after delay: Duration?) {
        Task { [self] in
            if let delay {
                try? await Task.sleep(for: delay)
                state.withLock { $0.backingOff -= 1 }
            }
            await connectOnce()
        }
    }

    private func connectOnce() async {
        let id = state.withLock { state -> Int? in
            guard !state.shutDown else {
                state.connecting -= 1  // a reconnect whose backoff ended after the shutdown: no dial
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        // Set (under the lock) by the connection's close hook: a connection that died between its
        // handshake and the moment it would join the pool never joins it.
        let attempt = ConnectionAttempt()
        let connection: RedisConnection
        do {
            connection = try await RedisConnection.connect(
                to: endpoint, configuration: configuration, sslContext: sslContext, eventLoop: group.next(),
                logger: logger, onPush: onPush,
                onClose: { [weak self] error in self?.connectionClosed(id: id, error: error, attempt: attempt) })
        } catch {
            connectFailed(error as? RedisError ?? RedisError(.connectFailed, "\(error)", endpoint: endpoint))
            return
        }
        enum Joined {
            case joined(waiters: [Waiter], closedBreaker: Bool, reconnect: Bool)
            case shutDown
            case died
        }
        let joined = state.withLock { state -> Joined in
                if state.shutDown {
                    state.connecting -= 1
                    return .shutDown
                }
                if attempt.died.load(ordering: .relaxed) { return .died }
                state.connecting -= 1
                // Its waiters are about to send on it: not idle at the next health check.
                state.connections.append(Slot(id: id, connection: connection, lastSent: connection.counters.sent.load(ordering: .relaxed),
                                              picked: !state.waiters.isEmpty))
                state.consecutiveFailures = 0
                state.reconnectAttempt = 0
                let closedBreaker = state.breakerOpen
                state.breakerOpen = false
                breakerIsOpen.store(false, ordering: .relaxed)
                let reconnect = state.lost > 0
                if reconnect { state.lost -= 1 }
                let waiters = state.waiters
                state.waiters = []
                let reservations = waiters.count { $0.reserving }
                if reservations > 0 { connection.counters.inFlight.add(reservations, ordering: .relaxed) }
                return .joined(waiters: waiters, closedBreaker: closedBreaker, reconnect: reconnect)
        }
        switch joined {
        case .shutDown:
            connection.close(reason: "the client was shut down")
        case .died:
            connectFailed(RedisError(.connectionClosed, "the connection closed during setup", endpoint: endpoint))
        case .joined(let waiters, let closedBreaker, let reconnect):
            metrics.connections.record(connectionCount)
            if reconnect {
                counters.reconnects.add(1, ordering: .relaxed)
                metrics.reconnects.increment()
            }
            if closedBreaker {
                metrics.breakerOpen.record(0)
                logger.notice("redis circuit breaker closed: the node answers again")
            }
            ThreadSanitizerHandOff.published()
            for waiter in waiters { waiter.continuation.resume(returning: connection) }
        }
    }

    /// A connect attempt (counted in `connecting`) failed: count it, fail the waiters, maybe reconnect.
    private func connectFailed(_ failure: RedisError) {
        counters.connectFailures.add(1, ordering: .relaxed)
        let outcome = state.withLock { state -> (waiters: [Waiter], opened: Bool, retry: Duration?) in
            state.connecting -= 1
            state.lastError = failure
            let opened = noteFailure(&state)
            let waiters = state.waiters
            state.waiters = []
            return (waiters, opened, scheduleReconnect(&state))
        }
        if outcome.opened { breakerOpened(after: failure) }
        logger.debug("redis connect failed", metadata: ["error": "\(failure)"])
        ThreadSanitizerHandOff.published()
        for waiter in outcome.waiters { waiter.continuation.resume(throwing: failure) }
        if let delay = outcome.retry { startConnect(after: delay) }
    }

    private func connectionClosed(id: Int, error: RedisError?, attempt: ConnectionAttempt) {
        let outcome = state.withLock { state -> (opened: Bool, retry: Duration?)? in
            attempt.died.store(true, ordering: .relaxed)
            guard let index = state.connections.firstIndex(where: { $0.id == id }) else { return nil }
            state.connections.remove(at: index)
            var opened = false
            if let error {
                state.lastError = error
                state.lost += 1
                opened = noteFailure(&state)
            }
            return (opened, scheduleReconnect(&state))
        }
        guard let outcome else { return }
        metrics.connections.record(connectionCount)
        if let error {
            logger.info("redis connection lost", metadata: ["error": "\(error)"])
            if outcome.opened { breakerOpened(after: error) }
        }
        if let delay = outcome.retry { startConnect(after: delay) }
    }

    /// Counts a failure; opens the breaker at the threshold. Returns whether it opened now.
    private func noteFailure(_ state: inout State) -> Bool {
        state.consecutiveFailures += 1
        failuresPending.store(true, ordering: .relaxed)
        guard !state.breakerOpen, !state.shutDown,
              state.consecutiveFailures >= configuration.breaker.failureThreshold else { return false }
        state.breakerOpen = true
        breakerIsOpen.store(true, ordering: .relaxed)
        return true
    }

    /// Schedules a reconnect when the pool is below its minimum, or the breaker is open (the probe), and
    /// none is under way. Returns its delay.
    private func scheduleReconnect(_ state: inout State) -> Duration? {
        guard !state.shutDown, state.connecting == 0,
              state.breakerOpen || state.connections.count < configuration.pool.minimumConnections
        else { return nil }
        state.connecting += 1
        state.backingOff += 1
        let attempt = state.reconnectAttempt
        state.reconnectAttempt += 1
        return configuration.reconnect.delay(attempt: attempt, random: Double.random(in: 0..<1))
    }

    private func breakerOpened(after error: RedisError) {
        counters.breakerOpenings.add(1, ordering: .relaxed)
        metrics.breakerOpen.record(1)
        logger.warning("redis circuit breaker open: calls fail fast until a connection works again",
                       metadata: ["error": "\(error)"])
    }
}
