import Logging
import NIOCore
import NIOPosix

/// Anything that sends commands: a ``RedisClient`` (one node) or a ``RedisClusterClient``.
public protocol RedisCommandSender: Sendable {
    /// Sends a command and returns its reply; a server error reply is thrown as ``RedisError`` with
    /// ``RedisError/Code/server``.
    nonisolated(nonsending)
    func send(_ command: RedisCommand) async throws -> RESPValue
    /// Sends commands pipelined (one write; in a cluster, one pipeline per node) and returns each
    /// command's outcome in order. Throws only when nothing could be sent (no connection, breaker open).
    nonisolated(nonsending)
    func send(batch commands: [RedisCommand]) async throws -> [Result<RESPValue, RedisError>]
}

/// A client of one Redis or Valkey server (standalone, or one node addressed directly).
///
/// Commands from any number of tasks are multiplexed over a small pool of connections and pipelined:
/// each waits only for its own reply. See ``RedisConfiguration`` for deadlines, reconnection and the
/// circuit breaker.
///
/// ```swift
/// let redis = try RedisClient(RedisConfiguration(url: "redis://127.0.0.1:6379"))
/// try await redis.set("greeting", Array("hello".utf8))
/// let value = try await redis.get("greeting")   // ByteBuffer?
/// await redis.shutdown()
/// ```
public final class RedisClient: RedisCommandSender {
    /// The configuration the client was made with.
    public let configuration: RedisConfiguration
    let pool: RedisNodePool
    let counters = RedisCounters()
    let group: any EventLoopGroup
    let sslContext: TLSContext?
    let logger: Logger

    /// A client of `configuration.endpoints[0]`. Connections open in the background; the first command
    /// waits for one (at most the connect timeout).
    public init(_ configuration: RedisConfiguration,
                eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "magpie.redis")) throws {
        try configuration.validate()
        self.configuration = configuration
        self.group = eventLoopGroup
        self.logger = logger
        self.sslContext = try configuration.makeSSLContext()
        self.pool = RedisNodePool(endpoint: configuration.endpoints[0], configuration: configuration,
                                  sslContext: sslContext, group: eventLoopGroup, logger: logger, counters: counters)
        pool.start()
    }

    nonisolated(nonsending)
    public func send(_ command: RedisCommand) async throws -> RESPValue {
        try await pool.send(command)
    }

    nonisolated(nonsending)
    public func send(batch commands: [RedisCommand]) async throws -> [Result<RESPValue, RedisError>] {
        let endpoint = pool.endpoint
        return try await pool.send(batch: commands).map { value in
            switch value {
            case .simpleError(let message), .bulkError(let message):
                return .failure(.server(RedisServerError(message), endpoint: endpoint))
            default:
                return .success(value)
            }
        }
    }

    /// A pooled connection, for commands that must share one (the caller must not close it).
    nonisolated(nonsending)
    public func connection() async throws -> RedisConnection {
        try await pool.connection()
    }

    /// Counts since the client was made.
    public var statistics: RedisClientStatistics { counters.snapshot }

    /// Whether the server's circuit breaker is open (calls fail fast).
    public var isBreakerOpen: Bool { pool.isBreakerOpen }

    /// Whether calls fail at once now, without touching the network: the breaker is open, or the server
    /// answered `LOADING` within ``RedisConfiguration/Breaker/loadingHold``.
    public var failsFast: Bool { pool.failsFast }

    /// The server's major version, from the newest connection's `HELLO` (nil before the first connection).
    var serverMajorVersion: Int? { pool.serverMajorVersion }

    /// Opens a dedicated connection for subscriptions and invalidations (see ``RedisSubscriber``).
    public func makeSubscriber() -> RedisSubscriber {
        RedisSubscriber(endpoint: pool.endpoint, configuration: configuration, sslContext: sslContext,
                        group: group, logger: logger)
    }

    /// Closes every connection; calls in flight fail with ``RedisError/Code/shutDown``.
    public func shutdown() async {
        await pool.shutdown()
    }
}

// MARK: Commands

extension RedisCommandSender {
    /// `GET key`: the value, or nil when the key does not exist.
    nonisolated(nonsending)
    public func get(_ key: String) async throws -> ByteBuffer? {
        try Self.bulkOrNull(try await send(.get(key)), "GET")
    }

