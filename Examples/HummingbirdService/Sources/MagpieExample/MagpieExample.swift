import ArgumentParser
import ExampleCatalog
import Foundation
import Hummingbird
import Logging
import Magpie
import MagpieHTTPCache
import MagpieHummingbird
import MagpieHummingbirdResponseCache
import MagpieRedis
import ServiceLifecycle

/// How the service caches the origin's products.
enum CacheMode: String, ExpressibleByArgument, CaseIterable, Sendable {
    /// No cache: the origin on every request.
    case none
    /// Hummingbird's `MemoryPersistDriver`, used as a user would: get, on a miss call the origin and set
    /// with an expiry.
    case hummingbirdMemory = "hummingbird-memory"
    /// The same handler over `MagpiePersistDriver` (a memory-only Magpie cache).
    case magpiePersist = "magpie-persist"
    /// Magpie's loader (single flight, stale-while-revalidate, fail-safe), memory only.
    case magpieMemory = "magpie-memory"
    /// Magpie's HTTP response cache (`ResponseCacheMiddleware`) in front of the uncached handler, memory
    /// only: the whole response stored, served without running the handler.
    case magpieResponses = "magpie-responses"
    /// Magpie's loader, memory and disk.
    case magpieDisk = "magpie-disk"
    /// Magpie's loader, memory and disk, and a fleet tier on Redis shared by every process started
    /// with the same `--redis`.
    case magpieFleet = "magpie-fleet"
}

