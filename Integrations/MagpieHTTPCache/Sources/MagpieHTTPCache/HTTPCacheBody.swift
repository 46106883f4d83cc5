import HTTPTypes

/// Where a streamed body's chunks go: the framework's response writer, or the cache's recorder in front
/// of it. One task writes to a sink, in order.
public protocol HTTPCacheBodySink {
    /// Writes one chunk of the body.
    func write(_ chunk: ArraySlice<UInt8>) async throws
}

/// A response body as the cache sees it: bytes already in memory, or a stream written chunk by chunk.
///
/// A framework's middleware turns its own body into one (a buffer into ``bytes(_:)``, anything else into
/// ``stream(contentLength:_:)``) and back. A streamed body the cache may store is recorded as it is sent:
/// each chunk goes to the client as it comes and is copied aside, up to the policy's
/// ``HTTPResponseCachePolicy/maximumBodySize``; past it the recording stops and the rest goes through
/// untouched, so the cache never holds more than that of one response.
public struct HTTPCacheBody: Sendable {
    enum Storage: Sendable {
        case bytes([UInt8])
        case stream(Int?, @Sendable (any HTTPCacheBodySink) async throws -> Void)
    }

    let storage: Storage

    /// A body already in memory.
    public static func bytes(_ bytes: [UInt8]) -> HTTPCacheBody { HTTPCacheBody(storage: .bytes(bytes)) }

    /// An empty body.
    public static var empty: HTTPCacheBody { .bytes([]) }

    /// A body written chunk by chunk by `write` (called at most once, by the framework that sends it);
    /// `contentLength` when it is known in advance.
    public static func stream(
        contentLength: Int? = nil, _ write: @escaping @Sendable (any HTTPCacheBodySink) async throws -> Void
    ) -> HTTPCacheBody {
        HTTPCacheBody(storage: .stream(contentLength, write))
    }

    /// The body's length when known before it is sent.
    public var contentLength: Int? {
        switch storage {
        case .bytes(let bytes): bytes.count
        case .stream(let length, _): length
        }
    }

    /// The bytes of a body held in memory; nil for a stream.
    public var bytes: [UInt8]? {
        if case .bytes(let bytes) = storage { return bytes }
        return nil
    }

    /// Writes the whole body to `sink`: the bytes in one chunk (none when empty), or the stream's chunks.
    public func write(to sink: any HTTPCacheBodySink) async throws {
        switch storage {
        case .bytes(let bytes):
            if !bytes.isEmpty { try await sink.write(bytes[...]) }
        case .stream(_, let write):
            try await write(sink)
        }
    }
}

/// A response to send: its head and its body.
public struct HTTPCacheResponse: Sendable {
    /// Status and header fields.
    public var head: HTTPResponse
    /// The body.
    public var body: HTTPCacheBody

    /// A response with `head` and `body`.
    public init(head: HTTPResponse, body: HTTPCacheBody = .empty) {
        self.head = head
        self.body = body
    }
}
