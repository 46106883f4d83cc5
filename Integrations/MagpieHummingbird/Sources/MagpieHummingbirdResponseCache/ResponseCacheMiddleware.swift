import HTTPTypes
import Hummingbird
import Magpie
import MagpieHTTPCache
import NIOCore
import Synchronization

/// Hummingbird's middleware for the HTTP response cache: whole responses cached by HTTP's rules (RFC
/// 9111, RFC 5861) in a Magpie cache. The rules are ``HTTPResponseCache``'s; this only converts
/// Hummingbird's requests and responses.
///
/// ```swift
/// let responses = HTTPResponseCache(cache: cache, policy: HTTPResponseCachePolicy(failSafe: .seconds(600)))
/// let refresher = ResponseCacheMiddleware<BasicRequestContext>.Refresher()
/// let router = Router()
/// router.group("products").add(middleware: ResponseCacheMiddleware(responses, refresher: refresher)).get(":id") { ... }
/// refresher.use(router.buildResponder())  // stale-while-revalidate refreshes in the background
/// let app = Application(router: router)
/// ```
///
/// Hummingbird's `next` cannot outlive the request. Without a ``Refresher``, a response within its
/// `stale-while-revalidate` window is refreshed by the one request that found it stale (it waits for
/// the handler) while every other request gets the stale response at once. With one, given the router's
/// responder, the refresh runs that responder in the background (the middleware lets the refresh through
/// to the handler) and every request gets the stale response at once.
public struct ResponseCacheMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The cache's rules and storage.
    public let cache: HTTPResponseCache
    /// Runs background refreshes, once given the router's responder.
    public let refresher: Refresher?

    /// The middleware over `cache`; `refresher`, once given the router's responder (after every route
    /// is added), refreshes stale responses in the background.
    public init(_ cache: HTTPResponseCache, refresher: Refresher? = nil) {
        self.cache = cache
        self.refresher = refresher
    }

    /// Holds the responder background refreshes run (the router's, built after the middleware is added).
    public final class Refresher: Sendable {
        private let responder = Mutex<(any HTTPResponder<Context>)?>(nil)

        public init() {}

        /// Background refreshes run `responder` (the router's: `router.buildResponder()`).
        public func use(_ responder: some HTTPResponder<Context>) {
            self.responder.withLock { $0 = responder }
        }

        var current: (any HTTPResponder<Context>)? { responder.withLock { $0 } }
    }

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        if BackgroundRefresh.running { return try await next(request, context) }
        let limit = cache.policy.maximumBodySize
        let response = try await cache.respond(to: request.head, refresh: refreshHandler(context, limit: limit)) { head in
            var forwarded = request
            if head != request.head {
                forwarded = Request(head: head, body: request.body)
            }
            return try await HTTPCacheResponse(try await next(forwarded, context), collectingUpTo: limit)
        }
        return Response(response)
    }

    /// The router's responder as the cache's background handler (built only when the cache needs it).
    private func refreshHandler(_ context: Context, limit: Int) -> HTTPResponseCache.Handler? {
        guard let responder = refresher?.current else { return nil }
        return { head in
            // A GET's body is empty; the request's own may be gone by the time the refresh runs.
            let forwarded = Request(head: head, body: RequestBody(buffer: ByteBuffer()))
            let response = try await BackgroundRefresh.$running.withValue(true) {
                try await responder.respond(to: forwarded, context: context)
            }
            return try await HTTPCacheResponse(response, collectingUpTo: limit)
        }
    }
}

/// Set while a background refresh runs the router's responder: the middleware lets it through to the
/// handler.
enum BackgroundRefresh {
    @TaskLocal static var running = false
}

extension HTTPCacheResponse {
    /// Hummingbird's response as the cache sees it. A body whose length is known and at most `limit`
    /// (a `ByteBuffer` body, say: already in memory) is read into bytes; any other is a stream, recorded
    /// as it is sent.
    public init(_ response: Response, collectingUpTo limit: Int) async throws {
        let body = response.body
        if body.contentLength == 0 {
            self.init(head: response.head, body: .empty)
            return
        }
        if let length = body.contentLength, length <= limit {
            let collector = Collector()
            try await body.write(collector)
            self.init(head: response.head, body: .bytes(collector.bytes))
            return
        }
        self.init(
            head: response.head,
            body: .stream(contentLength: body.contentLength) { sink in
                try await body.write(SinkWriter(sink: sink))
            })
    }
}

extension Response {
    /// The cache's response as Hummingbird's.
    public init(_ response: HTTPCacheResponse) {
        let body = response.body
        if let bytes = body.bytes {
            self.init(status: response.head.status, headers: response.head.headerFields, body: ResponseBody(byteBuffer: ByteBuffer(bytes: bytes)))
            return
        }
        self.init(
            status: response.head.status, headers: response.head.headerFields,
            body: ResponseBody(contentLength: body.contentLength) { writer in
                try await body.write(to: WriterSink(writer: writer))
                try await writer.finish(nil)
            })
    }
}

/// Collects a body of known, bounded length.
private final class Collector: ResponseBodyWriter {
    var bytes: [UInt8] = []
    func write(_ buffer: ByteBuffer) async throws { bytes.append(contentsOf: buffer.readableBytesView) }
    func finish(_ trailingHeaders: HTTPFields?) async throws {}
}

/// Hummingbird's body writer as the cache's sink.
private final class WriterSink: HTTPCacheBodySink {
    var writer: any ResponseBodyWriter
    init(writer: any ResponseBodyWriter) { self.writer = writer }
    func write(_ chunk: ArraySlice<UInt8>) async throws {
        try await writer.write(ByteBuffer(bytes: chunk))
    }
}

/// The cache's sink as Hummingbird's body writer (trailing fields are dropped).
private struct SinkWriter: ResponseBodyWriter {
    let sink: any HTTPCacheBodySink
    mutating func write(_ buffer: ByteBuffer) async throws {
        try await sink.write(Array(buffer.readableBytesView)[...])
    }
    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}
