import Dispatch
import Glibc
import Logging
import Magpie
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// Redis or Valkey (a single server or a cluster) as the remote tier of a `Cache`: shared by
/// every instance, and the source of the invalidations that keep their local tiers coherent.
///
/// ```swift
/// let store = try RedisRemoteStore(.init(url: "redis://cache.internal:6379", namespace: "thumbs:"))
/// var configuration = Cache.Configuration(directory: "/var/cache/thumbs")
/// configuration.remote = RemoteTierOptions(store: store)
/// let cache = try Cache(configuration)
/// ```
///
/// **Keys.** Everything the cache stores lives under ``Configuration/namespace``: records, group and
/// namespace tokens, and this store's heartbeats and sequence numbers. Nothing else under that prefix
/// should be written by other programs, except to change or remove a cached key, and then with
/// ``Configuration/reportsForeignWrites`` (every instance then drops it).
///
/// **Coherence.** Every write the store makes is a script that also publishes the write's change message
/// on the namespace's channel (numbered in the key's hash slot, with the value when it is small: Magpie's
/// article "Running a fleet"), and one subscriber connection per store reads them. Every
/// ``Configuration/heartbeatInterval`` the store publishes a heartbeat on each master; its arrival on the
/// subscription proves that every message published before it was received, which is what the cache's
/// staleness bound is measured against. A subscription lost and re-established (or one that fell behind)
/// invalidates every local copy; a heartbeat lost on the way invalidates that master's slots. Writes of
/// programs that are not caches are reported only with ``Configuration/reportsForeignWrites``.
public final class RedisRemoteStore: RemoteStore {
    /// How to reach Redis and where to keep the cache's keys.
    public struct Configuration: Sendable {
        /// Endpoints, credentials, TLS, timeouts, pool and breaker.
        public var redis: RedisConfiguration
        /// The prefix of every key (a non-empty string, e.g. `"myapp:cache:"`). Instances that share a
        /// namespace share their entries.
        public var namespace: String
        /// Whether ``redis``'s endpoints are seeds of a Redis Cluster.
        public var cluster: Bool
        /// How often each master's change feed is confirmed (default 100 ms): a tenth of the cache's
        /// `RemoteTierOptions.maxDisconnectedStaleness` or less, or local copies lapse while
        /// Redis is healthy.
        public var heartbeatInterval: Duration
        /// Whether writes of keys under ``namespace`` by programs that are not caches (a `SET` from another
        /// client, an expiry, an eviction) are reported, through `CLIENT TRACKING ON BCAST PREFIX` on the
        /// subscriber's connection. Each such report costs every instance one `GETRANGE` of the key's
        /// version, which tells a cache's own write (its change message already applied) from another
        /// program's. Default false: only caches write the namespace.
        public var reportsForeignWrites = false
        /// For tests and benchmarks: the fraction (0…1) of received change messages the store discards
        /// before the cache sees them, each on its own, as a lossy network would. Default 0.
        public var dropChangeMessages = 0.0

        /// A configuration: how to reach Redis, the namespace, and whether it is a cluster.
        public init(redis: RedisConfiguration, namespace: String, cluster: Bool = false,
                    heartbeatInterval: Duration = .milliseconds(100)) {
            self.redis = redis
            self.namespace = namespace
            self.cluster = cluster
            self.heartbeatInterval = heartbeatInterval
        }

        /// A configuration from a URL (``RedisConfiguration/init(url:)``).
        public init(url: String, namespace: String, cluster: Bool = false) throws {
            self.init(redis: try RedisConfiguration(url: url), namespace: namespace, cluster: cluster)
        }
    }

    /// The configuration the store was made with.
    public let configuration: Configuration
    let sender: any RedisCommandSender
    let single: RedisClient?
    let cluster: RedisClusterClient?
    let prefix: [UInt8]
    let instance: String
    /// This instance's tag in the messages it publishes (8 bytes): a message carrying it is its own.
    let origin: [UInt8]
    /// The namespace's change channel.
    let channel: [UInt8]
    let executor: RedisEventLoopExecutor
    let logger: Logger
    let state = RedisLock(State())
    /// Commands Redis refused for lack of memory: a full server refuses thousands a second, so the log
    /// says it once per 10 s with how many (the cache's `oomRefusals` counts every one it made).
    let refusedForMemory: RepeatedLog

