import HTTPTypes
import Magpie
import MagpieHTTPCache
@testable import MagpieVapor
import NIOCore
import NIOHTTP1
import Synchronization
import Testing
import Vapor

/// What the Vapor middleware adds to the rules (real HTTP to a running application): errors as Vapor
/// answers them, the kinds of streamed bodies, route parameters in a background refresh.
@Suite(.serialized) struct ResponseCacheMiddlewareTests {
    final class Runs: Sendable {
        let count = Atomic<Int>(0)
        func next() -> Int { count.add(1, ordering: .sequentiallyConsistent).newValue }
        var value: Int { count.load(ordering: .sequentiallyConsistent) }
    }

    /// An application with the middleware over a memory-only cache on `clock`; `routes` adds the routes.
    static func serve(
        clock: ManualClock = ManualClock(), policy: HTTPResponseCachePolicy = HTTPResponseCachePolicy(),
        _ routes: (Application) -> Void
    ) async throws -> (app: Application, port: Int, cache: Magpie.Cache) {
        let cache = try makeCache(clock: clock)
        let app = try await Application.make(Environment(name: "testing", arguments: ["vapor"]))
        app.logger.logLevel = .critical
        app.http.server.configuration.hostname = "127.0.0.1"
        app.http.server.configuration.port = 0
        app.middleware.use(MagpieResponseCacheMiddleware(HTTPResponseCache(cache: cache, policy: policy)))
        routes(app)
        try await app.startup()
        guard let port = app.http.server.shared.localAddress?.port else { throw Abort(.internalServerError) }
        return (app, port, cache)
    }

    static func get(_ app: Application, _ port: Int, _ path: String) async throws -> (status: UInt, body: String, headers: HTTPHeaders) {
        let response = try await app.client.get(URI(string: "http://127.0.0.1:\(port)\(path)"))
        return (response.status.code, response.body.map { String(buffer: $0) } ?? "", response.headers)
    }

    static func close(_ served: (app: Application, port: Int, cache: Magpie.Cache)) async throws {
        try await served.app.asyncShutdown()
        try await served.cache.shutdown()
    }

    static func cached(_ text: String) -> Response {
        Response(status: .ok, headers: ["Cache-Control": "max-age=60"], body: .init(string: text))
    }

    @Test func aThrownAbortBelow500IsAnAnswerNotAFailure() async throws {
        let clock = ManualClock()
        let runs2 = Runs()
        let again = try await Self.serve(clock: clock) { app in
            app.get("item") { _ async throws -> Response in
                if runs2.next() == 1 {
                    var headers = HTTPHeaders()
                    headers.add(name: .cacheControl, value: "max-age=1, stale-if-error=600")
                    return Response(status: .ok, headers: headers, body: "item")
                }
                throw Abort(.notFound, reason: "no such item")
            }
        }
        #expect(try await Self.get(again.app, again.port, "/item").body == "item")
        // Stale now: the route's 404 is its answer (Vapor's error body), not a failure that
        // stale-if-error covers.
        clock.advance(.seconds(5))
        let gone = try await Self.get(again.app, again.port, "/item")
        #expect(gone.status == 404)
        #expect(gone.body.contains("no such item"))
        #expect(runs2.value == 2)
        try await Self.close(again)
    }

    @Test func aFailureIsServedStaleWithinStaleIfErrorElseGoesToErrorMiddleware() async throws {
        let clock = ManualClock()
        let runs = Runs()
        let served = try await Self.serve(clock: clock) { app in
            app.get("report") { _ async throws -> Response in
                if runs.next() == 1 {
                    return Response(status: .ok, headers: ["Cache-Control": "max-age=1, stale-if-error=60"], body: "report")
                }
                throw Abort(.serviceUnavailable)
            }
        }
        _ = try await Self.get(served.app, served.port, "/report")
        clock.advance(.seconds(5))
        let stale = try await Self.get(served.app, served.port, "/report")
        #expect(stale.status == 200)
        #expect(stale.body == "report")
        clock.advance(.seconds(120))
        let failed = try await Self.get(served.app, served.port, "/report")
        #expect(failed.status == 503)
        try await Self.close(served)
    }

    @Test func anAsyncStreamIsPassedThroughAndNeverStored() async throws {
        let runs = Runs()
        let served = try await Self.serve { app in
            app.get("feed") { _ async throws -> Response in
                let run = runs.next()
                return Response(
                    status: .ok, headers: ["Cache-Control": "max-age=60"],
                    body: .init(managedAsyncStream: { writer in
                        for chunk in 0..<4 { try await writer.writeBuffer(ByteBuffer(string: "run \(run) chunk \(chunk);")) }
                    }))
            }
        }
        for expected in 1...3 {
            let response = try await Self.get(served.app, served.port, "/feed")
            #expect(response.status == 200)
            #expect(response.body == (0..<4).map { "run \(expected) chunk \($0);" }.joined())
        }
        #expect(runs.value == 3)
        try await Self.close(served)
    }

    @Test func aStreamIsRecordedAsSentAndOneOverTheLimitPassedThrough() async throws {
        let runs = Runs()
        let policy = HTTPResponseCachePolicy(maximumBodySize: 64)
        let served = try await Self.serve(policy: policy) { app in
            for (path, chunks) in [("small", 3), ("large", 40)] {
                app.get(PathComponent(stringLiteral: path)) { request async throws -> Response in
                    let run = runs.next()
                    let stream: @Sendable (any BodyStreamWriter) -> Void = { writer in
                        Task {
                            for chunk in 0..<chunks { try await writer.write(.buffer(ByteBuffer(string: "\(run).\(chunk);"))).get() }
                            try await writer.write(.end).get()
                        }
                    }
                    return Response(status: .ok, headers: ["Cache-Control": "max-age=60"], body: .init(stream: stream))
                }
            }
        }
        let small = (0..<3).map { "1.\($0);" }.joined()
        #expect(try await Self.get(served.app, served.port, "/small").body == small)
        #expect(try await Self.get(served.app, served.port, "/small").body == small)  // stored
        #expect(runs.value == 1)
        let first = try await Self.get(served.app, served.port, "/large")
        #expect(first.body == (0..<40).map { "2.\($0);" }.joined())
        let second = try await Self.get(served.app, served.port, "/large")
        #expect(second.body == (0..<40).map { "3.\($0);" }.joined())  // over 64 bytes: not stored
        #expect(runs.value == 3)
        try await Self.close(served)
    }

    @Test func aBackgroundRefreshRunsTheRouteWithItsParameters() async throws {
        let clock = ManualClock()
        let runs = Runs()
        let served = try await Self.serve(clock: clock) { app in
            app.get("items", ":id") { request async throws -> Response in
                let id = try request.parameters.require("id")
                return Response(
                    status: .ok, headers: ["Cache-Control": "max-age=1, stale-while-revalidate=60"],
                    body: .init(string: "item \(id) #\(runs.next())"))
            }
        }
        #expect(try await Self.get(served.app, served.port, "/items/7").body == "item 7 #1")
        clock.advance(.seconds(5))
        // Stale within stale-while-revalidate: served at once, refreshed in the background.
        #expect(try await Self.get(served.app, served.port, "/items/7").body == "item 7 #1")
        var refreshed = ""
        for _ in 0..<200 {
            refreshed = try await Self.get(served.app, served.port, "/items/7").body
            if refreshed != "item 7 #1" { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(refreshed == "item 7 #2")
        #expect(runs.value == 2)
        try await Self.close(served)
    }
}
