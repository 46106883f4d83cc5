import Magpie
import NIOCore
#if TLS
import NIOSSL
#endif
import Synchronization

/// Where a reply goes. Each command written has exactly one sink in the handler's FIFO, in write order.
enum ReplySink {
    /// One caller waiting for one reply.
    case continuation(UnsafeContinuation<RESPValue, any Error>)
    /// Part `index` of a batch.
    case batch(BatchReplies, Int)
    /// A reply nobody waits for (`ASKING`'s `+OK`).
    case discard
    /// A subscription command (`SUBSCRIBE`, `UNSUBSCRIBE` and the pattern and shard forms): under RESP3
    /// it is answered by one push per name, or refused by one error reply.
    case subscription(SubscriptionReplies)
}

/// The confirmations a subscription command waits for. Its caller (if any) resumes with `.null` once the
/// server confirmed every name, or with the error reply that refused the command.
final class SubscriptionReplies {
    /// The push kind that confirms: `subscribe`, `psubscribe`, `ssubscribe`, `unsubscribe`, ….
    let kind: String
    /// Names not yet confirmed (a name given twice is confirmed twice).
    private(set) var remaining: [String]
    private var continuation: UnsafeContinuation<RESPValue, any Error>?

    init(kind: String, names: [String], continuation: UnsafeContinuation<RESPValue, any Error>?) {
        self.kind = kind
        self.remaining = names
        self.continuation = continuation
    }

    /// Counts `push` if it confirms one of the names; returns whether it did.
    func confirm(_ push: [RESPValue]) -> Bool {
        guard push.count >= 2, push[0].string == kind, let name = push[1].string,
              let index = remaining.firstIndex(of: name) else { return false }
        remaining.remove(at: index)
        return true
    }

    func resume(with value: RESPValue) {
        guard let continuation else { return }
        self.continuation = nil
        continuation.resume(returning: value)
    }

    func fail(_ error: RedisError) {
        guard let continuation else { return }
        self.continuation = nil
        continuation.resume(throwing: error)
    }
}

/// The replies of one batch, delivered together once the last one arrives (or the first failure).
final class BatchReplies {
    var results: [RESPValue]
    var remaining: Int
    private var continuation: UnsafeContinuation<[RESPValue], any Error>?

    init(count: Int, continuation: UnsafeContinuation<[RESPValue], any Error>) {
        results = Array(repeating: .null, count: count)
        remaining = count
        self.continuation = continuation
    }

    func deliver(_ value: RESPValue, at index: Int) {
        results[index] = value
        remaining -= 1
        if remaining == 0, let continuation {
            self.continuation = nil
            continuation.resume(returning: results)
        }
    }

    func fail(_ error: RedisError) {
        guard let continuation else { return }
        self.continuation = nil
        continuation.resume(throwing: error)
    }
}

/// Counters a connection shares between its event loop and the pool's callers.
final class ConnectionCounters: Sendable {
    /// Commands written whose reply has not arrived (or failed).
    let inFlight = Atomic<Int>(0)
    /// Commands ever sent (the pool's health check reads it to tell an idle connection).
    let sent = Atomic<UInt64>(0)
}

