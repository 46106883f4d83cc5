import Magpie
import Logging
import NIOCore
import NIOPosix
#if TLS
import NIOSSL
#endif
import Synchronization

/// One connection to one node, after its `HELLO 3` handshake: many commands in flight, replies in order.
///
/// Callers on any thread send through the channel's event loop (no hop when already on it). Server error
/// replies to ``send(_:timeout:)`` are thrown as ``RedisError`` with ``RedisError/Code/server``; a batch
/// returns them as values.
public final class RedisConnection: Sendable {
    /// The node this connection talks to.
    public let endpoint: RedisEndpoint
    /// The server's id for this connection (`HELLO`'s `id`; the target of `CLIENT TRACKING … REDIRECT`).
    public let clientID: Int64
    /// The server's version string (`HELLO`'s `version`).
    public let serverVersion: String
    let channel: any Channel
    let handler: NIOLoopBound<RedisCommandHandler>
    let counters: ConnectionCounters
    /// What callers off the event loop submitted and the loop has not written yet.
    let submissions: SubmissionQueue

    private init(endpoint: RedisEndpoint, clientID: Int64, serverVersion: String, channel: any Channel,
                 handler: NIOLoopBound<RedisCommandHandler>, counters: ConnectionCounters, submissions: SubmissionQueue) {
        self.endpoint = endpoint
        self.clientID = clientID
        self.serverVersion = serverVersion
        self.channel = channel
        self.handler = handler
        self.counters = counters
        self.submissions = submissions
    }

    /// The event loop the connection lives on.
    public var eventLoop: any EventLoop { channel.eventLoop }

    /// Whether the connection is open (it may still fail at any moment).
    public var isActive: Bool { channel.isActive }

    /// Commands sent whose replies have not arrived.
    public var inFlight: Int { counters.inFlight.load(ordering: .relaxed) }

    /// Sends one command and waits for its reply (at most `timeout`; then the connection is closed).
    nonisolated(nonsending)
    public func send(_ command: RedisCommand, timeout: Duration) async throws -> RESPValue {
        try await send(command, timeout: timeout, reserved: false)
    }

    /// `reserved`: the pool already counted this command in flight when it picked the connection.
    nonisolated(nonsending)
    func send(_ command: RedisCommand, timeout: Duration, reserved: Bool, stages: CommandStages? = nil) async throws -> RESPValue {
        let value = try await sendRaw(command.encoded, timeout: timeout, reserved: reserved, stages: stages)
        switch value {
        case .simpleError(let message), .bulkError(let message):
            throw RedisError.server(RedisServerError(message), endpoint: endpoint)
        default:
            return value
        }
    }

    /// Sends one encoded command; the reply as it came (error replies included).
    nonisolated(nonsending)
    func sendRaw(_ encoded: ByteBuffer, timeout: Duration, reserved: Bool = false, stages: CommandStages? = nil) async throws -> RESPValue {
        if !reserved { counters.inFlight.add(1, ordering: .relaxed) }
        counters.sent.add(1, ordering: .relaxed)
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        defer { ThreadSanitizerHandOff.received() }
        return try await withUnsafeThrowingContinuation { continuation in
            submit(.command(encoded, continuation, deadline, stages))
        }
    }

    /// Hands `submission` to the event loop: written at once when called on the loop (after anything
    /// submitted before it), else queued for the loop's next drain (``SubmissionQueue``).
    private func submit(_ submission: Submission, inline: Bool = true) {
        let eventLoop = channel.eventLoop
        if inline, eventLoop.inEventLoop {
            let handler = self.handler.value
            handler.write(submissions.take())
            handler.enqueue(submission, flush: true)
            return
        }
        guard submissions.append(submission) else { return }
        let handler = self.handler
        let submissions = self.submissions
        eventLoop.execute { handler.value.write(submissions.take()) }
    }

    /// Sends commands back to back in one write and waits for all their replies (error replies are values
    /// here: a batch reports each command's outcome).
    nonisolated(nonsending)
    public func send(batch commands: [RedisCommand], timeout: Duration) async throws -> [RESPValue] {
        try await sendRaw(batch: commands.map(\.encoded), timeout: timeout)
    }

