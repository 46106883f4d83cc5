import Glibc
import NIOCore
#if TLS
import NIOSSL
#endif

/// How a ``RedisClient`` (or ``RedisClusterClient``) connects and behaves when the server misbehaves.
///
/// Every limit has a default an operator would choose for a cache: short deadlines (a cache call that
/// waits a second has already failed its caller), a small pool, a breaker that opens after three failed
/// attempts in a row and closes as soon as a connection to the node works again.
public struct RedisConfiguration: Sendable {
    /// The server, or for a cluster the seed nodes (any one reachable node is enough to discover the rest).
    public var endpoints: [RedisEndpoint]
    /// The ACL user for `HELLO 3 AUTH` (nil: `default`, when a ``password`` is set).
    public var username: String?
    /// The password for `HELLO 3 AUTH` (nil: no authentication).
    public var password: String?
    /// Sent with `HELLO … SETNAME`, shown by `CLIENT LIST` (nil: none).
    public var clientName: String?
    /// The logical database (`SELECT`); always 0 in a cluster.
    public var database: Int
    /// TLS, with certificate verification on by default (nil: plain TCP).
    public var tls: RedisTLS?
    /// The time to open a connection, TLS and `HELLO` included.
    public var connectTimeout: Duration
    /// The time a command waits for its reply. Past it the call throws ``RedisError/Code/timedOut`` and the
    /// connection is closed (never drained and reused: a late reply must not reach another caller).
    public var commandTimeout: Duration
    /// The connection pool of each node.
    public var pool: Pool
    /// Reconnection after a failure: jittered exponential backoff.
    public var reconnect: Backoff
    /// The circuit breaker of each node.
    public var breaker: Breaker
    /// What the decoder accepts from a server before it closes the connection.
    public var decoderLimits: RESPDecoderLimits
    /// Cluster behaviour (ignored by ``RedisClient``).
    public var cluster: Cluster
    /// Records where each round trip's time goes, as the swift-metrics timer `magpie_redis_stage_seconds`
    /// (dimensions `node` and `stage`), once per round trip in the task that awaited it: `queued`, from
    /// the call (its connection picked) until the connection's event loop handed the command to the
    /// socket (the submission queue and the loop's backlog); `server`, from then until the loop decoded
    /// its reply (the network, the server's queue and its execution, and the loop's delay in reading);
    /// `resumed`, from then until the caller ran again (its executor's queue). Off by default: it costs
    /// an allocation and four clock reads per round trip. What `magpie-bench fleet` reports per set,
    /// removal and read.
    public var recordsStages: Bool

    /// The pool of connections to one node. Commands are multiplexed: many callers pipeline on the same
    /// connection, each command goes to the connection with the fewest replies outstanding, and a new
    /// connection opens (up to ``maximumConnections``) when every open one is busy.
    public struct Pool: Sendable, Hashable {
        /// Connections kept open (and reopened after a failure) even when idle.
        public var minimumConnections: Int = 1
        /// The most connections opened to one node.
        public var maximumConnections: Int = 4
        /// A connection beyond the minimum that carried no command for this long is closed.
        public var idleTimeout: Duration = .seconds(60)
        /// How often idle connections are checked with `PING` (a failed check closes the connection).
        public var healthCheckInterval: Duration = .seconds(5)
        public init() {}
    }

    /// Jittered exponential backoff: attempt *n* (from 0) waits `initial × multiplierⁿ`, capped at
    /// ``maximum``, then scaled by a random factor in `1 ± jitter`.
    public struct Backoff: Sendable, Hashable {
        public var initial: Duration = .milliseconds(25)
        public var maximum: Duration = .seconds(2)
        public var multiplier: Double = 2
        public var jitter: Double = 0.2
        public init() {}

        /// The wait before attempt `attempt` (0-based), with jitter drawn from `random` (in 0..<1).
        public func delay(attempt: Int, random: Double) -> Duration {
            let base = Double(initial.components.seconds) + Double(initial.components.attoseconds) / 1e18
            let cap = Double(maximum.components.seconds) + Double(maximum.components.attoseconds) / 1e18
            let raw = min(cap, base * pow(multiplier, Double(min(attempt, 62))))
            let scaled = raw * (1 + jitter * (2 * random - 1))
            let nanoseconds = max(0, scaled) * 1e9
            // Never a trap: NaN (from a NaN setting) waits nothing; anything beyond Int64 saturates.
            guard nanoseconds.isFinite, nanoseconds < 9.2e18 else { return nanoseconds.isNaN ? .zero : .nanoseconds(Int64.max) }
            return .nanoseconds(Int64(nanoseconds))
        }
    }