/// The pipeline's last handler: writes commands, matches replies to callers in FIFO order, routes push
/// frames, and enforces deadlines.
///
/// Invariants (all state is touched on the channel's event loop only):
/// - `pending` holds one entry per command written and not yet answered, in write order; a reply (any
///   value that is not a push) answers `pending.first`. A reply with nothing pending is a protocol
///   violation: the connection closes. A subscription command at the head is answered by the pushes
///   that confirm its names (they are still routed as pushes), or by an error reply.
/// - Once `failure` is set the connection is dead: every pending sink was failed, every later enqueue fails
///   at once, and the channel is closing. A late reply can therefore never reach another caller.
/// - A command whose deadline passes closes the connection (its reply, if it ever comes, is not read).
final class RedisCommandHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private struct Pending {
        var sink: ReplySink
        var deadline: NIODeadline
        /// Where the reply's instant goes (a batch's: on its last command only, whose reply resumes it).
        var stages: CommandStages? = nil
    }

    let endpoint: RedisEndpoint
    let counters: ConnectionCounters
    /// Called on the event loop for every push frame (`>`): invalidations, pub/sub messages.
    var onPush: ((RESPValue) -> Void)?
    /// Called once, on the event loop, when the connection dies, with the reason (nil: closed by us).
    var onClose: ((RedisError?) -> Void)?

    private var context: ChannelHandlerContext?
    private var pending = CircularBuffer<Pending>(initialCapacity: 16)
    private var flushScheduled = false
    private var timer: Scheduled<Void>?
    private var timerDeadline: NIODeadline = .distantFuture
    private(set) var failure: RedisError?
    private var closeReported = false
    /// Taken out of the pool: close once `pending` is empty.
    private var closingWhenIdle = false

    /// Bytes read and not yet decoded (nil when everything read was decoded: the next read's buffer is
    /// then used as it is, with no copy).
    private var received: ByteBuffer?
    private var decoder: RESPDecoder

    init(endpoint: RedisEndpoint, counters: ConnectionCounters, limits: RESPDecoderLimits) {
        self.endpoint = endpoint
        self.counters = counters
        self.decoder = RESPDecoder(limits: limits)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        fail(with: failure ?? RedisError(.connectionClosed, "connection closed", endpoint: endpoint))
        self.context = nil
    }

    // MARK: Writing

    /// Writes one command; its reply goes to `sink`. Flushed once per event-loop tick (`flush`), or by
    /// the caller.
    func enqueue(_ command: ByteBuffer, sink: ReplySink, deadline: NIODeadline, stages: CommandStages? = nil, flush: Bool = true) {
        guard let context, failure == nil else {
            // Uncounted before the caller resumes: a caller that sees its error also sees the count fall.
            counters.inFlight.subtract(1, ordering: .relaxed)
            Self.fail(sink, with: failure ?? RedisError(.connectionClosed, "connection closed", endpoint: endpoint))
            return
        }
        stages?.noteWritten()
        pending.append(Pending(sink: sink, deadline: deadline, stages: stages))
        context.write(wrapOutboundOut(command), promise: nil)
        if flush { scheduleFlush(context) }
        armTimer(deadline, context)
    }

    /// Writes a batch (its commands already concatenated, in order) as one write; the `count` replies are
    /// delivered together.
    func enqueue(
        batch commands: ByteBuffer, count: Int, replies: BatchReplies, deadline: NIODeadline, stages: CommandStages? = nil, flush: Bool = true
    ) {
        guard let context, failure == nil else {
            counters.inFlight.subtract(count, ordering: .relaxed)
            ThreadSanitizerHandOff.published()
            replies.fail(failure ?? RedisError(.connectionClosed, "connection closed", endpoint: endpoint))
            return
        }
        stages?.noteWritten()
        for index in 0..<count {
            pending.append(Pending(sink: .batch(replies, index), deadline: deadline, stages: index == count - 1 ? stages : nil))
        }
        context.write(wrapOutboundOut(commands), promise: nil)
        if flush { scheduleFlush(context) }
        armTimer(deadline, context)
    }

    /// Writes one submission, its reply objects made here on the loop. Flushed once per event-loop tick
    /// (`flush`), or by the caller.
    func enqueue(_ submission: Submission, flush: Bool) {
        switch submission {
        case .command(let command, let continuation, let deadline, let stages):
            enqueue(command, sink: .continuation(continuation), deadline: deadline, stages: stages, flush: flush)
        case .batch(let commands, let count, let continuation, let deadline, let stages):
            enqueue(batch: commands, count: count, replies: BatchReplies(count: count, continuation: continuation),
                    deadline: deadline, stages: stages, flush: flush)
        case .subscription(let command, let confirmation, let names, let continuation, let deadline):
            let replies = SubscriptionReplies(kind: confirmation, names: names, continuation: continuation)
            enqueue(command, sink: .subscription(replies), deadline: deadline, flush: flush)
        }
    }

    /// Writes what callers off the loop submitted (``SubmissionQueue``), in order, then flushes once.
    func write(_ submissions: [Submission]) {
        guard !submissions.isEmpty else { return }
        for submission in submissions { enqueue(submission, flush: false) }
        // Everything queued by now is written: flush at once rather than in a task of its own (a flush
        // already scheduled by a caller on the loop then finds little or nothing left).
        if failure == nil { context?.flush() }
    }

    /// Closes the connection, failing what is pending with `error`.
    func close(with error: RedisError) {
        guard let context else { return }
        fail(with: error)
        context.close(promise: nil)
    }

    /// Closes the connection as soon as no reply is outstanding.
    func closeWhenIdle() {
        closingWhenIdle = true
        closeIfRetiredAndIdle()
    }

    /// Retired, nothing pending, and nothing counted in flight (a command the pool reserved before it
    /// retired the connection is counted before it is enqueued): close.
    private func closeIfRetiredAndIdle() {
        if closingWhenIdle, pending.isEmpty, counters.inFlight.load(ordering: .relaxed) == 0 { close(with: retired) }
    }

    /// The failure of a connection closed idle. Nothing was pending when it closed, so it reaches only
    /// commands enqueued afterwards (by a caller that picked the connection just before the pool retired
    /// it): they were never written, and the pool sends them again elsewhere.
    private var retired: RedisError {
        var error = RedisError(.connectionClosed, "the connection was closed idle before the command was sent", endpoint: endpoint)
        error.notSent = true
        return error
    }

    private func scheduleFlush(_ context: ChannelHandlerContext) {
        guard !flushScheduled else { return }
        flushScheduled = true
        // Runs after every task already queued on the loop: commands enqueued in the same tick share it.
        context.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            self.context?.flush()
        }
    }

    // MARK: Reading

    /// Decodes what arrived (the decoder is incremental: a reply split over reads is never re-parsed
    /// from its start) and hands each value on. Decoding here rather than in a separate
    /// `ByteToMessageHandler` spares every reply a pipeline hop and a type-erased box.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // A failed connection reads nothing more (TLS may still deliver bytes while it shuts down).
        guard failure == nil else { return }
        var incoming = unwrapInboundIn(data)
        if received == nil {
            received = incoming
        } else {
            received!.writeBuffer(&incoming)
        }
        while failure == nil, received != nil {
            let value: RESPValue?
            do {
                value = try decoder.next(from: &received!)
            } catch {
                close(with: RedisError(.protocolViolation, "\(error)", endpoint: endpoint))
                return
            }
            guard let value else { break }
            if received!.readableBytes == 0 { received = nil }
            handle(value)
        }
        if let buffer = received, buffer.readerIndex > 65_536, buffer.readerIndex > buffer.readableBytes {
            received!.discardReadBytes()
        }
    }

    private func handle(_ value: RESPValue) {
        switch value {
        case .push(let items):
            if !confirmSubscription(items) { onPush?(value) }
            return
        case .attributed(_, let inner):
            if case .push(let items) = inner {
                if !confirmSubscription(items) { onPush?(inner) }
                return
            }
        default:
            break
        }
        guard let head = pending.popFirst() else {
            close(with: RedisError(.protocolViolation, "a reply arrived with no command waiting: \(value)", endpoint: endpoint))
            return
        }
        counters.inFlight.subtract(1, ordering: .relaxed)
        head.stages?.noteReplied()
        ThreadSanitizerHandOff.published()
        switch head.sink {
        case .continuation(let continuation): continuation.resume(returning: value)
        case .batch(let replies, let index): replies.deliver(value, at: index)
        case .discard: break
        case .subscription(let replies): replies.resume(with: value)  // refused (or a reply RESP3 never sends)
        }
        closeIfRetiredAndIdle()
    }

    /// A push that confirms the subscription command at the head of the queue counts toward it (and is
    /// not routed: the push handler sees only what the server sent on its own); the last confirmation
    /// answers the command. Returns whether `items` was such a confirmation.
    private func confirmSubscription(_ items: [RESPValue]) -> Bool {
        guard case .subscription(let replies)? = pending.first?.sink, replies.confirm(items) else { return false }
        if replies.remaining.isEmpty {
            pending.removeFirst()
            counters.inFlight.subtract(1, ordering: .relaxed)
            ThreadSanitizerHandOff.published()
            replies.resume(with: .null)
        }
        return true
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        close(with: Self.classify(error, endpoint: endpoint, otherwise: .connectionClosed))
    }

    /// A channel error as a ``RedisError``: TLS failures (swift-nio-ssl's and BoringSSL's errors, and the
    /// trust store's) are ``RedisError/Code/tlsFailure``; undecodable bytes ``RedisError/Code/protocolViolation``.
    static func classify(_ error: any Error, endpoint: RedisEndpoint, otherwise: RedisError.Code) -> RedisError {
        switch error {
        case let error as RedisError:
            return error
        case let error as RESPProtocolError:
            return RedisError(.protocolViolation, "\(error)", endpoint: endpoint)
        #if TLS
        case let error as NIOSSLError:
            return RedisError(.tlsFailure, "\(error)", endpoint: endpoint)
        #endif
        default:
            let typeName = String(reflecting: type(of: error))
            if typeName.contains("SSL") {
                return RedisError(.tlsFailure, "\(typeName): \(error)", endpoint: endpoint)
            }
            return RedisError(otherwise, "\(typeName): \(error)", endpoint: endpoint)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(with: failure ?? RedisError(.connectionClosed, "connection closed by the server", endpoint: endpoint))
        context.fireChannelInactive()
    }

    // MARK: Failure and deadlines

    private func fail(with error: RedisError) {
        if failure == nil { failure = error }
        timer?.cancel()
        timer = nil
        // Uncounted before any caller resumes (as everywhere here): a caller that sees its error also
        // sees the in-flight count without its command.
        if !pending.isEmpty { counters.inFlight.subtract(pending.count, ordering: .relaxed) }
        while let entry = pending.popFirst() {
            Self.fail(entry.sink, with: error)
        }
        if !closeReported {
            closeReported = true
            onClose?(error.code == .shutDown || error.notSent ? nil : error)
            onPush = nil
        }
    }

    private static func fail(_ sink: ReplySink, with error: RedisError) {
        ThreadSanitizerHandOff.published()
        switch sink {
        case .continuation(let continuation): continuation.resume(throwing: error)
        case .batch(let replies, _): replies.fail(error)
        case .discard: break
        case .subscription(let replies): replies.fail(error)
        }
    }

    private func armTimer(_ deadline: NIODeadline, _ context: ChannelHandlerContext) {
        guard timer == nil || deadline < timerDeadline else { return }
        timer?.cancel()
        timerDeadline = deadline
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.timerFired()
        }
    }

    private func timerFired() {
        timer = nil
        timerDeadline = .distantFuture
        guard let context, failure == nil, !pending.isEmpty else { return }
        let now = NIODeadline.now()
        var earliest = NIODeadline.distantFuture
        var expired = false
        for entry in pending {
            if entry.deadline <= now { expired = true }
            earliest = min(earliest, entry.deadline)
        }
        guard expired else {
            armTimer(earliest, context)
            return
        }
        // Fail the expired commands with timedOut, the others with connectionClosed, then close: the
        // connection is never reused after a reply went missing.
        let closed = RedisError(.connectionClosed, "connection closed after a command timed out", endpoint: endpoint)
        failure = closed
        let timedOut = RedisError(.timedOut, "no reply within the command timeout", endpoint: endpoint)
        counters.inFlight.subtract(pending.count, ordering: .relaxed)
        while let entry = pending.popFirst() {
            Self.fail(entry.sink, with: entry.deadline <= now ? timedOut : closed)
        }
        if !closeReported {
            closeReported = true
            onClose?(timedOut)
            onPush = nil
        }
        context.close(promise: nil)
    }
}
