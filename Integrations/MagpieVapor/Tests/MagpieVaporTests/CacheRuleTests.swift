import Foundation
import Magpie
import MagpieVapor
import NIOCore
import Vapor
import XCTVapor
import XCTest

/// The rules of Vapor's `Cache` that Vapor's own cache tests check (get and set, expiry, delete, the
/// request's cache), run against Vapor's memory cache and Magpie's driver (over a memory-only and over a
/// two-tier cache), side by side: the same assertions, every driver at once (so that the expiry's
/// sleeps overlap).
final class CacheRuleTests: XCTestCase {
    enum Driver: String, CaseIterable, Sendable {
        case vaporMemory = "Vapor's memory cache"
        case magpieMemory = "Magpie, memory only"
        case magpieTwoTier = "Magpie, memory and disk"
    }

    struct Product: Codable, Equatable, Sendable {
        var id: Int
        var name: String
        var tags: [String]
    }

    /// An application whose `app.cache` is `driver`; `close` shuts both down.
    static func makeApp(_ driver: Driver) async throws -> (app: Application, close: @Sendable () async throws -> Void) {
        let app = try await Application.make(.testing)
        switch driver {
        case .vaporMemory:
            app.caches.use(.memory)
            return (app, { try await app.asyncShutdown() })
        case .magpieMemory, .magpieTwoTier:
            let directory = driver == .magpieTwoTier ? try TemporaryDirectory() : nil
            let cache = try makeCache(directory: directory?.path)
            app.caches.use(.magpie(cache))
            return (
                app,
                {
                    try await app.asyncShutdown()
                    try await cache.shutdown()
                    directory?.remove()
                }
            )
        }
    }

    func testRulesSideBySide() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for driver in Driver.allCases {
                group.addTask { try await Self.checkRules(driver) }
            }
            try await group.waitForAll()
        }
    }

    static func checkRules(_ driver: Driver) async throws {
        let (app, close) = try await makeApp(driver)
        let name = driver.rawValue
        do {
            // get and set
            let absent = try await app.cache.get("foo", as: String.self)
            XCTAssertNil(absent, name)
            try await app.cache.set("foo", to: "bar")
            let value: String? = try await app.cache.get("foo")
            XCTAssertEqual(value, "bar", name)
            try await app.cache.set("foo", to: "baz")
            let replaced = try await app.cache.get("foo", as: String.self)
            XCTAssertEqual(replaced, "baz", name)
            let product = Product(id: 7, name: "Magpie", tags: ["a", "b"])
            try await app.cache.set("product", to: product)
            let read = try await app.cache.get("product", as: Product.self)
            XCTAssertEqual(read, product, name)

            // Expiry: a value set to expire in a second is there at once and gone after it; a value set
            // again without an expiry keeps no expiry; a lifetime already past is gone at once.
            try await app.cache.set("foo2", to: "bar2", expiresIn: .seconds(1))
            try await app.cache.set("kept", to: "one", expiresIn: .seconds(1))
            try await app.cache.set("kept", to: "two")
            try await app.cache.set("past", to: "gone", expiresIn: .seconds(-1))
            let fresh: String? = try await app.cache.get("foo2")
            XCTAssertEqual(fresh, "bar2", name)
            let past = try await app.cache.get("past", as: String.self)
            XCTAssertNil(past, name)
            try await Task.sleep(for: .milliseconds(1_500))
            let expired = try await app.cache.get("foo2", as: String.self)
            XCTAssertNil(expired, name)
            let kept = try await app.cache.get("kept", as: String.self)
            XCTAssertEqual(kept, "two", name)

            // delete, and set to nil
            try await app.cache.set("foo3", to: "bar3")
            let beforeDelete: String? = try await app.cache.get("foo3")
            XCTAssertEqual(beforeDelete, "bar3", name)
            try await app.cache.delete("foo3")
            let deleted = try await app.cache.get("foo3", as: String.self)
            XCTAssertNil(deleted, name)
            try await app.cache.set("foo4", to: "bar4")
            try await app.cache.set("foo4", to: String?.none)
            let nilled = try await app.cache.get("foo4", as: String.self)
            XCTAssertNil(nilled, name)
            try await app.cache.delete("never-set")  // no error

            // The request's cache: the same values, its futures on the request's event loop; through a
            // real request to a running server.
            app.get("visit", ":key") { request async throws -> String in
                let key = try request.parameters.require("key")
                let set: EventLoopFuture<Void> = request.cache.set(key, to: "visited \(key)")
                guard set.eventLoop === request.eventLoop else { throw Abort(.internalServerError, reason: "set off the request's loop") }
                try await set.get()
                let get: EventLoopFuture<String?> = request.cache.get(key, as: String.self)
                guard get.eventLoop === request.eventLoop else { throw Abort(.internalServerError, reason: "get off the request's loop") }
                return try await get.get() ?? "absent"
            }
            app.get("read", ":key") { request async throws -> String in
                try await request.cache.get(request.parameters.require("key"), as: String.self) ?? "absent"
            }
            let tester = try app.testable(method: .running(port: 0))
            try await tester.test(.GET, "/visit/home") { response async in
                XCTAssertEqual(response.status, .ok, name)
                XCTAssertEqual(response.body.string, "visited home", name)
            }
            try await tester.test(.GET, "/read/foo") { response async in
                XCTAssertEqual(response.body.string, "baz", name)
            }
            let visited = try await app.cache.get("home", as: String.self)
            XCTAssertEqual(visited, "visited home", name)
        } catch {
            try await close()
            throw error
        }
        try await close()
    }
}