@main
struct MagpieExample: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "magpie-example",
        abstract: "A product catalog API on Hummingbird that reads through Magpie from a slow origin.",
        discussion: """
            GET  /products/ID          a product (JSON), through the cache
            POST /admin/origin?fail=S  the origin fails every call for S seconds (0: heals)
            GET  /admin/stats          the origin's and the cache's counters (JSON)
            GET  /health               200 when serving
            """)

    @Option(help: "How to cache: \(CacheMode.allCases.map(\.rawValue).joined(separator: ", ")).")
    var cache: CacheMode = .magpieDisk

    @Option(help: "The address to listen on.")
    var host = "127.0.0.1"

    @Option(help: "The port to listen on (0: any free port, printed when listening).")
    var port = 8080

    @Option(help: "What each origin call takes, in milliseconds.")
    var originLatencyMs = 20

    @Option(help: "How long a product stays fresh, in seconds (its expiry in the persist-driver modes).")
    var freshSeconds = 5

    @Option(help: "The Magpie directory (magpie-disk, magpie-fleet); default: a new temporary one.")
    var directory: String?

    @Option(help: "The Redis or Valkey URL of the fleet tier (magpie-fleet).")
    var redis = "redis://127.0.0.1:6379"

    @Option(help: "The Redis namespace the fleet shares (magpie-fleet).")
    var namespace = "magpie-example:"

    @Option(help: "The least level logged (trace, debug, info, notice, warning, error, critical).")
    var logLevel = "info"

    @Option(help: "How often a repeating failure is logged, in seconds (Magpie's logInterval).")
    var logIntervalSeconds = 10

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "magpie-example")
        let origin = Origin(latency: .milliseconds(originLatencyMs))
        let catalog = try makeCatalog(origin: origin, logger: logger)
        let products = catalog.products

        let router = Router()
        router.get("/health") { _, _ in "ok" }
        let product: @Sendable (Request, BasicRequestContext) async throws -> Response = { request, context in
            guard let id = context.parameters.get("id", as: Int.self), id >= 0 else {
                throw HTTPError(.badRequest, message: "a product id is a non-negative integer")
            }
            return try await catalog.product(id, request: request, context: context)
        }
        var refresher: ResponseCacheMiddleware<BasicRequestContext>.Refresher?
        if let responses = catalog.responses?.cache {
            // Whole responses cached by HTTP's rules: the handler says how long (Cache-Control); a stale
            // one is refreshed in the background by the router's responder (the refresher).
            refresher = ResponseCacheMiddleware<BasicRequestContext>.Refresher()
            router.group("/products").add(middleware: ResponseCacheMiddleware(responses, refresher: refresher)).get(":id", use: product)
        } else {
            router.get("/products/:id", use: product)
        }
        router.post("/admin/origin") { request, _ -> Response in
            let asked = request.uri.queryParameters.get("fail", as: Double.self) ?? 0
            guard asked.isFinite else { throw HTTPError(.badRequest, message: "fail is a number of seconds") }
            let seconds = min(max(0, asked), 86_400)  // at most a day
            origin.fail(for: .milliseconds(Int64(seconds * 1000)))
            return json(["failing": origin.isFailing ? 1 : 0, "seconds": seconds])
        }
        router.get("/admin/stats") { _, _ -> Response in
            json(products.stats())
        }

        refresher?.use(router.buildResponder())  // after every route is added

        var services: [any Service] = []
        if let cache = products.cache { services.append(cache) }  // shut down (flushed, closed) with the app
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "magpie-example"),
            services: services,
            onServerRunning: { channel in
                // One line for scripts to wait on: the port actually bound.
                let line = "magpie-example: \(products.mode) listening on \(host):\(channel.localAddress?.port ?? port)\n"
                FileHandle.standardError.write(Data(line.utf8))
            },
            logger: logger
        )
        try await app.runService()
    }

    func makeCatalog(origin: Origin, logger: Logger) throws -> Catalog {
        let fresh = Duration.seconds(freshSeconds)
        func configuration(directory: String?) -> Cache.Configuration {
            var configuration = Products.configuration(directory: directory, fresh: fresh, logInterval: .seconds(logIntervalSeconds))
            configuration.logger = Logger(label: "magpie")
            return configuration
        }
        func cacheDirectory() throws -> String {
            if let directory { return directory }
            let made = FileManager.default.temporaryDirectory.appendingPathComponent("magpie-example-\(getpid())").path
            try FileManager.default.createDirectory(atPath: made, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            return made
        }
        func catalog(_ source: Products.Source, cache: Cache? = nil, responses: HTTPResponseCache? = nil) -> Catalog {
            Catalog(
                products: Products(mode: self.cache.rawValue, origin: origin, source: source, cache: cache),
                responses: responses.map { ($0, Products.cacheControl(fresh: fresh)) })
        }
        switch cache {
        case .none:
            return catalog(.origin)
        case .hummingbirdMemory:
            return catalog(.store(PersistProducts(driver: MemoryPersistDriver()), expiry: fresh))
        case .magpiePersist:
            let cache = try Cache(configuration(directory: nil))
            let driver = MagpiePersistDriver(cache: cache, keyPrefix: "", tiers: .memoryOnly)
            return catalog(.store(PersistProducts(driver: driver), expiry: fresh), cache: cache)
        case .magpieMemory:
            let cache = try Cache(configuration(directory: nil))
            return catalog(.loader(cache.typed(Product.self)), cache: cache)
        case .magpieResponses:
            let cache = try Cache(configuration(directory: nil))
            let responses = HTTPResponseCache(cache: cache, policy: HTTPResponseCachePolicy(tiers: .memoryOnly))
            return catalog(.origin, cache: cache, responses: responses)
        case .magpieDisk:
            let cache = try Cache(configuration(directory: cacheDirectory()))
            return catalog(.loader(cache.typed(Product.self)), cache: cache)
        case .magpieFleet:
            var options = configuration(directory: try cacheDirectory())
            let store = try RedisRemoteStore(.init(url: redis, namespace: namespace))
            options.remote = RemoteTierOptions(store: store)
            let cache = try Cache(options)
            return catalog(.loader(cache.typed(Product.self)), cache: cache)
        }
    }
}

/// A JSON response of `object` (a dictionary of numbers and strings, or nested ones).
func json(_ object: [String: Any]) -> Response {
    let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    return Response(
        status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
}
