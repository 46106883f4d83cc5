import NIOCore
import NIOPosix
import Synchronization

@testable import MagpieRedis

/// A scripted TCP server on 127.0.0.1 for what a real Redis never sends: truncated or malformed replies,
/// replies that never come, connections closed mid-command.
///
/// Every command a client sends (a RESP array of bulk strings, or an inline command line) is decoded
/// here — by a parser of its own, independent of the client's decoder — and handed to the handler with a
/// ``FakeReply`` to answer on. `HELLO` is answered with a minimal RESP3 map (`%1 server fake`) unless the
/// handler answers it (or calls ``FakeReply/hold()``).
///
/// ```swift
/// let server = try await FakeRedisServer.start { command, reply in
///     if command.first == "GET" { reply.send("$3\r\nbar\r\n") }  // anything else: no answer, ever
/// }
/// defer { Task { await server.stop() } }
/// ```
final class FakeRedisServer: Sendable {
    /// Called on the connection's event loop, once per command, in order.
    typealias Handler = @Sendable (_ command: [String], _ reply: FakeReply) -> Void

    /// The port it listens on (127.0.0.1).
    let port: Int
    private let listener: any Channel
    private let tracker: ConnectionTracker

    private init(port: Int, listener: any Channel, tracker: ConnectionTracker) {
        self.port = port
        self.listener = listener
        self.tracker = tracker
    }

    /// Starts listening on a free port of 127.0.0.1.
    static func start(handler: @escaping Handler) async throws -> FakeRedisServer {
        let tracker = ConnectionTracker()
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                let connection = tracker.accept(channel)
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        FakeRedisConnectionHandler(connection: connection, handler: handler, tracker: tracker))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = listener.localAddress?.port else {
            try? await listener.close()
            throw FakeRedisServerError(message: "the listening socket has no port")
        }
        return FakeRedisServer(port: port, listener: listener, tracker: tracker)
    }

    /// Connections accepted so far.
    var acceptedConnections: Int { tracker.state.withLock { $0.accepted } }

    /// Connections open now.
    var openConnections: Int { tracker.state.withLock { $0.open.count } }

    /// Every command received so far, in order of arrival.
    var receivedCommands: [[String]] { tracker.state.withLock { $0.commands } }

    /// Closes every open connection, and keeps listening.
    func dropConnections() async {
        let channels = tracker.state.withLock { Array($0.open.values) }
        for channel in channels { try? await channel.close() }
    }

    /// Stops listening and closes every connection.
    func stop() async {
        try? await listener.close()
        await dropConnections()
    }
}

/// The connections and commands of one server, shared by the server and its channels.
private final class ConnectionTracker: Sendable {
    struct State {
        var accepted = 0
        var open: [Int: any Channel] = [:]
        var commands: [[String]] = []
    }

    let state = RedisLock(State())

    /// Counts the connection and tracks it until it closes; its number (0, 1, ...).
    func accept(_ channel: any Channel) -> Int {
        let number = state.withLock { state -> Int in
            defer { state.accepted += 1 }
            state.open[state.accepted] = channel
            return state.accepted
        }
        channel.closeFuture.whenComplete { _ in
            _ = self.state.withLock { $0.open.removeValue(forKey: number) }
        }
        return number
    }

    func record(_ command: [String]) {
        state.withLock { $0.commands.append(command) }
    }
}

/// What the fake server failed at.
struct FakeRedisServerError: Error, CustomStringConvertible {
    var message: String
    var description: String { "FakeRedisServer: \(message)" }
}

/// Starts a ``FakeRedisServer``, runs `body` with it, and stops it, whether `body` returns or throws.
func withFakeRedisServer<T>(
    isolation: isolated (any Actor)? = #isolation, handler: @escaping FakeRedisServer.Handler,
    _ body: (FakeRedisServer) async throws -> T
) async throws -> T {
    let server = try await FakeRedisServer.start(handler: handler)
    do {
        let result = try await body(server)
        await server.stop()
        return result
    } catch {
        await server.stop()
        throw error
    }
}

/// The way back to the client for one command. Keep it to answer later, from any thread, or drop it
/// to never answer.
struct FakeReply: Sendable {
    /// Which accepted connection the command came on (0 for the first).
    let connection: Int
    private let channel: any Channel
    private let used: Used

    fileprivate final class Used: Sendable {
        let flag = Atomic(false)
    }