    nonisolated(nonsending)
    func sendRaw(batch encoded: [ByteBuffer], timeout: Duration, reserved: Bool = false, stages: CommandStages? = nil) async throws -> [RESPValue] {
        guard !encoded.isEmpty else {
            if reserved { counters.inFlight.subtract(1, ordering: .relaxed) }
            return []
        }
        counters.inFlight.add(encoded.count - (reserved ? 1 : 0), ordering: .relaxed)
        counters.sent.add(UInt64(encoded.count), ordering: .relaxed)
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        let count = encoded.count
        var combined: ByteBuffer
        if count == 1 {
            combined = encoded[0]
        } else {
            combined = ByteBufferAllocator().buffer(capacity: encoded.reduce(0) { $0 + $1.readableBytes })
            for command in encoded { combined.writeImmutableBuffer(command) }
        }
        let commands = combined
        defer { ThreadSanitizerHandOff.received() }
        return try await withUnsafeThrowingContinuation { continuation in
            submit(.batch(commands, count: count, continuation, deadline, stages))
        }
    }

    /// Queues a subscription command (`SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE` or an `UN…` form) whose
    /// confirmations are pushes of kind `confirmation`, one per name. `continuation` (if any) resumes with
    /// `.null` once every name is confirmed, or with the error reply that refused the command.
    ///
    /// Always queued (``SubmissionQueue``), never written inline, so commands queued in one order (the
    /// subscriber queues them under its lock) are written in that order.
    func enqueueSubscription(_ command: String, names: [String], confirmation: String, timeout: Duration,
                             continuation: UnsafeContinuation<RESPValue, any Error>?) {
        counters.inFlight.add(1, ordering: .relaxed)
        counters.sent.add(1, ordering: .relaxed)
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        let encoded = RedisCommand(command, names.map { .string($0) }).encoded
        submit(.subscription(encoded, confirmation: confirmation, names: names, continuation, deadline), inline: false)
    }

    /// Closes the connection; what is in flight fails with `reason`.
    public func close(reason: String = "closed by the client") {
        let handler = self.handler
        let endpoint = self.endpoint
        channel.eventLoop.execute {
            handler.value.close(with: RedisError(.shutDown, reason, endpoint: endpoint))
        }
    }

    /// Closes the connection once no reply is outstanding (at once if none is): for a connection taken
    /// out of use, so that nothing already sent on it fails.
    func closeWhenIdle() {
        let handler = self.handler
        channel.eventLoop.execute { handler.value.closeWhenIdle() }
    }

    /// Completes when the channel has closed.
    public var closeFuture: EventLoopFuture<Void> { channel.closeFuture }

    // MARK: Connecting

