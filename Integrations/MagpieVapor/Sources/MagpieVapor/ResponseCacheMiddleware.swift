import HTTPTypes
import Magpie
import MagpieHTTPCache
import NIOCore
import NIOHTTP1
import Vapor

/// Whole HTTP responses cached by HTTP's rules (RFC 9111, RFC 5861) in a Magpie cache: a Vapor
/// middleware over MagpieHTTPCache's ``MagpieHTTPCache/HTTPResponseCache``, which holds every rule; the
/// middleware only converts Vapor's request and response to and from swift-http-types.
///
/// ```swift
/// let responses = HTTPResponseCache(cache: cache, policy: HTTPResponseCachePolicy(defaultMaxAge: .seconds(30)))
/// app.grouped(MagpieResponseCacheMiddleware(responses)).get("products") { req in ... }
/// // or for every route: app.middleware.use(MagpieResponseCacheMiddleware(responses))
/// ```
///
/// - A hit never reaches the route; a miss runs it once for every concurrent request of its key (the
///   others wait for its response), and its response is stored when the rules allow.
/// - A stale response within `stale-while-revalidate` is served at once while one background request
///   refreshes it through the same chain (``backgroundRefresh``): a copy of the request (method, URL,
///   headers, route parameters, no body) runs the rest of the chain after the response was sent.
/// - Errors: a route that throws an `AbortError` below 500 (`Abort(.notFound)`, a `DecodingError`) has
///   answered, not failed: the middleware turns the error into the response Vapor's `ErrorMiddleware`
///   makes of it, which the rules then judge like any other. Any other error (a 5xx `Abort`, an error
///   that is no `AbortError`) is the origin failing: a stored response is served in its place when
///   `stale-if-error` or the policy's fail-safe allows, and otherwise the error goes on to your
///   `ErrorMiddleware` unchanged.
/// - Bodies: a buffered body is stored as it is. A body streamed through a `BodyStreamWriter`
///   (`Response.Body(stream:)`) is sent chunk by chunk as the route writes it and recorded aside up to
///   the policy's ``MagpieHTTPCache/HTTPResponseCachePolicy/maximumBodySize`` (past it, passed through
///   and not stored). Vapor keeps a stream's writer function internal, so the middleware reads it by
///   reflection. A body streamed through an `AsyncBodyStreamWriter` (`Response.Body(asyncStream:)`,
///   `managedAsyncStream:`, `req.fileio.asyncStreamFile`) is **passed through untouched and never
///   stored**: Swift's runtime cannot call an `async` function read by reflection (the cast succeeds
///   and the call crashes; seen with Swift 6.3), and the only public way to read such a body,
///   `collect(on:)`, holds it whole before sending. The same for any body laid out in a way the
///   middleware does not know (a later Vapor).
///
/// Put it after `ErrorMiddleware` (which Vapor installs first by default) and after the middleware
/// that must see every request (authentication, sessions): a hit returns from here.
public struct MagpieResponseCacheMiddleware: AsyncMiddleware {
    /// The rules and the cache the responses are kept in.
    public let responseCache: HTTPResponseCache
    /// Whether a stale response within `stale-while-revalidate` is refreshed in the background (every
    /// request, the one that triggers the refresh included, gets the stale response at once); false:
    /// one request waits for the refresh while the others get the stale response.
    public let backgroundRefresh: Bool

    /// A middleware answering from `responseCache`.
    /// - Parameters:
    ///   - responseCache: the rules, the policy and the Magpie cache; share one between routes.
    ///   - backgroundRefresh: refresh stale responses in the background (true by default).
    public init(_ responseCache: HTTPResponseCache, backgroundRefresh: Bool = true) {
        self.responseCache = responseCache
        self.backgroundRefresh = backgroundRefresh
    }

    public func respond(to request: Request, chainingTo next: any AsyncResponder) async throws -> Response {
        let head = Self.httpRequest(request)
        // The refresh is built only past a fresh hit (an autoclosure): a hit allocates no closure for it.
        let response = try await responseCache.respond(
            to: head, refresh: backgroundRefresh ? Self.refresh(request, chainingTo: next) : nil
        ) { origin in
            request.headers = Self.headers(origin.headerFields)
            return try await Self.run(next, request)
        }
        if response.body.contentLength == Self.passThroughLength, let original = request.storage[PassThroughKey.self] {
            return original
        }
        return Self.response(response)
    }

