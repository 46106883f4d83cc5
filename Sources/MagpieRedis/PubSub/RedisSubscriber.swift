import Magpie
import Logging
import NIOCore
import Synchronization
/// A dedicated connection for push traffic: pub/sub (`SUBSCRIBE`, `SSUBSCRIBE`, `PSUBSCRIBE`) and
/// `CLIENT TRACKING` invalidations, each delivered as an `AsyncStream`.
///
/// When the connection is lost every stream receives a `lost` event at once; the subscriber reconnects
/// with jittered backoff, re-enables tracking, re-subscribes every channel, and then sends `restored`.
/// Between the two, messages and invalidations were missed: a cache must treat what it holds as
/// unverified. A stream whose consumer falls ``bufferLimit`` events behind also receives `lost` (the
/// overflowing events are dropped) followed by `restored` once it has room.
public final class RedisSubscriber: Sendable {
    /// Events buffered per stream before the stream reports a loss.
    public let bufferLimit: Int

    private let endpoint: RedisEndpoint
    private let configuration: RedisConfiguration
    private let sslContext: TLSContext?
    private let group: any EventLoopGroup
    private let logger: Logger
    private let state = RedisLock(State())
    /// The current connection's id (0 while disconnected), readable without the lock: the tracking
    /// stream's `restored` event carries it and is made while the lock is held.
    private let currentClientID = Atomic<Int64>(0)

    private enum Kind: Sendable, Hashable {
        case channel, pattern, shard

        var subscribe: String {
            switch self {
            case .channel: return "SUBSCRIBE"
            case .pattern: return "PSUBSCRIBE"
            case .shard: return "SSUBSCRIBE"
            }
        }

        var unsubscribe: String {
            switch self {
            case .channel: return "UNSUBSCRIBE"
            case .pattern: return "PUNSUBSCRIBE"
            case .shard: return "SUNSUBSCRIBE"
            }
        }
    }

    private struct Registration {
        let kind: Kind
        let names: [String]
        let stream: BoundedStream<RedisPubSubEvent>
        /// The stream was told `lost` and waits for `restored`.
        var lost = false
    }

    private struct Tracking {
        let options: RedisTrackingOptions
        let stream: BoundedStream<RedisInvalidation>
        var lost = false
    }

    /// Invariants (under `state`'s lock): `connection` is the connection of `attempt`, which has not died;
    /// every subscription command is queued on `connection` while the lock is held, so the server sees
    /// them in the order the registrations changed; a stream is told `restored` only after `lost`.
    private struct State {
        var connection: RedisConnection?
        var attempt: ConnectionAttempt?
        var connecting: Task<RedisConnection, any Error>?
        var registrations: [Int: Registration] = [:]
        var tracking: Tracking?
        var nextID = 0
        var closed = false
        var reconnecting = false
    }

    init(endpoint: RedisEndpoint, configuration: RedisConfiguration, sslContext: TLSContext?,
         group: any EventLoopGroup, logger: Logger, bufferLimit: Int = 65_536) {
        self.endpoint = endpoint
        var configuration = configuration
        configuration.database = 0
        self.configuration = configuration
        self.sslContext = sslContext
        self.group = group
        var logger = logger
        logger[metadataKey: "redis.node"] = "\(endpoint)"
        self.logger = logger
        self.bufferLimit = max(2, bufferLimit)
    }

    /// The server's id of the current connection (the target for `CLIENT TRACKING … REDIRECT`), or nil
    /// while disconnected.
    public var clientID: Int64? { state.withLock { $0.connection?.clientID } }

    /// Whether the subscriber's connection is up.
    public var isConnected: Bool { state.withLock { $0.connection?.isActive ?? false } }

    // MARK: Subscriptions

    /// `SUBSCRIBE channel…`: returns once the server confirmed every channel (a refusal, such as an ACL's
    /// `NOPERM`, is thrown); the stream ends when the subscriber closes (cancelling the iteration
    /// unsubscribes). Subscribing while the connection is being re-established returns a stream whose
    /// first event is ``RedisPubSubEvent/lost(_:)``, then ``RedisPubSubEvent/restored`` once subscribed.
    public func subscribe(to channels: [String]) async throws -> AsyncStream<RedisPubSubEvent> {
        try await register(.channel, channels)
    }

    /// `PSUBSCRIBE pattern…`
    public func subscribe(toPatterns patterns: [String]) async throws -> AsyncStream<RedisPubSubEvent> {
        try await register(.pattern, patterns)
    }

    /// `SSUBSCRIBE shardchannel…` (Redis 7): every channel must belong to the node this subscriber talks to.
    public func subscribe(toShardChannels channels: [String]) async throws -> AsyncStream<RedisPubSubEvent> {
        try await register(.shard, channels)
    }