    /// The circuit breaker of one node: after ``failureThreshold`` consecutive failures (a connection that
    /// could not be made or handshaken, or one closed by a command timeout or a network error) it opens and
    /// every call to the node fails at once with ``RedisError/Code/circuitOpen``, without touching the
    /// network. Meanwhile the pool keeps trying to reconnect on the backoff schedule; the first connection
    /// that completes its handshake closes the breaker.
    ///
    /// A node that answers `LOADING` (reading its data set back after a restart) is reachable but serves
    /// nothing: for ``loadingHold`` after each such reply every call to it fails at once with the same
    /// `LOADING` error, without touching the network, and then one call probes it again. (The server
    /// interleaves its clients' commands with the load: clients that keep sending slow the load down.)
    public struct Breaker: Sendable, Hashable {
        public var failureThreshold: Int = 3
        /// How long calls fail at once after the node answered `LOADING` (zero: never held).
        public var loadingHold: Duration = .milliseconds(100)
        public init() {}
    }

    /// Cluster behaviour.
    public struct Cluster: Sendable, Hashable {
        /// The most MOVED / ASK / TRYAGAIN / CLUSTERDOWN redirections one command follows.
        public var maximumRedirections: Int = 8
        /// How often the slot map is refreshed even without a MOVED reply.
        public var topologyRefreshInterval: Duration = .seconds(30)
        /// The wait before retrying after TRYAGAIN or CLUSTERDOWN.
        public var retryDelay: Duration = .milliseconds(20)
        public init() {}
    }

    /// A configuration for the given server(s).
    public init(endpoints: [RedisEndpoint]) {
        self.endpoints = endpoints
        self.username = nil
        self.password = nil
        self.clientName = nil
        self.database = 0
        self.tls = nil
        self.connectTimeout = .seconds(1)
        self.commandTimeout = .seconds(1)
        self.pool = Pool()
        self.reconnect = Backoff()
        self.breaker = Breaker()
        self.decoderLimits = RESPDecoderLimits()
        self.cluster = Cluster()
        self.recordsStages = false
    }

    /// A configuration from a URL: `redis://[[user]:password@]host[:port][/database]`, or `rediss://…` for
    /// TLS with certificate verification against the system's trust roots. Several seed nodes may be given
    /// separated by commas: `redis://h1:7000,h2:7001`.
    public init(url: String) throws {
        let marker = Array("://".utf8)
        let utf8 = Array(url.utf8)
        guard let start = utf8.indices.first(where: { utf8[$0...].starts(with: marker) }) else {
            throw RedisError(.invalidConfiguration, "not a redis URL: \(url)")
        }
        let scheme = String(decoding: utf8[..<start], as: UTF8.self).lowercased()
        guard scheme == "redis" || scheme == "rediss" else {
            throw RedisError(.invalidConfiguration, "unknown scheme \(scheme) (redis:// or rediss://)")
        }
        var rest = Substring(String(decoding: utf8[(start + 3)...], as: UTF8.self))
        var username: String?
        var password: String?
        if let at = rest.lastIndex(of: "@") {
            let credentials = rest[..<at]
            rest = rest[rest.index(after: at)...]
            if let colon = credentials.firstIndex(of: ":") {
                let user = String(credentials[..<colon])
                username = user.isEmpty ? nil : Self.percentDecoded(user)
                password = Self.percentDecoded(String(credentials[credentials.index(after: colon)...]))
            } else if !credentials.isEmpty {
                password = Self.percentDecoded(String(credentials))
            }
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let path = rest[rest.index(after: slash)...].prefix { $0 != "?" }
            if !path.isEmpty {
                guard let db = Int(path), db >= 0 else {
                    throw RedisError(.invalidConfiguration, "bad database number \(path) in \(url)")
                }
                database = db
            }
            rest = rest[..<slash]
        }
        var endpoints: [RedisEndpoint] = []
        for hostPort in rest.split(separator: ",") {
            if hostPort.contains(":"), !(hostPort.hasPrefix("[") && hostPort.hasSuffix("]")),
               let endpoint = RedisEndpoint(hostAndPort: hostPort) {
                endpoints.append(endpoint)
            } else if !hostPort.contains(":") || hostPort.hasPrefix("[") {
                var host = String(hostPort)
                if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
                endpoints.append(RedisEndpoint(host: host))
            } else {
                throw RedisError(.invalidConfiguration, "bad host:port \(hostPort) in \(url)")
            }
        }
        guard !endpoints.isEmpty, endpoints.allSatisfy({ !$0.host.isEmpty }) else {
            throw RedisError(.invalidConfiguration, "no host in \(url)")
        }
        self.init(endpoints: endpoints)
        self.username = username
        self.password = password
        self.database = database
        if scheme == "rediss" { self.tls = RedisTLS() }
    }

