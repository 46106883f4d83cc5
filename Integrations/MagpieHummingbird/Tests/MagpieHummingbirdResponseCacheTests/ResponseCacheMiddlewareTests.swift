import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Magpie
import MagpieHTTPCache
import MagpieHTTPCacheConformance
import MagpieHummingbirdResponseCache
import NIOCore
import Synchronization
import Testing

/// The response cache's middleware through Hummingbird: the conformance table over a live server
/// (real HTTP requests from HummingbirdTesting's client), concurrent misses, and a body over the limit.
/// Serialized: a live server per case, one at a time, so that the package's timing-sensitive suites
/// (lifetimes of a second) running beside it are not starved on 2 cores.
@Suite(.serialized) struct ResponseCacheMiddlewareTests {
    static let methods: [HTTPRequest.Method] = [.get, .head, .post, .put, .delete, .patch]

    /// An application whose every route answers with the case's origin, behind the middleware.
    static func application(_ environment: ConformanceEnvironment, backgroundRefresh: Bool) -> some ApplicationProtocol {
        let router = Router()
        let refresher = backgroundRefresh ? ResponseCacheMiddleware<BasicRequestContext>.Refresher() : nil
        router.add(middleware: ResponseCacheMiddleware(environment.responseCache, refresher: refresher))
        for method in methods {
            router.on("**", method: method) { request, _ -> Response in
                Response(try await environment.origin(request.head))
            }
            router.on("/", method: method) { request, _ -> Response in
                Response(try await environment.origin(request.head))
            }
        }
        refresher?.use(router.buildResponder())
        return Application(router: router)
    }

    /// Every case, with stale-while-revalidate refreshing in line (no refresher) and in the background.
    @Test(arguments: HTTPCacheConformance.cases, [false, true])
    func conformance(_ testCase: ConformanceCase, backgroundRefresh: Bool) async throws {
        try await Self.run(testCase, backgroundRefresh: backgroundRefresh)
    }

    /// With a `Refresher`: stale responses refreshed in the background.
    @Test(arguments: HTTPCacheConformance.backgroundRefreshCases)
    func backgroundRefresh(_ testCase: ConformanceCase) async throws {
        try await Self.run(testCase, backgroundRefresh: true)
    }

    static func run(_ testCase: ConformanceCase, backgroundRefresh: Bool) async throws {
        let environment = try ConformanceEnvironment(testCase)
        defer { environment.close() }
        let application = application(environment, backgroundRefresh: backgroundRefresh)
        let failures = try await application.test(.live) { client in
            await environment.run { request in
                var fields = HTTPFields()
                for (name, value) in request.headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
                let response = try await client.executeRequest(uri: request.target, method: request.method, headers: fields, body: nil)
                return ConformanceResult(
                    status: response.status.code, headers: response.headers.map { ($0.name.rawName, $0.value) },
                    body: Array(response.body.readableBytesView))
            }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    @Test func oneThousandConcurrentMissesRunTheHandlerOnce() async throws {
        let cache = try Cache(Cache.Configuration(memoryBudget: 16 << 20))
        defer { try? cache.close() }
        let responses = HTTPResponseCache(cache: cache)
        let runs = Atomic<Int>(0)
        let router = Router()
        router.add(middleware: ResponseCacheMiddleware(responses))
        router.get("/product") { _, _ -> Response in
            runs.add(1, ordering: .relaxed)
            try await Task.sleep(for: .milliseconds(200))
            return Response(
                status: .ok, headers: [.cacheControl: "max-age=60"], body: ResponseBody(byteBuffer: ByteBuffer(string: "product")))
        }
        let bodies = try await Application(router: router).test(.router) { client in
            try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<1000 {
                    group.addTask {
                        let response = try await client.executeRequest(uri: "/product", method: .get, headers: [:], body: nil)
                        return "\(response.status.code) \(String(buffer: response.body))"
                    }
                }
                var bodies: [String] = []
                for try await body in group { bodies.append(body) }
                return bodies
            }
        }
        #expect(bodies.count == 1000)
        #expect(Set(bodies) == ["200 product"])
        #expect(runs.load(ordering: .relaxed) == 1)
    }

    @Test func aBodyOverTheSizeLimitIsPassedThrough() async throws {
        let cache = try Cache(Cache.Configuration(memoryBudget: 16 << 20))
        defer { try? cache.close() }
        let responses = HTTPResponseCache(cache: cache, policy: HTTPResponseCachePolicy(maximumBodySize: 64 << 10))
        let runs = Atomic<Int>(0)
        let chunk = ByteBuffer(repeating: UInt8(ascii: "x"), count: 16 << 10)
        let router = Router()
        router.add(middleware: ResponseCacheMiddleware(responses))
        router.get("/export") { _, _ -> Response in
            runs.add(1, ordering: .relaxed)
            // 1 MiB in 64 chunks, of unknown length: a stream recorded up to 64 KiB, then passed through.
            return Response(
                status: .ok, headers: [.cacheControl: "max-age=60"],
                body: ResponseBody { writer in
                    for _ in 0..<64 { try await writer.write(chunk) }
                    try await writer.finish(nil)
                })
        }
        router.get("/sized") { _, _ -> Response in
            runs.add(1, ordering: .relaxed)
            return Response(
                status: .ok, headers: [.cacheControl: "max-age=60"],
                body: ResponseBody(byteBuffer: ByteBuffer(repeating: UInt8(ascii: "y"), count: 1 << 20)))
        }
        try await Application(router: router).test(.live) { client in
            for round in 1...2 {
                let streamed = try await client.executeRequest(uri: "/export", method: .get, headers: [:], body: nil)
                #expect(streamed.status == .ok)
                #expect(streamed.body.readableBytes == 1 << 20)
                let sized = try await client.executeRequest(uri: "/sized", method: .get, headers: [:], body: nil)
                #expect(sized.body.readableBytes == 1 << 20)
                #expect(runs.load(ordering: .relaxed) == 2 * round)
            }
        }
        #expect(cache.statistics.memory.entries == 0)
    }
}
