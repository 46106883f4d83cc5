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
/// once, every request gets its response.
@Suite(.serialized) struct ConcurrentMissTests {
    final class Counters: Sendable {
        let runs = Atomic<Int>(0)
        let running = Atomic<Bool>(false)
        let arrivedWhileRunning = Atomic<Int>(0)
    }

    /// Counts the requests that reach the application while the route runs (before the cache's middleware).
    struct Arrivals: AsyncMiddleware {
        let counters: Counters
        func respond(to request: Request, chainingTo next: any AsyncResponder) async throws -> Response {
            if counters.running.load(ordering: .sequentiallyConsistent) {
                counters.arrivedWhileRunning.add(1, ordering: .sequentiallyConsistent)
            }
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
        app.middleware.use(Arrivals(counters: counters))
        app.middleware.use(MagpieResponseCacheMiddleware(responseCache))
        app.get("report") { _ async throws -> Response in
            counters.runs.add(1, ordering: .sequentiallyConsistent)
            counters.running.store(true, ordering: .sequentiallyConsistent)
            defer { counters.running.store(false, ordering: .sequentiallyConsistent) }
            try await Task.sleep(for: .seconds(2))
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
        print(
            "[concurrent-misses] \(requests) concurrent GET /report through Vapor: \(counters.runs.load(ordering: .sequentiallyConsistent)) route run, "
                + "\(counters.arrivedWhileRunning.load(ordering: .sequentiallyConsistent)) requests arrived while it ran (2 s), "
                + "\(results.filter { $0.0 == 200 }.count) answered 200, \(elapsed) in all")
        try await app.asyncShutdown()
        try await cache.shutdown()
    }
}