    private static func percentDecoded(_ text: String) -> String {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%"), let high = iterator.next(), let low = iterator.next(),
               let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16) {
                bytes.append(value)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    func validate() throws {
        guard !endpoints.isEmpty else { throw RedisError(.invalidConfiguration, "no endpoint") }
        guard pool.minimumConnections >= 0, pool.maximumConnections >= 1,
              pool.minimumConnections <= pool.maximumConnections
        else { throw RedisError(.invalidConfiguration, "pool: need 0 ≤ minimum ≤ maximum, maximum ≥ 1") }
        guard connectTimeout > .zero, commandTimeout > .zero else {
            throw RedisError(.invalidConfiguration, "timeouts must be positive")
        }
        guard pool.healthCheckInterval >= .milliseconds(1), pool.idleTimeout >= .zero else {
            throw RedisError(.invalidConfiguration, "pool: the health check interval must be at least 1 ms, the idle timeout not negative")
        }
        guard reconnect.initial > .zero, reconnect.maximum >= reconnect.initial, reconnect.multiplier >= 1,
              reconnect.multiplier.isFinite, reconnect.jitter >= 0, reconnect.jitter <= 1 else {
            throw RedisError(.invalidConfiguration, "reconnect: need 0 < initial ≤ maximum, a finite multiplier ≥ 1, 0 ≤ jitter ≤ 1")
        }
        guard breaker.loadingHold >= .zero else {
            throw RedisError(.invalidConfiguration, "breaker.loadingHold must not be negative")
        }
        guard breaker.failureThreshold >= 1 else {
            throw RedisError(.invalidConfiguration, "breaker.failureThreshold must be at least 1")
        }
        guard database >= 0 else { throw RedisError(.invalidConfiguration, "negative database") }
    }
}

extension RedisConfiguration {
    /// The TLS context for ``tls`` (nil without TLS); a bad TLS setting is ``RedisError/Code/invalidConfiguration``,
    /// and so is any TLS setting when MagpieRedis was built without its `TLS` trait.
    func makeSSLContext() throws(RedisError) -> TLSContext? {
        #if TLS
        do {
            return try tls.map { try NIOSSLContext(configuration: $0.configuration) }
        } catch {
            throw RedisError(.invalidConfiguration, "TLS configuration: \(error)")
        }
        #else
        guard tls == nil else {
            throw RedisError(
                .invalidConfiguration,
                "TLS was asked for (a rediss:// URL or a tls setting), but MagpieRedis was built without its TLS trait")
        }
        return nil
        #endif
    }
}

#if TLS
/// The context TLS connections share: swift-nio-ssl's.
typealias TLSContext = NIOSSLContext

/// TLS settings: certificate verification is on unless the configuration says otherwise.
public struct RedisTLS: Sendable {
    /// swift-nio-ssl's client configuration (default: the system's trust roots, full verification).
    public var configuration: TLSConfiguration
    /// The name the server's certificate must carry (and the SNI sent). nil: the endpoint's host when it is
    /// a name; for an IP address, the certificate must carry that IP address.
    public var serverHostname: String?

    public init(configuration: TLSConfiguration = .makeClientConfiguration(), serverHostname: String? = nil) {
        self.configuration = configuration
        self.serverHostname = serverHostname
    }

    /// Trust exactly the CA certificate(s) in a PEM file (full verification).
    public static func trusting(caFile: String, serverHostname: String? = nil) throws -> RedisTLS {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(caFile))
        return RedisTLS(configuration: configuration, serverHostname: serverHostname)
    }
}
#else
/// Without the TLS trait there is no TLS context: this type has no values.
enum TLSContext: Sendable {}

/// TLS settings. MagpieRedis was built without its `TLS` trait (and so without swift-nio-ssl): a
/// configuration that asks for TLS is refused with ``RedisError/Code/invalidConfiguration`` when a client
/// is made from it, never connected in plain text.
public struct RedisTLS: Sendable {
    /// The name the server's certificate must carry (and the SNI sent).
    public var serverHostname: String?

    public init(serverHostname: String? = nil) {
        self.serverHostname = serverHostname
    }
}
#endif
