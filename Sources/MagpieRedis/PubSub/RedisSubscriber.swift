import Logging
import NIOCore
import NIOSSL
import Synchronization

/// A message received on a subscription.
public struct RedisPubSubMessage: Sendable, Hashable {
    /// The channel it was published to.
    public var channel: String
    /// The pattern that matched, for `PSUBSCRIBE`.
    public var pattern: String?
    /// The message.
    public var payload: ByteBuffer
}

/// What a subscription delivers.
public enum RedisPubSubEvent: Sendable, Hashable {
    /// A message.
    case message(RedisPubSubMessage)
    /// The subscription's connection was lost: messages published from now until ``RedisPubSubEvent/restored`` are missed.
    case lost(RedisError)
    /// The subscription is active again on a new connection (after a ``RedisPubSubEvent/lost(_:)``).
    case restored
}

/// What the tracking stream delivers (`CLIENT TRACKING` invalidations).
public enum RedisInvalidation: Sendable, Hashable {
    /// These keys changed (set, deleted, expired or evicted) on the server.
    case keys([ByteBuffer])
    /// Every tracked key may have changed (`FLUSHALL`, `FLUSHDB`).
    case all
    /// The tracking connection was lost: from now until ``RedisInvalidation/restored(clientID:)``, changes are not reported, so
    /// anything cached from the server is unverified (Redis's client-side caching docs: flush it).
    case lost(RedisError)
    /// Tracking is active again on a new connection, whose id (the target for `REDIRECT`) is given.
    case restored(clientID: Int64)
}

/// `CLIENT TRACKING` options.
public struct RedisTrackingOptions: Sendable, Hashable {
    /// Broadcasting mode (`BCAST`): report every change to a key under ``prefixes``, read or not.
    public var broadcast: Bool
    /// Key prefixes (`PREFIX`), with ``broadcast``; empty: every key.
    public var prefixes: [String]
    /// `NOLOOP`: do not report changes made through the connection that tracks.
    public var noLoop: Bool

    public init(broadcast: Bool = true, prefixes: [String] = [], noLoop: Bool = false) {
        self.broadcast = broadcast
        self.prefixes = prefixes
        self.noLoop = noLoop
    }
}