    struct State {
        var changes: RemoteChanges?
        var supervisor: Task<Void, Never>?
        /// The subscription that reads the change messages.
        var subscription: Subscription?
        /// Each master's heartbeats (which confirm the subscription for the messages that master published).
        var masters: [RedisEndpoint: Progress] = [:]
        var delivered: Int64 = 0
        /// The fleet's delivery watermark last reported to the cache (the least of the masters').
        var watermark: Int64? = nil
        /// How far the server's clock is ahead of the cache's (the watermarks are kept by the server's).
        var serverClock = ClockOffset()
        var sequence: UInt64 = 0
        /// The epoch of the sequence hash the latest message carried (RedisRemoteScript.change).
        var epoch: UInt64? = nil
        var shutDown = false
    }

    /// The server's clock against this instance's, from the heartbeats' round trips (as NTP does): each
    /// answer's server instant against the middle of its round trip, the estimate from the quickest of
    /// the last 64 (a round trip stretched by a paused server or a busy loop says little), uncertain by
    /// half that round trip (and 1 ms of rounding).
    struct ClockOffset {
        private var samples: [(offset: Int64, roundTrip: Int64)] = []
        private var next = 0

        mutating func add(serverNow: Int64, sentAt: Int64, receivedAt: Int64) {
            let roundTrip = max(0, receivedAt - sentAt)
            let sample = (offset: serverNow - (sentAt + roundTrip / 2), roundTrip: roundTrip)
            if samples.count < 64 {
                samples.append(sample)
            } else {
                samples[next] = sample
                next = (next + 1) % 64
            }
        }

        var estimate: (offset: Int64, uncertainty: Int64)? {
            guard let best = samples.min(by: { $0.roundTrip < $1.roundTrip }) else { return nil }
            return (best.offset, best.roundTrip / 2 + 1)
        }
    }

    /// The subscription to the change channel: its subscriber (on one master), and the tasks that read
    /// its messages and, with foreign writes reported, its invalidations.
    final class Subscription: Sendable {
        let endpoint: RedisEndpoint
        let subscriber: RedisSubscriber
        let readers = RedisLock<[Task<Void, Never>]>([])
        let ended = RedisLock(false)

        init(endpoint: RedisEndpoint, subscriber: RedisSubscriber) {
            self.endpoint = endpoint
            self.subscriber = subscriber
        }

        func close() async {
            for reader in readers.withLock({ $0 }) { reader.cancel() }
            await subscriber.close()
        }
    }

    /// One master's heartbeats.
    struct Progress {
        /// Heartbeats sent and not yet seen, by number: the instant each was sent.
        var outstanding: [UInt64: Int64] = [:]
        /// Heartbeats the master answered (so it published them) and not yet seen.
        var answered: Set<UInt64> = []
        /// Heartbeats not yet answered when a later one was seen: lost on the way if the master answers them.
        var overtaken: Set<UInt64> = []
        /// The send instant of the latest heartbeat seen: every message before it was received.
        var confirmed: Int64 = 0
        /// The latest heartbeat seen.
        var seen: UInt64 = 0
        /// The partitions' numbers read just before a heartbeat, reported when it is seen.
        var sequences: [UInt64: [Int: UInt64]] = [:]
        /// The fleet's delivery watermark each heartbeat's script answered, until it is delivered.
        var watermarks: [UInt64: Int64] = [:]
        /// The watermark of the latest heartbeat both answered and seen (every message before it was
        /// received by then): what this master vouches for. Nil before the first.
        var delivered: Int64? = nil

