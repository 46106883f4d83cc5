import Foundation
import Magpie
@testable import MagpieVapor
import NIOCore
import Vapor
import XCTVapor
import XCTest

/// What Magpie's driver adds to Vapor's rules: one shared cache behind cheap handles, expiry on the
/// cache's clock, errors, prefixes, values on disk across a restart.
final class MagpieCacheTests: XCTestCase {
    func testEachAccessIsAHandleOverTheOneCache() async throws {
        let app = try await Application.make(.testing)
        let cache = try makeCache()
        app.caches.use(.magpie(cache))
        let first = try XCTUnwrap(app.cache as? MagpieVaporCache)
        let second = try XCTUnwrap(app.cache as? MagpieVaporCache)
        XCTAssertTrue(first.cache === cache)
        XCTAssertTrue(first.shared === second.shared)
        // A value set through one handle is read through another.
        try await first.set("k", to: 42).get()
        let read = try await second.get("k", as: Int.self).get()
        XCTAssertEqual(read, 42)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testExpiryOnTheCachesClock() async throws {
        let clock = ManualClock()
        let cache = try makeCache(clock: clock)
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        try await app.cache.set("short", to: "s", expiresIn: .seconds(60))
        try await app.cache.set("long", to: "l", expiresIn: .hours(2))
        try await app.cache.set("forever", to: "f")
        clock.advance(.milliseconds(59_999))
        let before = try await app.cache.get("short", as: String.self)
        XCTAssertEqual(before, "s")
        clock.advance(.milliseconds(1))
        let after = try await app.cache.get("short", as: String.self)
        XCTAssertNil(after)
        clock.advance(.seconds(2 * 3600))
        let long = try await app.cache.get("long", as: String.self)
        XCTAssertNil(long)
        clock.advance(.seconds(365 * 24 * 3600))
        let forever = try await app.cache.get("forever", as: String.self)
        XCTAssertEqual(forever, "f")
        // The cache removes expired entries itself, not only when they are read.
        try await app.cache.set("unread", to: "u", expiresIn: .seconds(1))
        clock.advance(.seconds(2))
        let removed = try await cache.async.removeExpired()
        XCTAssertEqual(removed.memory, 1)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testKeysArePrefixedAndValuesJSON() async throws {
        let cache = try makeCache()
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache, keyPrefix: "app1:"))
        try await app.cache.set("answer", to: ["x": 1])
        let raw = try await cache.async.value(forKey: "app1:answer")
        XCTAssertEqual(raw.map { String(decoding: $0, as: UTF8.self) }, #"{"x":1}"#)
        let unprefixed = try await cache.async.value(forKey: "answer")
        XCTAssertNil(unprefixed)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testAValueOfAnotherTypeThrowsTheDecodingError() async throws {
        let cache = try makeCache()
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        try await app.cache.set("n", to: "not a number")
        do {
            _ = try await app.cache.get("n", as: Int.self)
            XCTFail("decoded a string as an Int")
        } catch is DecodingError {
        }
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testTheCachesFailuresFailTheFutureAndTheRoute() async throws {
        let cache = try makeCache()
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        let tooLong = String(repeating: "k", count: Magpie.Cache.maximumKeyLength)
        do {
            try await app.cache.set(tooLong, to: 1)
            XCTFail("stored under a key longer than the cache takes (with its prefix)")
        } catch let error as MagpieError {
            XCTAssertEqual(error.code, .keyTooLong)
        }
        do {
            _ = try await app.cache.get(tooLong, as: Int.self)
            XCTFail("read a key longer than the cache takes")
        } catch let error as MagpieError {
            XCTAssertEqual(error.code, .keyTooLong)
        }
        app.get("long") { request async throws -> String in
            try await request.cache.set(tooLong, to: 1)
            return "stored"
        }
        try await app.testable(method: .running(port: 0)).test(.GET, "/long") { response async in
            XCTAssertEqual(response.status, .internalServerError)
        }
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testAValueLargerThanAMemoryOnlyCacheKeepsIsRefused() async throws {
        // A memory-only cache refuses it as it would evict it: the key is absent (the store counted).
        let cache = try makeCache(memoryBudget: 1 << 20)
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        try await app.cache.set("big", to: "small first")
        try await app.cache.set("big", to: String(repeating: "x", count: cache.largestStorableValue + 1))
        let big = try await app.cache.get("big", as: String.self)
        XCTAssertNil(big)
        XCTAssertEqual(cache.statistics.memory.refusals, 1)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testValuesOnDiskSurviveARestart() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        do {
            let cache = try makeCache(directory: directory.path)
            let app = try await Application.make(.testing)
            app.caches.use(.magpie(cache))
            try await app.cache.set("kept", to: "across restarts")
            try await app.cache.set("brief", to: "gone", expiresIn: .seconds(1))
            try await app.asyncShutdown()
            try await cache.shutdown()
        }
        try await Task.sleep(for: .milliseconds(1_100))
        let cache = try makeCache(directory: directory.path)
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        let kept = try await app.cache.get("kept", as: String.self)
        XCTAssertEqual(kept, "across restarts")
        let brief = try await app.cache.get("brief", as: String.self)
        XCTAssertNil(brief)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testTheLifecycleHandlerShutsTheCacheDownWithTheApplication() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let cache = try makeCache(directory: directory.path)
        let app = try await Application.make(.testing)
        app.caches.use(.magpie(cache))
        app.lifecycle.use(MagpieCacheLifecycle(cache))
        try await app.cache.set("k", to: "v")
        try await app.asyncShutdown()
        do {
            _ = try await cache.async.value(forKey: "vapor-cache:k")
            XCTFail("the cache is still open after the application's shutdown")
        } catch let error as MagpieError {
            XCTAssertEqual(error.code, .closed)
        }
        // Flushed and closed: the directory opens again with the value.
        let reopened = try makeCache(directory: directory.path)
        let value = try await reopened.async.value(forKey: "vapor-cache:k")
        XCTAssertEqual(value.map { String(decoding: $0, as: UTF8.self) }, #""v""#)
        try await reopened.shutdown()
    }
}