extension RedisCommand {
    /// `CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST] [PREFIX p]… [NOLOOP]`. A data connection may redirect
    /// its invalidations to a subscriber's connection (``RedisSubscriber/clientID``); with ``RedisTrackingOptions/noLoop`` its
    /// own writes are then not reported.
    public static func clientTracking(_ on: Bool, options: RedisTrackingOptions = .init(), redirect: Int64? = nil) -> RedisCommand {
        var arguments: [RedisArgument] = ["TRACKING", on ? "ON" : "OFF"]
        if on {
            if let redirect { arguments += ["REDIRECT", .integer(redirect)] }
            if options.broadcast {
                arguments.append("BCAST")
                for prefix in options.prefixes { arguments += ["PREFIX", .string(prefix)] }
            }
            if options.noLoop { arguments.append("NOLOOP") }
        }
        return RedisCommand("CLIENT", arguments)
    }
}

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
    private let sslContext: NIOSSLContext?
    private let group: any EventLoopGroup
    private let logger: Logger
    private let state = Mutex(State())

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
    }

    private struct Tracking {
        let options: RedisTrackingOptions
        let stream: BoundedStream<RedisInvalidation>
    }

    private struct State {
        var connection: RedisConnection?
        var connecting: Task<RedisConnection, any Error>?
        var registrations: [Int: Registration] = [:]
        var tracking: Tracking?
        var nextID = 0
        var closed = false
        var reconnecting = false
    }

    init(endpoint: RedisEndpoint, configuration: RedisConfiguration, sslContext: NIOSSLContext?,
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
        self.bufferLimit = bufferLimit
    }

    /// The server's id of the current connection (the target for `CLIENT TRACKING … REDIRECT`), or nil
    /// while disconnected.
    public var clientID: Int64? { state.withLock { $0.connection?.clientID } }

    /// Whether the subscriber's connection is up.
    public var isConnected: Bool { state.withLock { $0.connection?.isActive ?? false } }

    // MARK: Subscriptions

    /// `SUBSCRIBE channel…`: returns once the server confirmed; the stream ends when the subscriber closes
    /// (cancelling the iteration unsubscribes).
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
            let connection = try await ready()
            connection.writeWithoutReply(RedisCommand(kind.subscribe, names.map { .string($0) }))
            // Commands run in order: once PING is answered, the subscription confirmations have been sent.
            _ = try await connection.send(.ping, timeout: configuration.commandTimeout)
        } catch {
            _ = state.withLock { $0.registrations.removeValue(forKey: id) }
            continuation.finish()
            throw error
        }
        return stream
    }

    private func unregister(_ id: Int) {
        let (connection, unsubscribe) = state.withLock { state -> (RedisConnection?, RedisCommand?) in
            guard let registration = state.registrations.removeValue(forKey: id) else { return (nil, nil) }
            let stillWanted = Set(state.registrations.values.filter { $0.kind == registration.kind }.flatMap(\.names))
            let names = registration.names.filter { !stillWanted.contains($0) }
            guard !names.isEmpty, !state.closed else { return (nil, nil) }
            return (state.connection, RedisCommand(registration.kind.unsubscribe, names.map { .string($0) }))
        }
        if let connection, let unsubscribe { connection.writeWithoutReply(unsubscribe) }
    }

    // MARK: Tracking

    /// Turns on `CLIENT TRACKING` on the subscriber's own connection (RESP3: invalidations arrive as push
    /// frames on it) and returns the invalidation stream. A second call replaces the first (its stream
    /// ends). After a reconnect tracking is re-enabled before ``RedisInvalidation/restored(clientID:)``.
    public func track(_ options: RedisTrackingOptions = .init()) async throws -> AsyncStream<RedisInvalidation> {
        let (stream, continuation) = AsyncStream<RedisInvalidation>.makeStream(bufferingPolicy: .bufferingOldest(bufferLimit + 1))
        let bounded = BoundedStream(continuation: continuation, limit: bufferLimit, lost: { .lost($0) },
                                    restored: { [weak self] in .restored(clientID: self?.clientID ?? 0) })
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
        } catch {
            state.withLock { if $0.tracking?.stream === bounded { $0.tracking = nil } }
            continuation.finish()
            throw error
        }
        return stream
    }

    // MARK: Connection

    /// The current connection, connecting first if there is none.
    private func ready() async throws -> RedisConnection {
        let task = try state.withLock { state -> Task<RedisConnection, any Error> in
            if state.closed { throw RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint) }
            if let connection = state.connection, connection.isActive {
                return Task { connection }
            }
            if let connecting = state.connecting { return connecting }
            let task = Task { try await self.openConnection() }
            state.connecting = task
            return task
        }
        return try await task.value
    }

    private func openConnection() async throws -> RedisConnection {
        do {
            let connection = try await RedisConnection.connect(
                to: endpoint, configuration: configuration, sslContext: sslContext, eventLoop: group.next(),
                logger: logger,
                onPush: { [weak self] push in self?.route(push) },
                onClose: { [weak self] error in self?.lost(error) })
            let keep = state.withLock { state -> Bool in
                state.connecting = nil
                guard !state.closed else { return false }
                state.connection = connection
                return true
            }
            if !keep {
                connection.close(reason: "the subscriber was closed")
                throw RedisError(.shutDown, "the subscriber was closed", endpoint: endpoint)
            }
            return connection
        } catch {
            state.withLock { $0.connecting = nil }
            throw error
        }
    }

    /// The connection died: report the loss on every stream at once, then reconnect.
    private func lost(_ error: RedisError?) {
        let error = error ?? RedisError(.subscriptionLost, "the subscription connection closed", endpoint: endpoint)
        let (streams, tracking, reconnect) = state.withLock { state -> ([BoundedStream<RedisPubSubEvent>], BoundedStream<RedisInvalidation>?, Bool) in
            state.connection = nil
            let reconnect = !state.closed && !state.reconnecting
            if reconnect { state.reconnecting = true }
            return (state.registrations.values.map(\.stream), state.tracking?.stream, reconnect)
        }
        if state.withLock({ $0.closed }) { return }
        let lostError = RedisError(.subscriptionLost, "connection lost: \(error.message)", endpoint: endpoint)
        logger.warning("redis subscription connection lost; reconnecting", metadata: ["error": "\(error)"])
        for stream in streams { stream.reportLost(lostError) }
        tracking?.reportLost(lostError)
        if reconnect { Task { await self.reconnectLoop() } }
    }

    private func reconnectLoop() async {
        var attempt = 0
        while !state.withLock({ $0.closed }) {
            try? await Task.sleep(for: configuration.reconnect.delay(attempt: attempt, random: Double.random(in: 0..<1)))
            attempt += 1
            do {
                let connection = try await ready()
                let (registrations, tracking) = state.withLock { ($0.registrations.values.map { $0 }, $0.tracking) }
                if let tracking {
                    _ = try await connection.send(.clientTracking(true, options: tracking.options), timeout: configuration.commandTimeout)
                }
                var byKind: [Kind: Set<String>] = [:]
                for registration in registrations { byKind[registration.kind, default: []].formUnion(registration.names) }
                for (kind, names) in byKind where !names.isEmpty {
                    connection.writeWithoutReply(RedisCommand(kind.subscribe, names.sorted().map { .string($0) }))
                }
                _ = try await connection.send(.ping, timeout: configuration.commandTimeout)
                let still = state.withLock { state -> Bool in
                    guard state.connection === connection, connection.isActive else { return false }
                    state.reconnecting = false
                    return true
                }
                guard still else { continue }
                logger.notice("redis subscriptions restored", metadata: ["id": "\(connection.clientID)"])
                for registration in registrations { registration.stream.reportRestored() }
                tracking?.stream.reportRestored()
                return
            } catch {
                logger.debug("redis subscriber reconnect failed", metadata: ["error": "\(error)"])
                continue
            }
        }
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
            // The server drops shard subscriptions whose slot moved away; the subscribers must be told.
            guard items.count >= 2, let channel = items[1].string else { return }
            let error = RedisError(.subscriptionLost, "shard channel \(channel) moved to another node", endpoint: endpoint)
            for stream in streams(for: .shard, name: channel) { stream.reportLost(error) }
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

/// An `AsyncStream` continuation that never drops an event silently: when the consumer is `limit` events
/// behind, the next events are dropped and the consumer receives a `lost` event (as soon as there is
/// room for it), then `restored` once it caught up.
final class BoundedStream<Event: Sendable>: Sendable {
    private let continuation: AsyncStream<Event>.Continuation
    private let limit: Int
    private let makeLost: @Sendable (RedisError) -> Event
    private let makeRestored: @Sendable () -> Event
    /// Overflow state: whether events were dropped, and whether the consumer has been told.
    private let overflow = Mutex<(dropped: Bool, told: Bool)>((false, false))

    init(continuation: AsyncStream<Event>.Continuation, limit: Int,
         lost: @escaping @Sendable (RedisError) -> Event, restored: @escaping @Sendable () -> Event) {
        self.continuation = continuation
        self.limit = limit
        self.makeLost = lost
        self.makeRestored = restored
    }

    func yield(_ event: Event) {
        overflow.withLock { overflow in
            if !overflow.dropped {
                switch continuation.yield(event) {
                case .enqueued(let remaining):
                    // `limit` events buffered: the last slot is kept for the loss report.
                    if remaining <= 1 { overflow = (true, false) }
                case .dropped:
                    overflow = (true, false)
                case .terminated:
                    break
                @unknown default:
                    break
                }
                return
            }
            // Dropping: this event is lost. Tell the consumer once, then resume when there is room again.
            if !overflow.told {
                let error = RedisError(.subscriptionLost, "the consumer fell \(limit) events behind; events were dropped")
                if case .enqueued = continuation.yield(makeLost(error)) { overflow.told = true }
                return
            }
            if case .enqueued(let remaining) = continuation.yield(makeRestored()) {
                overflow = remaining > 1 ? (false, false) : (true, false)
            }
        }
    }

    func reportLost(_ error: RedisError) { continuation.yield(makeLost(error)) }

    func reportRestored() { continuation.yield(makeRestored()) }

    func finish() { continuation.finish() }
}