    /// The background refresh of `request`'s entry: the request has been answered by then, so a copy of
    /// it runs the chain again, its body empty (only GET requests are refreshed).
    static func refresh(_ request: Request, chainingTo next: any AsyncResponder) -> HTTPResponseCache.Handler {
        { origin in
            let copy = Request(
                application: request.application, method: request.method, url: request.url, version: request.version,
                headers: headers(origin.headerFields), collectedBody: nil, remoteAddress: request.remoteAddress,
                logger: request.logger, on: request.eventLoop)
            copy.parameters = request.parameters
            copy.route = request.route
            return try await run(next, copy)
        }
    }

    /// Runs the rest of the chain, an `AbortError` below 500 turned into Vapor's error response.
    static func run(_ next: any AsyncResponder, _ request: Request) async throws -> HTTPCacheResponse {
        let response: Response
        do {
            response = try await next.respond(to: request)
        } catch let error as any AbortError where error.status.code < 500 {
            response = try await ErrorMiddleware.default(environment: request.application.environment)
                .respond(to: request, chainingTo: Throwing(error: error)).get()
        }
        return cacheResponse(response, for: request)
    }

    /// A responder that throws `error`: fed to `ErrorMiddleware` to make its response.
    struct Throwing: Responder {
        let error: any Error
        func respond(to request: Request) -> EventLoopFuture<Response> { request.eventLoop.makeFailedFuture(error) }
    }

    // MARK: - Vapor to swift-http-types

    static func httpRequest(_ request: Request) -> HTTPRequest {
        var target = request.url.path.isEmpty ? "/" : request.url.path
        if let query = request.url.query { target += "?" + query }
        let method = HTTPRequest.Method(request.method.rawValue) ?? .get
        return HTTPRequest(
            method: method, scheme: request.url.scheme ?? "http", authority: request.headers.first(name: .host) ?? request.url.host,
            path: target, headerFields: fields(request.headers))
    }

    static func fields(_ headers: HTTPHeaders) -> HTTPFields {
        var fields = HTTPFields()
        fields.reserveCapacity(headers.count)
        for (name, value) in headers {
            guard let name = HTTPField.Name(name) else { continue }
            fields.append(HTTPField(name: name, value: value))
        }
        return fields
    }

    static func headers(_ fields: HTTPFields) -> HTTPHeaders {
        var headers = HTTPHeaders()
        headers.reserveCapacity(fields.count)
        for field in fields { headers.add(name: field.name.rawName, value: field.value) }
        return headers
    }

    static func cacheResponse(_ response: Response, for request: Request) -> HTTPCacheResponse {
        var fields = fields(response.headers)
        fields[.transferEncoding] = nil
        let head = HTTPResponse(status: HTTPResponse.Status(code: Int(response.status.code), reasonPhrase: response.status.reasonPhrase), headerFields: fields)
        if let buffer = response.body.buffer {
            return HTTPCacheResponse(head: head, body: .bytes(Array(buffer.readableBytesView)))
        }
        if response.body.count == 0 { return HTTPCacheResponse(head: head, body: .empty) }
        let length = response.body.count >= 0 ? response.body.count : nil
        guard let write = streamWriter(of: response.body) else {
            // Not a stream this middleware can read as it is sent: the rules see a body longer than
            // any they store, so they pass the response through, and ``respond(to:chainingTo:)`` sends
            // the route's own response (kept in the request's storage).
            request.storage[PassThroughKey.self] = response
            return HTTPCacheResponse(head: head, body: .stream(contentLength: Self.passThroughLength) { _ in throw PassedThrough() })
        }
        let eventLoop = request.eventLoop
        return HTTPCacheResponse(
            head: head,
            body: .stream(contentLength: length) { sink in
                try await BridgeWriter.run(write, on: eventLoop, into: SendableSink(sink))
            })
    }

    /// The length announced for a body the middleware passes through: longer than any body the rules store.
    static let passThroughLength = Int.max

    /// The route's response that a pass-through answers with.
    struct PassThroughKey: StorageKey {
        typealias Value = Response
    }

    /// The body of a pass-through is never written through the cache (its response is sent instead).
    struct PassedThrough: Error {}

    // MARK: - swift-http-types to Vapor

