import ExampleCatalog
import Foundation
import Magpie
import MagpieHTTPCache
import MagpieVapor
import Vapor

/// The product catalog's routes, the same endpoint as the Hummingbird example's (Examples/Catalog: the
/// origin, the product, the strategies), so that `make bench-service` loads both frameworks alike:
///
///     GET  /products/ID          a product (JSON), through the strategy of $MAGPIE_EXAMPLE_CACHE
///     POST /admin/origin?fail=S  the origin fails every call for S seconds (0: heals)
///     GET  /admin/stats          the origin's and the cache's counters (JSON)
///     GET  /health               200 when serving
///
/// $MAGPIE_EXAMPLE_CACHE: `none` (the origin on every request), `vapor-memory` (Vapor's memory cache
/// through `app.cache`: get, on a miss the origin, then set with an expiry), `magpie-cache` (the same
/// handler over `app.caches.use(.magpie(...))`, memory only), `magpie-memory` (Magpie's loader, memory
/// only; the default) or `magpie-responses` (the uncached handler behind `MagpieResponseCacheMiddleware`).
/// $MAGPIE_EXAMPLE_ORIGIN_MS (20) is what an origin call takes, $MAGPIE_EXAMPLE_FRESH_SECONDS (5) how long a
/// product stays fresh.
struct ProductRoutes {
    enum Mode: String, CaseIterable {
        case none
        case vaporMemory = "vapor-memory"
        case magpieCache = "magpie-cache"
        case magpieMemory = "magpie-memory"
        case magpieResponses = "magpie-responses"
    }

    let app: Application
    let mode: Mode
    let origin: Origin
    let fresh: Duration

    init(app: Application, environment: [String: String]) throws {
        self.app = app
        let name = environment["MAGPIE_EXAMPLE_CACHE"] ?? Mode.magpieMemory.rawValue
        guard let mode = Mode(rawValue: name) else {
            throw Abort(.internalServerError, reason: "MAGPIE_EXAMPLE_CACHE: \(name) is none of \(Mode.allCases.map(\.rawValue))")
        }
        self.mode = mode
        origin = Origin(latency: .milliseconds(Int(environment["MAGPIE_EXAMPLE_ORIGIN_MS"] ?? "") ?? 20))
        fresh = .seconds(Int(environment["MAGPIE_EXAMPLE_FRESH_SECONDS"] ?? "") ?? 5)
    }

    func register() throws {
        let products: Products
        var routes: any RoutesBuilder = app
        var cacheControl: String?
        func cache() throws -> Magpie.Cache {
            var configuration = Products.configuration(directory: nil, fresh: fresh, logInterval: .seconds(10))
            configuration.logger = Logger(label: "magpie")
            let cache = try Magpie.Cache(configuration)
            app.lifecycle.use(MagpieCacheLifecycle(cache))
            return cache
        }
        switch mode {
        case .none:
            products = Products(mode: mode.rawValue, origin: origin, source: .origin)
        case .vaporMemory:
            app.caches.use(.memory)
            products = Products(mode: mode.rawValue, origin: origin, source: .store(VaporCacheProducts(app: app), expiry: fresh))
        case .magpieCache:
            let cache = try cache()
            app.caches.use(.magpie(cache, keyPrefix: ""))
            products = Products(
                mode: mode.rawValue, origin: origin, source: .store(VaporCacheProducts(app: app), expiry: fresh), cache: cache)
        case .magpieMemory:
            let cache = try cache()
            products = Products(mode: mode.rawValue, origin: origin, source: .loader(cache.typed(Product.self)), cache: cache)
        case .magpieResponses:
            let cache = try cache()
            products = Products(mode: mode.rawValue, origin: origin, source: .origin, cache: cache)
            let responses = HTTPResponseCache(cache: cache, policy: HTTPResponseCachePolicy(tiers: .memoryOnly))
            routes = app.grouped(MagpieResponseCacheMiddleware(responses))
            cacheControl = Products.cacheControl(fresh: fresh)
        }
        routes.get("products", ":id") { [cacheControl] req async throws -> Response in
            guard let id = req.parameters.get("id", as: Int.self), id >= 0 else {
                throw Abort(.badRequest, reason: "a product id is a non-negative integer")
            }
            let product: Product
            do {
                product = try await products.product(id)
            } catch let error as Products.Unavailable {
                // Answered here, not thrown: Vapor's ErrorMiddleware would log every failed request, and the
                // cache's own log summarises repeated load failures (the count is in /admin/stats).
                return Response(status: error.timedOut ? .gatewayTimeout : .serviceUnavailable, body: .init(string: error.description))
            }
            let response = Response(status: .ok)
            try response.content.encode(product, as: .json)
            if let cacheControl { response.headers.replaceOrAdd(name: .cacheControl, value: cacheControl) }
            return response
        }
        app.get("health") { _ in "ok" }
        app.get("admin", "stats") { _ -> Response in
            let data = (try? JSONSerialization.data(withJSONObject: products.stats(), options: [.sortedKeys])) ?? Data("{}".utf8)
            return Response(status: .ok, headers: ["Content-Type": "application/json"], body: .init(data: data))
        }
        app.post("admin", "origin") { [origin] req -> String in
            let asked = (try? req.query.get(Double.self, at: "fail")) ?? 0
            guard asked.isFinite else { throw Abort(.badRequest, reason: "fail is a number of seconds") }
            origin.fail(for: .milliseconds(Int64(min(max(0, asked), 86_400) * 1000)))  // at most a day
            return "{\"failing\":\(origin.isFailing ? 1 : 0)}"
        }
    }
}

/// Vapor's `app.cache` as the catalog's key-value store: `app.cache` asks the registered driver for a
/// cache on every access, as a handler's `req.cache` does.
struct VaporCacheProducts: ProductStore {
    let app: Application

    func product(forKey key: String) async throws -> Product? { try await app.cache.get(key, as: Product.self) }

    func set(_ product: Product, forKey key: String, expiry: Duration) async throws {
        try await app.cache.set(key, to: product, expiresIn: .seconds(Int(expiry.components.seconds)))
    }
}