    /// Connects, runs TLS if configured, and handshakes: `HELLO 3 [AUTH user password] [SETNAME name]`,
    /// then `SELECT` for a database other than 0. Everything within `configuration.connectTimeout`.
    ///
    /// - Parameters:
    ///   - onPush: called on the event loop for each push frame.
    ///   - onClose: called once, on the event loop, when the connection dies (nil: closed by the client).
    static func connect(
        to endpoint: RedisEndpoint,
        configuration: RedisConfiguration,
        sslContext: TLSContext?,
        eventLoop: any EventLoop,
        logger: Logger,
        onPush: (@Sendable (RESPValue) -> Void)? = nil,
        onClose: (@Sendable (RedisError?) -> Void)? = nil
    ) async throws -> RedisConnection {
        let counters = ConnectionCounters()
        let submissions = SubmissionQueue()
        // The handler, handed out by the channel initializer (a TLS failure may tear the pipeline down
        // before a lookup could find it; its recorded failure then fails the handshake's first command).
        let slot = HandlerSlot()
        let limits = configuration.decoderLimits
        let sniHostname: String? = {
            if let name = configuration.tls?.serverHostname { return name }
            let isIP = (try? SocketAddress(ipAddress: endpoint.host, port: 0)) != nil
            return isIP ? nil : endpoint.host
        }()
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(configuration.connectTimeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let sslContext {
                        #if TLS
                        try sync.addHandler(NIOSSLClientHandler(context: sslContext, serverHostname: sniHostname))
                        #else
                        switch sslContext {}  // no value exists without the TLS trait
                        #endif
                    }
                    let handler = RedisCommandHandler(endpoint: endpoint, counters: counters, limits: limits)
                    slot.handler.withLock { $0 = NIOLoopBound(handler, eventLoop: channel.eventLoop) }
                    if let onPush { handler.onPush = { onPush($0) } }
                    if let onClose { handler.onClose = { onClose($0) } }
                    try sync.addHandler(handler)
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            throw RedisCommandHandler.classify(error, endpoint: endpoint, otherwise: .connectFailed)
        }
        do {
            guard let handler = slot.handler.withLock({ $0 }) else {
                throw RedisError(.connectFailed, "the channel has no command handler", endpoint: endpoint)
            }
            var arguments: [RedisArgument] = ["3"]
            if let password = configuration.password {
                arguments += ["AUTH", .string(configuration.username ?? "default"), .string(password)]
            }
            if let name = configuration.clientName { arguments += ["SETNAME", .string(name)] }
            let probe = RedisConnection(endpoint: endpoint, clientID: 0, serverVersion: "", channel: channel,
                                        handler: handler, counters: counters, submissions: submissions)
            let hello: RESPValue
            do {
                hello = try await probe.send(RedisCommand("HELLO", arguments), timeout: configuration.connectTimeout)
            } catch let error as RedisError where error.code == .server {
                switch error.serverError?.kind {
                case .wrongPass?, .noAuth?, .noPerm?:
                    throw RedisError(.authenticationFailed, error.message, endpoint: endpoint, serverError: error.serverError)
                default:
                    if error.message.hasPrefix("NOPROTO") || error.message.contains("unknown command") {
                        throw RedisError(.protocolViolation, "the server does not speak RESP3 (HELLO 3): \(error.message)", endpoint: endpoint, serverError: error.serverError)
                    }
                    throw error
                }
            } catch let error as RedisError where error.code == .timedOut {
                throw RedisError(.connectFailed, "no HELLO reply within the connect timeout", endpoint: endpoint)
            }
            var clientID: Int64 = 0
            var version = ""
            if case .map(let pairs) = hello {
                for pair in pairs {
                    switch pair.key.string {
                    case "id": clientID = pair.value.integerValue ?? 0
                    case "version": version = pair.value.string ?? ""
                    default: break
                    }
                }
            }
            let connection = RedisConnection(endpoint: endpoint, clientID: clientID, serverVersion: version,
                                             channel: channel, handler: handler, counters: counters, submissions: submissions)
            if configuration.database != 0 {
                _ = try await connection.send(RedisCommand("SELECT", [.integer(Int64(configuration.database))]),
                                              timeout: configuration.connectTimeout)
            }
            logger.debug("redis connection open", metadata: ["endpoint": "\(endpoint)", "id": "\(clientID)"])
            return connection
        } catch {
            channel.close(promise: nil)
            throw error
        }
    }
}

/// One connect attempt. Its connection's close hook marks it dead under the owner's lock; the owner
/// checks the mark under the same lock before it adopts the connection, so a connection that died between
/// its handshake and its adoption is never adopted (its close was reported before anyone knew it).
final class ConnectionAttempt: Sendable {
    let died = Atomic<Bool>(false)
}

/// Carries the command handler out of the channel initializer.
private final class HandlerSlot: Sendable {
    let handler = RedisLock<NIOLoopBound<RedisCommandHandler>?>(nil)
}

extension TimeAmount {
    /// `duration` in nanoseconds, saturating at the bounds of Int64 (never a trap).
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else {
            self = .nanoseconds(seconds < 0 ? Int64.min : Int64.max)
            return
        }
        let (sum, overflowed) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        self = .nanoseconds(overflowed ? (whole < 0 ? Int64.min : Int64.max) : sum)
    }
}
