import ExampleCatalog
import Hummingbird
import MagpieHTTPCache

/// The product route on Hummingbird: the product by the mode's strategy (ExampleCatalog's `Products`),
/// rendered as JSON by the request context's encoder, as a Hummingbird handler returns a value.
struct Catalog: Sendable {
    let products: Products
    /// The HTTP response cache in front of the route (magpie-responses), and the `Cache-Control` the
    /// handler then sets: the response cache stores the rendered response by it.
    let responses: (cache: HTTPResponseCache, cacheControl: String)?

    func product(_ id: Int, request: Request, context: some RequestContext) async throws -> Response {
        let product: Product
        do {
            product = try await products.product(id)
        } catch let error as Products.Unavailable {
            throw HTTPError(error.timedOut ? .gatewayTimeout : .serviceUnavailable, message: error.description)
        }
        var response = try context.responseEncoder.encode(product, from: request, context: context)
        if let responses { response.headers[.cacheControl] = responses.cacheControl }
        return response
    }
}

/// Hummingbird's persist drivers as the example's key-value store.
struct PersistProducts: ProductStore {
    let driver: any PersistDriver

    func product(forKey key: String) async throws -> Product? { try await driver.get(key: key, as: Product.self) }

    func set(_ product: Product, forKey key: String, expiry: Duration) async throws {
        try await driver.set(key: key, value: product, expires: expiry)
    }
}