        /// Takes the watermark of the latest heartbeat that was answered and seen; whether it moved.
        mutating func settleWatermark() -> Bool {
            guard let number = watermarks.keys.filter({ $0 <= seen }).max(), let watermark = watermarks[number] else {
                return false
            }
            watermarks = watermarks.filter { $0.key > number }
            defer { delivered = watermark }
            return delivered != watermark
        }

        /// Heartbeat `number` was seen: whether one published before it was lost on the way.
        mutating func see(_ number: UInt64) -> (sentAt: Int64, lost: Bool)? {
            guard let sentAt = outstanding[number] else { return nil }
            var lost = false
            for earlier in outstanding.keys where earlier < number {
                if answered.contains(earlier) { lost = true } else { overtaken.insert(earlier) }
            }
            outstanding = outstanding.filter { $0.key > number }
            answered = answered.filter { $0 > number }
            if overtaken.count > 64 { overtaken = Set(overtaken.sorted().suffix(64)) }
            confirmed = max(confirmed, sentAt)
            seen = max(seen, number)
            return (sentAt, lost)
        }

        /// Heartbeat `number` was answered: whether it had been overtaken (so it was lost on the way).
        mutating func answer(_ number: UInt64) -> Bool {
            if overtaken.remove(number) != nil { return true }
            if outstanding[number] != nil { answered.insert(number) }
            return false
        }
    }

