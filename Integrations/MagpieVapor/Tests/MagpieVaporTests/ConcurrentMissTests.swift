import HTTPTypes
import Magpie
import MagpieHTTPCache
@testable import MagpieVapor
import NIOCore
import NIOHTTP1
import Synchronization
import Testing
import Vapor

/// 1,000 concurrent requests of one key through Vapor (real HTTP, a connection each): the route runs
/// once, every request gets its response. The route holds its answer until every request has reached
/// the application (up to 90 s), so that all 1,000 are misses in flight at once, not hits that came late.
@Suite(.serialized) struct ConcurrentMissTests {
    final class Counters: Sendable {
        let runs = Atomic<Int>(0)
        let arrived = Atomic<Int>(0)
        let arrivedBeforeTheAnswer = Atomic<Int>(0)
    }

    /// Counts the requests that reach the application (before the cache's middleware).
    struct Arrivals: AsyncMiddleware {
        let counters: Counters
        func respond(to request: Request, chainingTo next: any AsyncResponder) async throws -> Response {
            counters.arrived.add(1, ordering: .sequentiallyConsistent)
            return try await next.respond(to: request)
        }
    }

    @Test func aThousandConcurrentMissesRunTheRouteOnce() async throws {
        let requests = 1_000
        var configuration = Magpie.Cache.Configuration(memoryBudget: 8 << 20)
        configuration.metrics = nil
        let cache = try Magpie.Cache(configuration)
        let responseCache = HTTPResponseCache(cache: cache)
        let counters = Counters()
        // The arguments are the test runner's otherwise, which `startup()` would parse as a command.
        let app = try await Application.make(Environment(name: "testing", arguments: ["vapor"]))
        app.logger.logLevel = .critical
        app.http.server.configuration.hostname = "127.0.0.1"
        app.http.server.configuration.port = 0
        app.http.server.configuration.backlog = 2_048
        app.http.client.configuration.connectionPool = .init(
            idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: requests)
        // Opening 1,000 connections on 2 busy cores can take longer than the client's default 10 s
        // (seen: getConnectionFromPoolTimeout beside a compile).
        app.http.client.configuration.timeout = .init(connect: .seconds(90), read: .seconds(120))
        app.middleware.use(Arrivals(counters: counters))
        app.middleware.use(MagpieResponseCacheMiddleware(responseCache))
        app.get("report") { _ async throws -> Response in
            counters.runs.add(1, ordering: .sequentiallyConsistent)
            let deadline = ContinuousClock.now + .seconds(90)
            while counters.arrived.load(ordering: .sequentiallyConsistent) < requests, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(10))
            }
            counters.arrivedBeforeTheAnswer.store(counters.arrived.load(ordering: .sequentiallyConsistent), ordering: .sequentiallyConsistent)
            var headers = HTTPHeaders()
            headers.add(name: .cacheControl, value: "max-age=60")
            return Response(status: .ok, headers: headers, body: .init(string: "the report"))
        }
        try await app.startup()
        let port = try #require(app.http.server.shared.localAddress?.port)
        let client = app.client
        let start = ContinuousClock.now
        let results = try await withThrowingTaskGroup(of: (UInt, String).self) { group in
            for _ in 0..<requests {
                group.addTask {
                    let response = try await client.get(URI(string: "http://127.0.0.1:\(port)/report"))
                    return (response.status.code, response.body.map { String(buffer: $0) } ?? "")
                }
            }
            var results: [(UInt, String)] = []
            for try await result in group { results.append(result) }
            return results
        }
        let elapsed = ContinuousClock.now - start
        #expect(results.count == requests)
        #expect(results.allSatisfy { $0.0 == 200 && $0.1 == "the report" })
        #expect(counters.runs.load(ordering: .sequentiallyConsistent) == 1)
        #expect(counters.arrivedBeforeTheAnswer.load(ordering: .sequentiallyConsistent) == requests)
        print(
            "[concurrent-misses] \(requests) concurrent GET /report through Vapor: \(counters.runs.load(ordering: .sequentiallyConsistent)) route run, "
                + "\(counters.arrivedBeforeTheAnswer.load(ordering: .sequentiallyConsistent)) requests in flight when it answered, "
                + "\(results.filter { $0.0 == 200 }.count) answered 200, \(elapsed) in all")
        try await app.asyncShutdown()
        try await cache.shutdown()
    }
}
