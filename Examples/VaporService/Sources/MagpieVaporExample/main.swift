import ExampleCatalog
import Foundation
import Magpie
import MagpieHTTPCache
import MagpieVapor
import Vapor

// `magpie-vapor-example serve --port 8080`: Magpie behind Vapor's `app.cache`, its sessions and a cached
// endpoint. Two caches: values and responses in one, sessions in one of their own, budgeted for them
// (a session evicted for space would log its user out). Directories under $MAGPIE_VAPOR_DIR (default: a
// folder in the temporary directory).
let root = ProcessInfo.processInfo.environment["MAGPIE_VAPOR_DIR"] ?? NSTemporaryDirectory() + "magpie-vapor-example"
for folder in ["values", "sessions"] {
    try FileManager.default.createDirectory(atPath: "\(root)/\(folder)", withIntermediateDirectories: true)
}
let values = try Magpie.Cache(Magpie.Cache.Configuration(directory: "\(root)/values", memoryBudget: 64 << 20))
let sessions = try Magpie.Cache(
    Magpie.Cache.Configuration(directory: "\(root)/sessions", memoryBudget: 16 << 20, diskBudget: 256 << 20))

var environment = try Environment.detect()
try LoggingSystem.bootstrap(from: &environment)
let app = try await Application.make(environment)
app.caches.use(.magpie(values))
app.sessions.use(.magpie(sessions, lifetime: .seconds(30 * 60)))
app.lifecycle.use(MagpieCacheLifecycle(values))
app.lifecycle.use(MagpieCacheLifecycle(sessions))
app.middleware.use(app.sessions.middleware)

// Sessions: a sliding 30-minute lifetime, written only when they change (or once every 3 minutes of use).
app.get("login", ":user") { req -> String in
    req.session.data["user"] = try req.parameters.require("user")
    return "logged in\n"
}
app.get("me") { req -> String in "\(req.session.data["user"] ?? "anonymous")\n" }
app.get("logout") { req -> String in
    req.session.destroy()
    return "logged out\n"
}

// `app.cache`: a value computed once, kept five minutes.
app.get("greeting", ":name") { req async throws -> String in
    let name = try req.parameters.require("name")
    if let cached = try await req.cache.get("greeting:\(name)", as: String.self) { return cached }
    try await Task.sleep(for: .milliseconds(100))  // the slow part
    let greeting = "Hello, \(name)! (computed at \(Date()))\n"
    try await req.cache.set("greeting:\(name)", to: greeting, expiresIn: .minutes(5))
    return greeting
}

// A whole response cached by HTTP's rules: fresh 10 s, then served stale while one background run refreshes it.
let responses = HTTPResponseCache(cache: values)
app.grouped(MagpieResponseCacheMiddleware(responses)).get("report") { _ async throws -> Response in
    try await Task.sleep(for: .milliseconds(300))  // an expensive page
    return Response(
        status: .ok, headers: ["Cache-Control": "max-age=10, stale-while-revalidate=60, stale-if-error=600"],
        body: .init(string: "report built at \(Date())\n"))
}

// The product catalog of the Hummingbird example (Examples/Catalog) on Vapor, for `make bench-service`'s
// Vapor rows: GET /products/ID through the strategy $MAGPIE_EXAMPLE_CACHE names (ProductRoutes.swift).
try ProductRoutes(app: app, environment: ProcessInfo.processInfo.environment).register()

do {
    try await app.execute()
} catch {
    app.logger.report(error: error)
    try? await app.asyncShutdown()
    throw error
}
try await app.asyncShutdown()