    private func register(_ kind: Kind, _ names: [String]) async throws -> AsyncStream<RedisPubSubEvent> {
        guard !names.isEmpty else { throw RedisError(.invalidConfiguration, "nothing to subscribe to") }
        let (stream, continuation) = AsyncStream<RedisPubSubEvent>.makeStream(bufferingPolicy: .bufferingOldest(bufferLimit + 1))
        let bounded = BoundedStream(continuation: continuation, limit: bufferLimit, lost: { .lost($0) }, restored: { .restored })
        let id = try state.withLock { state -> Int in
            if state.closed { throw RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint) }
            state.nextID += 1
            state.registrations[state.nextID] = Registration(kind: kind, names: names, stream: bounded)
            return state.nextID
        }
        continuation.onTermination = { [weak self] _ in self?.unregister(id) }
        do {
            _ = try await ready()
            try await confirmSubscription(id)
        } catch {
            _ = state.withLock { $0.registrations.removeValue(forKey: id) }
            continuation.finish()
            throw error
        }
        return stream
    }

    /// Queues registration `id`'s subscription on the current connection (under the lock) and waits for
    /// the server's confirmation. With no connection (it was just lost) the stream is told `lost`: the
    /// reconnect loop, which subscribes every registration it finds once it has a connection, restores it.
    private func confirmSubscription(_ id: Int, on expected: RedisConnection? = nil) async throws {
        enum Outcome {
            case queued, awaitingReconnect, failed(RedisError)
        }
        let timeout = configuration.commandTimeout
        defer { ThreadSanitizerHandOff.received() }
        let reply = try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<RESPValue, any Error>) in
            let outcome = state.withLock { state -> Outcome in
                if state.closed { return .failed(RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint)) }
                guard let registration = state.registrations[id] else {
                    return .failed(RedisError(.shutDown, "the subscription ended", endpoint: endpoint))
                }
                guard let connection = state.connection, expected == nil || connection === expected else {
                    if expected != nil {
                        return .failed(RedisError(.connectionClosed, "the connection changed while subscribing", endpoint: endpoint))
                    }
                    if !registration.lost {
                        state.registrations[id]?.lost = true
                        registration.stream.reportLost(RedisError(.subscriptionLost, "the subscription connection is being re-established", endpoint: endpoint))
                    }
                    return .awaitingReconnect
                }
                connection.enqueueSubscription(registration.kind.subscribe, names: registration.names,
                                               confirmation: registration.kind.subscribe.lowercased(),
                                               timeout: timeout, continuation: continuation)
                return .queued
            }
            switch outcome {
            case .queued: break  // the handler resumes it
            case .awaitingReconnect: continuation.resume(returning: .null)
            case .failed(let error): continuation.resume(throwing: error)
            }
        }
        switch reply {
        case .simpleError(let message), .bulkError(let message):
            throw RedisError.server(RedisServerError(message), endpoint: endpoint)
        case .null:
            return
        default:
            throw RedisError(.unexpectedReply, "a subscription was answered with \(reply)", endpoint: endpoint)
        }
    }

    private func unregister(_ id: Int) {
        state.withLock { state in
            guard let registration = state.registrations.removeValue(forKey: id) else { return }
            let stillWanted = Set(state.registrations.values.filter { $0.kind == registration.kind }.flatMap(\.names))
            let names = registration.names.filter { !stillWanted.contains($0) }
            guard !names.isEmpty, !state.closed, let connection = state.connection else { return }
            // Queued under the lock: a later SUBSCRIBE of one of these names is written after it.
            connection.enqueueSubscription(registration.kind.unsubscribe, names: names,
                                           confirmation: registration.kind.unsubscribe.lowercased(),
                                           timeout: configuration.commandTimeout, continuation: nil)
        }
    }

    // MARK: Tracking

    /// Turns on `CLIENT TRACKING` on the subscriber's own connection (RESP3: invalidations arrive as push
    /// frames on it) and returns the invalidation stream. A second call replaces the first (its stream
    /// ends). After a reconnect tracking is re-enabled before ``RedisInvalidation/restored(clientID:)``.
    public func track(_ options: RedisTrackingOptions = .init()) async throws -> AsyncStream<RedisInvalidation> {
        let (stream, continuation) = AsyncStream<RedisInvalidation>.makeStream(bufferingPolicy: .bufferingOldest(bufferLimit + 1))
        let bounded = BoundedStream(continuation: continuation, limit: bufferLimit, lost: { .lost($0) },
                                    restored: { [weak self] in .restored(clientID: self?.currentClientID.load(ordering: .relaxed) ?? 0) })
        let previous = try state.withLock { state -> Tracking? in
            if state.closed { throw RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint) }
            let previous = state.tracking
            state.tracking = Tracking(options: options, stream: bounded)
            return previous
        }
        previous?.stream.finish()
        do {
            let connection = try await ready()
            if previous != nil { _ = try await connection.send(.clientTracking(false), timeout: configuration.commandTimeout) }
            _ = try await connection.send(.clientTracking(true, options: options), timeout: configuration.commandTimeout)
            // If the connection was replaced meanwhile, the reconnect loop (which enables the tracking it
            // finds once connected) restores the stream; tell it about the gap.
            state.withLock { state in
                guard state.connection !== connection, state.tracking?.stream === bounded, state.tracking?.lost == false else { return }
                state.tracking?.lost = true
                bounded.reportLost(RedisError(.subscriptionLost, "the tracking connection is being re-established", endpoint: endpoint))
            }
        } catch {
            state.withLock { if $0.tracking?.stream === bounded { $0.tracking = nil } }
            continuation.finish()
            throw error
        }
        return stream
    }

    // MARK: Connection

    /// The current connection, connecting first if there is none. (A current connection that is no longer
    /// active is returned as it is: its loss is being reported, and what is sent on it fails.)
    private func ready() async throws -> RedisConnection {
        let task = try state.withLock { state -> Task<RedisConnection, any Error> in
            if state.closed { throw RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint) }
            if let connection = state.connection { return Task { connection } }
            if let connecting = state.connecting { return connecting }
            let task = Task { try await self.openConnection() }
            state.connecting = task
            return task
        }
        return try await task.value
    }

    private func openConnection() async throws -> RedisConnection {
        let attempt = ConnectionAttempt()
        do {
            let connection = try await RedisConnection.connect(
                to: endpoint, configuration: configuration, sslContext: sslContext, eventLoop: group.next(),
                logger: logger,
                onPush: { [weak self] push in self?.route(push) },
                onClose: { [weak self] error in self?.lost(attempt, error) })
            let failure = state.withLock { state -> RedisError? in
                state.connecting = nil
                if state.closed { return RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint) }
                if attempt.died.load(ordering: .relaxed) {
                    return RedisError(.connectionClosed, "the connection closed during setup", endpoint: endpoint)
                }
                state.connection = connection
                state.attempt = attempt
                currentClientID.store(connection.clientID, ordering: .relaxed)
                return nil
            }
            if let failure {
                connection.close(reason: failure.message)
                throw failure
            }
            return connection
        } catch {
            state.withLock { $0.connecting = nil }
            throw error
        }
    }

    /// A connection died: if it was the current one, report the loss on every stream at once (under the
    /// lock, so no `restored` can overtake it), then reconnect.
    private func lost(_ attempt: ConnectionAttempt, _ error: RedisError?) {
        let error = error ?? RedisError(.subscriptionLost, "the subscription connection closed", endpoint: endpoint)
        let lostError = RedisError(.subscriptionLost, "connection lost: \(error.message)", endpoint: endpoint)
        let reconnect = state.withLock { state -> Bool in
            attempt.died.store(true, ordering: .relaxed)
            guard state.attempt === attempt, !state.closed else { return false }
            state.connection = nil
            state.attempt = nil
            currentClientID.store(0, ordering: .relaxed)
            for id in state.registrations.keys where !state.registrations[id]!.lost {
                state.registrations[id]!.lost = true
                state.registrations[id]!.stream.reportLost(lostError)
            }
            if state.tracking?.lost == false {
                state.tracking!.lost = true
                state.tracking!.stream.reportLost(lostError)
            }
            guard !state.reconnecting else { return false }
            state.reconnecting = true
            return true
        }
        guard reconnect else { return }
        logger.warning("redis subscription connection lost; reconnecting", metadata: ["error": "\(error)"])
        Task { await self.reconnectLoop() }
    }

    /// Until closed: waits out the backoff, connects, re-enables tracking, re-subscribes every registration
    /// (one command each, so a refusal ends only the registration refused: its stream gets `lost` and
    /// finishes), then tells the streams `restored`.
    private func reconnectLoop() async {
        var attempt = 0
        while !state.withLock({ $0.closed }) {
            try? await Task.sleep(for: configuration.reconnect.delay(attempt: attempt, random: Double.random(in: 0..<1)))
            attempt += 1
            do {
                let connection = try await ready()
                if let tracking = state.withLock({ $0.tracking }) {
                    _ = try await connection.send(.clientTracking(true, options: tracking.options), timeout: configuration.commandTimeout)
                }
                let ids = state.withLock { $0.registrations.keys.sorted() }
                for id in ids {
                    do {
                        try await confirmSubscription(id, on: connection)
                    } catch let error as RedisError where error.code == .server {
                        refused(id, error)
                    } catch let error as RedisError where error.code == .shutDown && state.withLock({ !$0.closed }) {
                        continue  // the registration ended meanwhile
                    }
                }
                let restored = state.withLock { state -> Bool in
                    guard state.connection === connection, connection.isActive, !state.closed else { return false }
                    state.reconnecting = false
                    for id in state.registrations.keys where state.registrations[id]!.lost {
                        state.registrations[id]!.lost = false
                        state.registrations[id]!.stream.reportRestored()
                    }
                    if state.tracking?.lost == true {
                        state.tracking!.lost = false
                        state.tracking!.stream.reportRestored()
                    }
                    return true
                }
                guard restored else { continue }
                logger.notice("redis subscriptions restored", metadata: ["id": "\(connection.clientID)"])
                return
            } catch {
                logger.debug("redis subscriber reconnect failed", metadata: ["error": "\(error)"])
                continue
            }
        }
    }

    /// The server refused to subscribe registration `id` again (an ACL changed, a shard channel moved):
    /// its stream ends with the reason.
    private func refused(_ id: Int, _ error: RedisError) {
        let registration = state.withLock { $0.registrations.removeValue(forKey: id) }
        guard let registration else { return }
        logger.warning("redis re-subscription refused; the subscription ends",
                       metadata: ["names": "\(registration.names)", "error": "\(error)"])
        registration.stream.reportLost(RedisError(.subscriptionLost, "re-subscription refused: \(error.message)", endpoint: endpoint, serverError: error.serverError))
        registration.stream.finish()
    }

    /// Routes a push frame (on the connection's event loop).
    private func route(_ push: RESPValue) {
        guard case .push(let items) = push, let kind = items.first?.string else { return }
        switch kind {
        case "invalidate":
            guard items.count == 2 else { return }
            let event: RedisInvalidation
            switch items[1] {
            case .array(let keys):
                event = .keys(keys.compactMap(\.bulkBytes))
            case .null:
                event = .all
            default:
                return
            }
            state.withLock { $0.tracking }?.stream.yield(event)
        case "message", "smessage":
            guard items.count == 3, let channel = items[1].string, let payload = items[2].bulkBytes else { return }
            let registrationKind: Kind = kind == "message" ? .channel : .shard
            let message = RedisPubSubMessage(channel: channel, pattern: nil, payload: payload)
            for stream in streams(for: registrationKind, name: channel) { stream.yield(.message(message)) }
        case "pmessage":
            guard items.count == 4, let pattern = items[1].string, let channel = items[2].string,
                  let payload = items[3].bulkBytes else { return }
            let message = RedisPubSubMessage(channel: channel, pattern: pattern, payload: payload)
            for stream in streams(for: .pattern, name: pattern) { stream.yield(.message(message)) }
        case "sunsubscribe":
            // Not a confirmation of ours (the handler keeps those): the server dropped the shard channel
            // because its slot moved away. The registrations of that channel end, with the reason.
            guard items.count >= 2, let channel = items[1].string else { return }
            let error = RedisError(.subscriptionLost, "shard channel \(channel) moved to another node", endpoint: endpoint)
            let ended = state.withLock { state -> [BoundedStream<RedisPubSubEvent>] in
                let ids = state.registrations.filter { $0.value.kind == .shard && $0.value.names.contains(channel) }.map(\.key)
                return ids.compactMap { state.registrations.removeValue(forKey: $0)?.stream }
            }
            for stream in ended {
                stream.reportLost(error)
                stream.finish()
            }
        default:
            break  // subscribe / unsubscribe confirmations
        }
    }

    private func streams(for kind: Kind, name: String) -> [BoundedStream<RedisPubSubEvent>] {
        state.withLock { state in
            state.registrations.values.filter { $0.kind == kind && $0.names.contains(name) }.map(\.stream)
        }
    }

    /// Closes the connection and ends every stream.
    public func close() async {
        let (connection, streams, tracking) = state.withLock { state in
            state.closed = true
            let result = (state.connection, state.registrations.values.map(\.stream), state.tracking?.stream)
            state.connection = nil
            state.registrations = [:]
            state.tracking = nil
            return result
        }
        for stream in streams { stream.finish() }
        tracking?.finish()
        if let connection {
            connection.close(reason: "the subscriber was closed")
            try? await connection.closeFuture.get()
        }
    }
}
