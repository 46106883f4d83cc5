/// An error reply from the server (`-ERR …`, `!…`), parsed into the kinds a client acts on.
///
/// ``code`` is the reply's first word (`ERR`, `MOVED`, `WRONGPASS`, …); ``message`` is the whole reply.
public struct RedisServerError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kinds of server error the client treats specially; everything else is ``generic``.
    public enum Kind: Sendable, Hashable {
        /// `ERR …` and any error prefix not listed here.
        case generic
        /// `MOVED <slot> <host>:<port>`: the slot lives on another node now.
        case moved(slot: UInt16, to: RedisEndpoint)
        /// `ASK <slot> <host>:<port>`: the slot is migrating; ask that node once, after `ASKING`.
        case ask(slot: UInt16, to: RedisEndpoint)
        /// `TRYAGAIN`: a multi-key command during a slot migration; retry later.
        case tryAgain
        /// `LOADING`: the server is loading its data set.
        case loading
        /// `NOAUTH`: authentication required.
        case noAuth
        /// `WRONGPASS`: wrong user name or password.
        case wrongPass
        /// `NOPERM`: the ACL user may not run this command or touch this key.
        case noPerm
        /// `WRONGTYPE`: the key holds another type of value.
        case wrongType
        /// `READONLY`: a write sent to a replica.
        case readOnly
        /// `CLUSTERDOWN`: the cluster cannot serve the slot now.
        case clusterDown
        /// `CROSSSLOT`: the keys of one command hash to different slots.
        case crossSlot
        /// `BUSY`: a script is running.
        case busy
        /// `NOSCRIPT`
        case noScript
        /// `OOM`: the server is over `maxmemory` and cannot evict.
        case outOfMemory
        /// `MASTERDOWN`
        case masterDown
    }

    /// What kind of error this is.
    public let kind: Kind
    /// The reply's first word, upper case as sent (`ERR`, `MOVED`, …).
    public let code: Substring
    /// The whole error reply.
    public let message: String

    /// Parses an error reply's text (without the leading `-` or the `!<length>` header).
    public init(_ message: String) {
        self.message = message
        let code = message.prefix { $0 != " " }
        self.code = code
        self.kind = Self.kind(code: code, message: message)
    }

    public var description: String { message }

    private static func kind(code: Substring, message: String) -> Kind {
        switch code {
        case "MOVED", "ASK":
            // "MOVED 3999 127.0.0.1:6381" (the host may be empty: "MOVED 3999 :6381" means the same host)
            let parts = message.split(separator: " ", omittingEmptySubsequences: true)
            guard parts.count == 3, let slot = UInt16(parts[1]), slot < 16384,
                  let endpoint = RedisEndpoint(hostAndPort: parts[2])
            else { return .generic }
            return code == "MOVED" ? .moved(slot: slot, to: endpoint) : .ask(slot: slot, to: endpoint)
        case "TRYAGAIN": return .tryAgain
        case "LOADING": return .loading
        case "NOAUTH": return .noAuth
        case "WRONGPASS": return .wrongPass
        case "NOPERM": return .noPerm
        case "WRONGTYPE": return .wrongType
        case "READONLY": return .readOnly
        case "CLUSTERDOWN": return .clusterDown
        case "CROSSSLOT": return .crossSlot
        case "BUSY": return .busy
        case "NOSCRIPT": return .noScript
        case "OOM": return .outOfMemory
        case "MASTERDOWN": return .masterDown
        default: return .generic
        }
    }
}

/// An error thrown by the Redis client.
///
/// ``code`` says what went wrong; ``message`` is for people; ``endpoint`` names the node when one is
/// involved; ``serverError`` carries the server's reply for ``Code/server``.
public struct RedisError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: Sendable, Hashable {
            case server, timedOut, connectionClosed, circuitOpen, protocolViolation, connectFailed
            case authenticationFailed, tlsFailure, tooManyRedirections, shutDown, unexpectedReply
            case invalidConfiguration, subscriptionLost
        }

        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The server replied with an error (see ``RedisError/serverError``).
        public static let server = Code(.server)
        /// No reply within the command's deadline. The connection it was sent on was closed (a late
        /// reply is never handed to another caller); the command may or may not have run.
        public static let timedOut = Code(.timedOut)
        /// The connection closed (or failed) before the reply arrived; the command may or may not have run.
        public static let connectionClosed = Code(.connectionClosed)
        /// The node's circuit breaker is open: the call failed at once, without touching the network.
        public static let circuitOpen = Code(.circuitOpen)
        /// The server sent bytes that are not RESP, or exceed the decoder's limits. The connection was closed.
        public static let protocolViolation = Code(.protocolViolation)
        /// A connection could not be made (refused, unreachable, or the connect timeout passed).
        public static let connectFailed = Code(.connectFailed)
        /// `HELLO … AUTH` was refused (wrong user or password, or authentication required and not given).
        public static let authenticationFailed = Code(.authenticationFailed)
        /// The TLS handshake failed (for example: the server's certificate did not verify).
        public static let tlsFailure = Code(.tlsFailure)
        /// A cluster command was redirected (MOVED, ASK, TRYAGAIN) more times than allowed.
        public static let tooManyRedirections = Code(.tooManyRedirections)
        /// The client was shut down.
        public static let shutDown = Code(.shutDown)
        /// The reply had a type the command cannot produce.
        public static let unexpectedReply = Code(.unexpectedReply)
        /// A configuration value (or URL) is invalid.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// A subscription's connection was lost; messages sent meanwhile may have been missed.
        public static let subscriptionLost = Code(.subscriptionLost)

        public var description: String { "\(kind)" }
    }

    public let code: Code
    public let message: String
    public let endpoint: RedisEndpoint?
    /// The server's error reply, for ``Code/server`` (and ``Code/authenticationFailed``).
    public let serverError: RedisServerError?
    /// The command was never written (its connection had been retired): the pool sends it again on
    /// another connection.
    var notSent = false

    public init(_ code: Code, _ message: String, endpoint: RedisEndpoint? = nil, serverError: RedisServerError? = nil) {
        self.code = code
        self.message = message
        self.endpoint = endpoint
        self.serverError = serverError
    }

    /// A server error reply as a thrown error.
    public static func server(_ error: RedisServerError, endpoint: RedisEndpoint? = nil) -> RedisError {
        RedisError(.server, error.message, endpoint: endpoint, serverError: error)
    }

    public var description: String {
        if let endpoint { return "\(code): \(message) (\(endpoint))" }
        return "\(code): \(message)"
    }
}