    /// `GET key`: the value, or nil when the key does not exist.
    nonisolated(nonsending)
    public func get<Key: Collection<UInt8> & Sendable>(_ key: Key) async throws -> ByteBuffer? {
        try Self.bulkOrNull(try await send(.get(key)), "GET")
    }

    static func bulkOrNull(_ reply: RESPValue, _ command: String) throws -> ByteBuffer? {
        switch reply {
        case .bulkString(let value): return value
        case .null: return nil
        default: throw RedisError(.unexpectedReply, "\(command) replied \(reply)")
        }
    }

    /// `SET key value [PX ms] [NX|XX]`: whether the value was stored (false when the condition failed).
    @discardableResult
    public func set<Value: Collection<UInt8>>(_ key: String, _ value: Value, expiration: Duration? = nil,
                                              condition: RedisSetCondition = .always) async throws -> Bool {
        try await set(Array(key.utf8), value, expiration: expiration, condition: condition)
    }

    /// `SET key value [PX ms] [NX|XX]`: whether the value was stored (false when the condition failed).
    @discardableResult
    public func set<Key: Collection<UInt8> & Sendable, Value: Collection<UInt8>>(
        _ key: Key, _ value: Value, expiration: Duration? = nil, condition: RedisSetCondition = .always
    ) async throws -> Bool {
        let reply = try await send(.set(key, value, expiration: expiration, condition: condition))
        switch reply {
        case .simpleString: return true
        case .null: return false
        default: throw RedisError(.unexpectedReply, "SET replied \(reply)")
        }
    }

    /// `DEL key…`: how many keys existed. In a cluster every key must hash to the same slot.
    @discardableResult
    nonisolated(nonsending)
    public func del(_ keys: String...) async throws -> Int {
        try await integer(.del(keys))
    }

    /// `EXISTS key`
    nonisolated(nonsending)
    public func exists(_ key: String) async throws -> Bool {
        try await integer(RedisCommand("EXISTS", [.string(key)], keyIndices: [0], readOnly: true)) > 0
    }

    /// `INCR key`
    @discardableResult
    nonisolated(nonsending)
    public func incr(_ key: String) async throws -> Int {
        try await integer(RedisCommand("INCR", [.string(key)], keyIndices: [0]))
    }

    /// `PEXPIRE key ms`: whether the key exists (and now has the expiry).
    @discardableResult
    nonisolated(nonsending)
    public func expire(_ key: String, after duration: Duration) async throws -> Bool {
        let ms = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        return try await integer(RedisCommand("PEXPIRE", [.string(key), .integer(ms)], keyIndices: [0])) == 1
    }

    /// `PTTL key`: nil when the key does not exist or has no expiry.
    nonisolated(nonsending)
    public func timeToLive(_ key: String) async throws -> Duration? {
        let ms = try await integer(RedisCommand("PTTL", [.string(key)], keyIndices: [0], readOnly: true))
        return ms < 0 ? nil : .milliseconds(ms)
    }

    /// `PUBLISH channel message`: how many subscribers received it (on this node).
    @discardableResult
    nonisolated(nonsending)
    public func publish<Message: Collection<UInt8>>(_ message: Message, to channel: String) async throws -> Int {
        try await integer(RedisCommand("PUBLISH", [.string(channel), .bytes(Array(message))]))
    }

    /// `SPUBLISH shardchannel message` (routed by the channel's slot in a cluster).
    @discardableResult
    nonisolated(nonsending)
    public func spublish<Message: Collection<UInt8>>(_ message: Message, to channel: String) async throws -> Int {
        try await integer(RedisCommand("SPUBLISH", [.string(channel), .bytes(Array(message))], keyIndices: [0]))
    }

    /// `PING`: the round trip to the server.
    nonisolated(nonsending)
    public func ping() async throws {
        _ = try await send(.ping)
    }

    nonisolated(nonsending)
    func integer(_ command: RedisCommand) async throws -> Int {
        let reply = try await send(command)
        guard case .integer(let value) = reply else {
            throw RedisError(.unexpectedReply, "\(command.name) replied \(reply)")
        }
        return Int(value)
    }
}