    fileprivate init(connection: Int, channel: any Channel) {
        self.connection = connection
        self.channel = channel
        self.used = Used()
    }

    /// Whether the handler sent, closed or held (so the default HELLO answer stays out).
    fileprivate var wasUsed: Bool { used.flag.load(ordering: .relaxed) }

    /// Writes raw bytes to the client.
    func send(_ bytes: [UInt8]) {
        used.flag.store(true, ordering: .relaxed)
        channel.writeAndFlush(ByteBuffer(bytes: bytes), promise: nil)
    }

    /// Writes text (RESP, `\r\n` included) to the client.
    func send(_ text: String) {
        send(Array(text.utf8))
    }

    /// Closes the connection.
    func close() {
        used.flag.store(true, ordering: .relaxed)
        channel.close(promise: nil)
    }

    /// Answers nothing now, but counts as handled: `HELLO` gets no default answer.
    func hold() {
        used.flag.store(true, ordering: .relaxed)
    }
}

/// Decodes commands from one connection and hands them to the handler, on the channel's event loop.
private final class FakeRedisConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let connection: Int
    private let handler: FakeRedisServer.Handler
    private let tracker: ConnectionTracker
    private var buffer = ByteBuffer()

    init(connection: Int, handler: @escaping FakeRedisServer.Handler, tracker: ConnectionTracker) {
        self.connection = connection
        self.handler = handler
        self.tracker = tracker
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        buffer.writeBuffer(&incoming)
        do {
            while let command = try FakeRESPParser.next(from: &buffer) {
                guard !command.isEmpty else { continue }  // an empty inline line
                tracker.record(command)
                let reply = FakeReply(connection: connection, channel: context.channel)
                handler(command, reply)
                if command[0].uppercased() == "HELLO" && !reply.wasUsed {
                    context.writeAndFlush(
                        wrapOutboundOut(ByteBuffer(string: "%1\r\n+server\r\n+fake\r\n")), promise: nil)
                }
            }
            buffer.discardReadBytes()
        } catch {
            context.close(promise: nil)
        }
    }
}

/// The fake server's own RESP request parser: arrays of bulk strings, and inline commands (a line of
/// words), as a Redis server accepts them.
enum FakeRESPParser {
    struct Malformed: Error {}

    /// The next whole command at the front of `buffer` (consumed), or nil if more bytes are needed (then
    /// nothing is consumed).
    ///
    /// - Throws: ``Malformed`` on bytes no client sends.
    static func next(from buffer: inout ByteBuffer) throws -> [String]? {
        let start = buffer.readerIndex
        guard let first = buffer.getInteger(at: start, as: UInt8.self) else { return nil }
        if first != UInt8(ascii: "*") {
            guard let line = readLine(&buffer) else { return nil }
            return String(decoding: line, as: UTF8.self).split(separator: " ").map(String.init)
        }
        guard let command = try readArray(&buffer) else {
            buffer.moveReaderIndex(to: start)
            return nil
        }
        return command
    }

    private static func readArray(_ buffer: inout ByteBuffer) throws -> [String]? {
        guard let header = readLine(&buffer) else { return nil }
        guard let count = Int(String(decoding: header.dropFirst(), as: UTF8.self)), count >= 0, count < 1 << 20 else {
            throw Malformed()
        }
        var command: [String] = []
        command.reserveCapacity(count)
        for _ in 0..<count {
            guard let lengthLine = readLine(&buffer) else { return nil }
            guard lengthLine.first == UInt8(ascii: "$"),
                let length = Int(String(decoding: lengthLine.dropFirst(), as: UTF8.self)), length >= 0, length < 1 << 29
            else { throw Malformed() }
            guard buffer.readableBytes >= length + 2, let bytes = buffer.readBytes(length: length) else { return nil }
            guard buffer.readBytes(length: 2) == [13, 10] else { throw Malformed() }
            command.append(String(decoding: bytes, as: UTF8.self))
        }
        return command
    }

    /// A line without its `\r\n` (or `\n`), consumed; nil if no whole line is there.
    private static func readLine(_ buffer: inout ByteBuffer) -> [UInt8]? {
        let view = buffer.readableBytesView
        guard let newline = view.firstIndex(of: UInt8(ascii: "\n")) else { return nil }
        var line = Array(view[view.startIndex..<newline])
        if line.last == UInt8(ascii: "\r") { line.removeLast() }
        buffer.moveReaderIndex(forwardBy: newline - view.startIndex + 1)
        return line
    }
}
