import HTTPTypes
import Magpie
import MagpieHTTPCache
import MagpieHTTPCacheConformance
@testable import MagpieVapor
import NIOCore
import NIOHTTP1
import Synchronization
import Testing
import Vapor

/// A Vapor application serving a conformance case: `MagpieResponseCacheMiddleware` over the case's
/// response cache, every path and method answered by the case's origin, on a running server (port 0).
struct ServedCase {
    let app: Application
    let port: Int

    static let methods: [HTTPMethod] = [.GET, .HEAD, .POST, .PUT, .DELETE, .PATCH, .OPTIONS]

    init(
        _ responseCache: HTTPResponseCache, backgroundRefresh: Bool,
        origin: @escaping @Sendable (HTTPTypes.HTTPRequest) async throws -> HTTPCacheResponse
    ) async throws {
        // The arguments are the test runner's otherwise, which `startup()` would parse as a command.
        let app = try await Application.make(Environment(name: "testing", arguments: ["vapor"]))
        app.logger.logLevel = .critical
        app.http.server.configuration.hostname = "127.0.0.1"
        app.http.server.configuration.port = 0
        app.http.client.configuration.redirectConfiguration = .disallow
        app.http.client.configuration.decompression = .disabled
        app.middleware.use(MagpieResponseCacheMiddleware(responseCache, backgroundRefresh: backgroundRefresh))
        for method in Self.methods {
            app.on(method, "**") { request async throws -> Response in
                Self.vaporResponse(try await origin(MagpieResponseCacheMiddleware.httpRequest(request)))
            }
        }
        do {
            try await app.startup()
            guard let port = app.http.server.shared.localAddress?.port else { throw Abort(.internalServerError, reason: "no port") }
            self.app = app
            self.port = port
        } catch {
            try? await app.asyncShutdown()
            throw error
        }
    }

    /// The origin's response as a Vapor route answers: a buffer, or a stream through a `BodyStreamWriter`
    /// (`Response.Body(stream:)`, the kind of stream the middleware records as it is sent).
    static func vaporResponse(_ response: HTTPCacheResponse) -> Response {
        var headers = MagpieResponseCacheMiddleware.headers(response.head.headerFields)
        headers.remove(name: .contentLength)
        let status = HTTPResponseStatus(statusCode: response.head.status.code)
        if let bytes = response.body.bytes { return Response(status: status, headers: headers, body: .init(buffer: ByteBuffer(bytes: bytes))) }
        let body = response.body
        let stream: @Sendable (any BodyStreamWriter) -> Void = { writer in
            Task {
                do {
                    try await body.write(to: StreamWriterSink(writer: writer))
                    try await writer.write(.end).get()
                } catch {
                    writer.write(.error(error), promise: nil)
                }
            }
        }
        if let length = body.contentLength { return Response(status: status, headers: headers, body: .init(stream: stream, count: length)) }
        return Response(status: status, headers: headers, body: .init(stream: stream))
    }

    /// Sends `request` over HTTP to the running server; the response as the conformance table reads it.
    func send(_ request: ConformanceRequest) async throws -> ConformanceResult {
        var headers = HTTPHeaders()
        for (name, value) in request.headers { headers.add(name: name, value: value) }
        let response = try await app.client.send(
            HTTPMethod(rawValue: request.method.rawValue), headers: headers, to: URI(string: "http://127.0.0.1:\(port)\(request.target)"))
        var fields: [(name: String, value: String)] = []
        for (name, value) in response.headers { fields.append((name, value)) }
        return ConformanceResult(
            status: Int(response.status.code), headers: fields, body: response.body.map { Array($0.readableBytesView) } ?? [])
    }

    func shutdown() async throws {
        try await app.asyncShutdown()
    }
}

/// MagpieHTTPCache's RFC 9111 / RFC 5861 table, every case through Vapor: the middleware in a running
/// application, real HTTP requests from Vapor's client (AsyncHTTPClient), with the stale responses
/// refreshed in the background and in line.
@Suite(.serialized) struct ResponseCacheConformanceTests {
    @Test func theTableHasAtLeastThirtyCases() {
        #expect(HTTPCacheConformance.cases.count >= 30)
    }

    @Test(arguments: HTTPCacheConformance.cases, [true, false])
    func conformance(_ testCase: ConformanceCase, backgroundRefresh: Bool) async throws {
        let environment = try ConformanceEnvironment(testCase)
        defer { environment.close() }
        let served = try await ServedCase(environment.responseCache, backgroundRefresh: backgroundRefresh) { request in
            try await environment.origin(request)
        }
        let failures = await environment.run { request in try await served.send(request) }
        try await served.shutdown()
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }
}

/// A `BodyStreamWriter` as a body sink: each chunk written once the previous one was.
struct StreamWriterSink: HTTPCacheBodySink {
    let writer: any BodyStreamWriter
    func write(_ chunk: ArraySlice<UInt8>) async throws {
        try await writer.write(.buffer(ByteBuffer(bytes: chunk))).get()
    }
}