    static func response(_ response: HTTPCacheResponse) -> Response {
        var headers = headers(response.head.headerFields)
        headers.remove(name: .transferEncoding)
        headers.remove(name: .contentLength)
        let status = HTTPResponseStatus(statusCode: response.head.status.code, reasonPhrase: response.head.status.reasonPhrase)
        if let bytes = response.body.bytes {
            return Response(status: status, headers: headers, body: .init(buffer: ByteBuffer(bytes: bytes)))
        }
        let body = response.body
        return Response(
            status: status, headers: headers,
            body: .init(
                managedAsyncStream: { writer in
                    try await body.write(to: WriterSink(writer: writer))
                }, count: body.contentLength ?? -1))
    }
}

/// A Vapor stream writer as the cache's body sink.
struct WriterSink: HTTPCacheBodySink {
    let writer: any AsyncBodyStreamWriter

    func write(_ chunk: ArraySlice<UInt8>) async throws {
        try await writer.writeBuffer(ByteBuffer(bytes: chunk))
    }
}

/// The cache's body sink, handed to Vapor's stream writer protocols (which are `Sendable`). One task
/// writes to a sink, in order (``HTTPCacheBodySink``'s contract): the box is only ever used from the
/// task that runs the body's `write`.
struct SendableSink: @unchecked Sendable {
    let sink: any HTTPCacheBodySink
    init(_ sink: any HTTPCacheBodySink) { self.sink = sink }
    func write(_ chunk: ArraySlice<UInt8>) async throws { try await sink.write(chunk) }
}

/// The writer function of a body streamed through a `BodyStreamWriter`, read from `Response.Body` by
/// reflection (Vapor keeps it internal); nil for any other body. Only that kind: an `async` function read
/// this way cannot be called (Swift 6.3's runtime casts it, then crashes calling it), so a body streamed
/// through an `AsyncBodyStreamWriter` is never read here.
func streamWriter(of body: Response.Body) -> (@Sendable (any BodyStreamWriter) -> Void)? {
    guard let storage = Mirror(reflecting: body).children.first(where: { $0.label == "storage" })?.value,
        let payload = Mirror(reflecting: storage).children.first, payload.label == "stream",
        let callback = Mirror(reflecting: payload.value).children.first(where: { $0.label == "callback" })?.value
    else { return nil }
    return callback as? @Sendable (any BodyStreamWriter) -> Void
}

/// The `BodyStreamWriter` a route's callback-style stream writes to, bridged to the cache's async sink:
/// each chunk's promise completes once the sink took it (the route's writes wait for the client, as
/// they would without the cache).
final class BridgeWriter: BodyStreamWriter {
    typealias Item = (result: BodyStreamResult, promise: EventLoopPromise<Void>?)

    let eventLoop: any EventLoop
    let continuation: AsyncStream<Item>.Continuation

    init(eventLoop: any EventLoop, continuation: AsyncStream<Item>.Continuation) {
        self.eventLoop = eventLoop
        self.continuation = continuation
    }

    func write(_ result: BodyStreamResult, promise: EventLoopPromise<Void>?) {
        if case .terminated = continuation.yield((result, promise)) {
            promise?.fail(CancellationError())
        }
    }

    /// Runs `write` (on its event loop) and copies what it writes into `sink` until `.end`.
    static func run(_ write: @escaping @Sendable (any BodyStreamWriter) -> Void, on eventLoop: any EventLoop, into sink: SendableSink)
        async throws
    {
        let (stream, continuation) = AsyncStream<Item>.makeStream()
        let writer = BridgeWriter(eventLoop: eventLoop, continuation: continuation)
        eventLoop.execute { write(writer) }
        var failure: (any Error)? = nil
        var ended = false
        for await item in stream {
            if ended || failure != nil {
                // After the end or a failure: every promise still gets its answer.
                item.promise?.fail(failure ?? CancellationError())
                continue
            }
            switch item.result {
            case .buffer(let buffer):
                do {
                    if buffer.readableBytes > 0 { try await sink.write(ArraySlice(buffer.readableBytesView)) }
                    item.promise?.succeed(())
                } catch {
                    item.promise?.fail(error)
                    failure = error
                    continuation.finish()
                }
            case .end:
                item.promise?.succeed(())
                ended = true
                continuation.finish()
            case .error(let error):
                item.promise?.succeed(())
                failure = error
                continuation.finish()
            }
        }
        if let failure { throw failure }
    }
}