    /// A store for `configuration`; connects in the background (calls fail fast until it can).
    public init(_ configuration: Configuration, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "magpie.redis.remote")) throws {
        guard !configuration.namespace.isEmpty else {
            throw RedisError(.invalidConfiguration, "the namespace must not be empty (it is every key's prefix)")
        }
        guard configuration.heartbeatInterval > .zero else {
            throw RedisError(.invalidConfiguration, "heartbeatInterval must be positive")
        }
        self.configuration = configuration
        // Every connection of the store on one event loop, the one its remote work runs on
        // (``taskExecutor``): a remote operation's commands are written and their replies read on the
        // thread that runs it, and it costs its caller one hop there and one back, however many commands.
        let loop = eventLoopGroup.next()
        if configuration.cluster {
            let client = try RedisClusterClient(configuration.redis, eventLoopGroup: loop, logger: logger)
            cluster = client
            single = nil
            sender = client
        } else {
            let client = try RedisClient(configuration.redis, eventLoopGroup: loop, logger: logger)
            single = client
            cluster = nil
            sender = client
        }
        prefix = Array(configuration.namespace.utf8)
        let identity = UInt64.random(in: 0...UInt64.max)
        instance = String(identity, radix: 36)
        origin = withUnsafeBytes(of: identity.bigEndian) { Array($0) }
        channel = prefix + Self.channelStem
        executor = RedisEventLoopExecutor(loop)
        self.logger = logger
        refusedForMemory = RepeatedLog(
            logger, level: .warning,
            "magpie: Redis refuses writes for lack of memory (OOM: over maxmemory, with nothing its policy may evict)",
            interval: .seconds(10))
    }

    // MARK: RemoteStore

    public func values(forKeys keys: [[UInt8]]) async throws(MagpieError) -> [[UInt8]?] {
        do {
            if keys.count == 1 {
                return [try Self.bytes(await sender.send(.get(prefix + keys[0])))]
            }
            let replies = try await sender.send(batch: keys.map { .get(prefix + $0) })
            return try replies.map { reply throws -> [UInt8]? in try Self.bytes(reply.get()) }
        } catch {
            throw failure(error)
        }
    }

    public func store(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, onlyIfAbsent: Bool) async throws(MagpieError)
        -> Bool
    {
        var lifetime: Int64 = 0
        if expiresAt != 0 {
            lifetime = expiresAt - now()
            guard lifetime > 0 else {
                try await remove(keys: [key])
                return true
            }
        }
        do {
            guard onlyIfAbsent else { return try await change(.plain, key, value: value, lifetime: lifetime) }
            // A token created where there was none: announced, with the token, as a replaced one is. The
            // key may have lost its token to an eviction (every record under it outdated): an instance
            // that still holds the old one forgets it, and its copies of those records, where it would
            // otherwise judge every record written under the new token outdated (the fleet split in two).
            if key.first == Self.namespaceTag || key.first == Self.groupTag {
                return try await change(.created, key, value: value, lifetime: lifetime, pushing: true)
            }
            // A lease taken changes nothing a cache holds: a plain SET, no message.
            let reply = try await sender.send(
                .set(prefix + key, value, expiration: lifetime > 0 ? .milliseconds(lifetime) : nil, condition: .ifNotExists))
            switch reply {
            case .simpleString: return true
            case .null: return false
            default: throw RedisError(.unexpectedReply, "SET answered \(reply)")
            }
        } catch {
            throw failure(error)
        }
    }

    public func remove(keys: [[UInt8]]) async throws(MagpieError) {
        do {
            for key in keys { _ = try await change(.removal, key) }
        } catch {
            throw failure(error)
        }
    }

    public var partitionCount: Int { RedisHashSlot.count }

    public func partition(of key: [UInt8]) -> Int {
        (prefix + key).withUnsafeBytes { Int(RedisHashSlot.slot(ofBytes: $0)) }
    }

    public var taskExecutor: (any TaskExecutor)? { executor }

    public var failsFast: Bool { single?.failsFast ?? false }

    public func startReporting(to changes: RemoteChanges) {
        state.withLock { state in
            guard state.changes == nil, !state.shutDown else { return }
            state.changes = changes
            // The heartbeats and feeds run on the store's event loop, not on Swift's cooperative pool:
            // callers that block pool threads (synchronous code, tests) must not stall confirmations.
            state.supervisor = Task(executorPreference: executor) { [weak self] in await self?.supervise() }
        }
    }

    public func shutdown() async {
        let (supervisor, subscription) = state.withLock { state -> (Task<Void, Never>?, Subscription?) in
            state.shutDown = true
            defer {
                state.supervisor = nil
                state.subscription = nil
                state.masters = [:]
            }
            return (state.supervisor, state.subscription)
        }
        supervisor?.cancel()
        refusedForMemory.flush()
        await leaveWatermarkLists()
        await subscription?.close()
        if let single { await single.shutdown() }
        if let cluster { await cluster.shutdown() }
    }

    // MARK: Support

    func now() -> Int64 {
        if let changes = state.withLock({ $0.changes }) { return changes.now() }
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }

    static func bytes(_ reply: RESPValue) throws -> [UInt8]? {
        switch reply {
        case .bulkString(let buffer): return Array(buffer.readableBytesView)
        case .null: return nil
        default: throw RedisError(.unexpectedReply, "GET answered \(reply)")
        }
    }

    static func unavailable(_ error: any Error) -> MagpieError {
        if let error = error as? MagpieError { return error }
        if let error = error as? RedisError, let server = error.serverError {
            // Over maxmemory with nothing to evict: reachable, and refusing writes that take memory.
            if server.kind == .outOfMemory { return MagpieError(.remoteFull, "\(error)") }
            // Reading its data set back after a restart: reachable, and serving nothing yet.
            if server.kind == .loading { return MagpieError(.remoteUnavailable, "\(error)") }
            // The server answered with an error reply: reachable, and refusing.
            return MagpieError(.remoteRefused, "\(error)")
        }
        return MagpieError(.remoteUnavailable, "\(error)")
    }

    /// A call's failure as the cache sees it (``unavailable(_:)``), a refusal for lack of memory logged
    /// (``refusedForMemory``).
    func failure(_ error: any Error) -> MagpieError {
        let failure = Self.unavailable(error)
        if failure.code == .remoteFull {
            refusedForMemory.record(error: failure.message, metadata: ["namespace": "\(configuration.namespace)"])
        }
        return failure
    }

    /// The logical keys' tags of the tokens (the cache's layout: "a" the namespace's, "g" + name a group's).
    static let namespaceTag = UInt8(ascii: "a")
    static let groupTag = UInt8(ascii: "g")
}
