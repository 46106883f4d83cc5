import Foundation
import Magpie
@testable import MagpieVapor
import NIOHTTP1
import Vapor
import XCTVapor
import XCTest

/// Sessions through `SessionsMiddleware` and real requests to a running server: create, read, the
/// sliding lifetime (refreshed on use, not rewritten while unchanged), a change written at once,
/// delete, expiry, an unknown cookie, a restart.
final class SessionTests: XCTestCase {
    static let lifetime = Duration.seconds(600)
    static let refresh = Duration.seconds(60)

    /// An application with Magpie's sessions over `cache` and four routes: `/login/:user` sets the
    /// session's user, `/whoami` reads it (or answers "anonymous"), `/touch` reads nothing of it, and
    /// `/logout` destroys the session.
    func makeApp(_ cache: Magpie.Cache, group: String? = nil) async throws -> Application {
        let app = try await Application.make(.testing)
        app.sessions.use(.magpie(cache, lifetime: Self.lifetime, refreshAfter: Self.refresh, group: group))
        let routes = app.grouped(app.sessions.middleware)
        routes.get("login", ":user") { request -> String in
            request.session.data["user"] = try request.parameters.require("user")
            return "hello"
        }
        routes.get("whoami") { request -> String in
            request.session.data["user"] ?? "anonymous"
        }
        routes.get("logout") { request -> String in
            request.session.destroy()
            return "bye"
        }
        return app
    }

    func cookieHeaders(_ cookie: HTTPCookies.Value?) -> HTTPHeaders {
        var headers = HTTPHeaders()
        if let cookie { headers.cookie = ["vapor-session": cookie] }
        return headers
    }

    func record(_ cache: Magpie.Cache, _ cookie: HTTPCookies.Value?) async throws -> MagpieSessions.Record? {
        guard let id = cookie?.string, let bytes = try await cache.async.value(forKey: "vapor-session:" + id) else { return nil }
        return MagpieSessions.Record(bytes)
    }

    func testCreateReadSlideChangeExpire() async throws {
        let clock = ManualClock()
        let cache = try makeCache(clock: clock)
        let app = try await makeApp(cache)
        let tester = try app.testable(method: .running(port: 0))
        let start = clock.now

        // Create: the cookie names a stored session that expires a lifetime from now.
        var cookie: HTTPCookies.Value?
        try await tester.test(.GET, "/login/ada") { response async in
            XCTAssertEqual(response.status, .ok)
            cookie = response.headers.setCookie?["vapor-session"]
        }
        XCTAssertEqual(cookie?.string.count, 43)
        let created = try await record(cache, cookie)
        XCTAssertEqual(created?.written, start)
        XCTAssertEqual(created?.expires, start + 600_000)

        // Read, unchanged: answered from the store, nothing written, the cookie set again.
        let writesAfterCreate = memoryWrites(cache)
        for _ in 0..<3 {
            try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
                XCTAssertEqual(response.body.string, "ada")
                XCTAssertEqual(response.headers.setCookie?["vapor-session"]?.string, cookie?.string)
            }
        }
        clock.advance(.seconds(59))
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "ada")
        }
        XCTAssertEqual(memoryWrites(cache), writesAfterCreate, "an unchanged session was rewritten")
        let unchanged = try await record(cache, cookie)
        XCTAssertEqual(unchanged?.written, start)

        // Used a refresh interval after its last write: written again, its lifetime extended.
        clock.advance(.seconds(1))
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "ada")
        }
        XCTAssertEqual(memoryWrites(cache), writesAfterCreate + 1)
        let refreshed = try await record(cache, cookie)
        XCTAssertEqual(refreshed?.written, start + 60_000)
        XCTAssertEqual(refreshed?.expires, start + 660_000)

        // Past the first expiry, alive because it was used: a sliding lifetime.
        clock.advance(.seconds(599))
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "ada")
        }
        let slid = try await record(cache, cookie)
        XCTAssertEqual(slid?.written, start + 659_000)

        // A change is written at once, whatever the time since the last write.
        clock.advance(.seconds(1))
        let writesBeforeChange = memoryWrites(cache)
        try await tester.test(.GET, "/login/grace", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.headers.setCookie?["vapor-session"]?.string, cookie?.string)
        }
        XCTAssertEqual(memoryWrites(cache), writesBeforeChange + 1)
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "grace")
        }

        // Unused for a lifetime: expired, gone from the cache; the request starts afresh.
        clock.advance(Self.lifetime)
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "anonymous")
            XCTAssertNotEqual(response.headers.setCookie?["vapor-session"]?.string, cookie?.string)
        }
        let expired = try await record(cache, cookie)
        XCTAssertNil(expired)

        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testDelete() async throws {
        let cache = try makeCache()
        let app = try await makeApp(cache)
        let tester = try app.testable(method: .running(port: 0))
        var cookie: HTTPCookies.Value?
        try await tester.test(.GET, "/login/ada") { response async in
            cookie = response.headers.setCookie?["vapor-session"]
        }
        let stored = try await record(cache, cookie)
        XCTAssertNotNil(stored)
        try await tester.test(.GET, "/logout", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "bye")
            // Vapor's expired cookie: an empty value that expired in 1970.
            XCTAssertEqual(response.headers.setCookie?["vapor-session"]?.string, "")
        }
        let removed = try await record(cache, cookie)
        XCTAssertNil(removed)
        try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "anonymous")
        }
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testAnUnknownOrForeignCookieStartsANewSession() async throws {
        let cache = try makeCache()
        let app = try await makeApp(cache)
        let tester = try app.testable(method: .running(port: 0))
        // Bytes under a session's key that are not a session of this driver's are no session.
        try await cache.async.set(Array("not a session".utf8), forKey: "vapor-session:forged")
        for id in ["unknown", "forged"] {
            var newCookie: HTTPCookies.Value?
            try await tester.test(.GET, "/login/ada", headers: cookieHeaders(HTTPCookies.Value(string: id))) { response async in
                XCTAssertEqual(response.status, .ok)
                newCookie = response.headers.setCookie?["vapor-session"]
            }
            XCTAssertNotNil(newCookie)
            XCTAssertNotEqual(newCookie?.string, id)
            try await tester.test(.GET, "/whoami", headers: cookieHeaders(newCookie)) { response async in
                XCTAssertEqual(response.body.string, "ada")
            }
        }
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testSessionsOnDiskSurviveARestart() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var cookie: HTTPCookies.Value?
        do {
            let cache = try makeCache(directory: directory.path)
            let app = try await makeApp(cache)
            try await app.testable(method: .running(port: 0)).test(.GET, "/login/ada") { response async in
                cookie = response.headers.setCookie?["vapor-session"]
            }
            try await app.asyncShutdown()
            try await cache.shutdown()
        }
        let cache = try makeCache(directory: directory.path)
        let app = try await makeApp(cache)
        try await app.testable(method: .running(port: 0)).test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
            XCTAssertEqual(response.body.string, "ada")
        }
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testAGroupEndsEverySessionAtOnce() async throws {
        let cache = try makeCache()
        let app = try await makeApp(cache, group: "sessions")
        let tester = try app.testable(method: .running(port: 0))
        var cookies: [HTTPCookies.Value?] = []
        for user in ["ada", "grace"] {
            try await tester.test(.GET, "/login/\(user)") { response async in
                cookies.append(response.headers.setCookie?["vapor-session"])
            }
        }
        try await cache.async.set(Array("kept".utf8), forKey: "not-a-session")
        let removed = try await cache.async.removeAll(inGroup: "sessions")
        XCTAssertEqual(removed.memory, 2)
        for cookie in cookies {
            try await tester.test(.GET, "/whoami", headers: cookieHeaders(cookie)) { response async in
                XCTAssertEqual(response.body.string, "anonymous")
            }
        }
        let other = try await cache.async.value(forKey: "not-a-session")
        XCTAssertNotNil(other)
        try await app.asyncShutdown()
        try await cache.shutdown()
    }

    func testIDsAreRandomAndCookieSafe() {
        let ids = (0..<1_000).map { _ in MagpieSessions.newID() }
        XCTAssertEqual(Set(ids).count, ids.count)
        let allowed = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        for id in ids {
            XCTAssertEqual(id.count, 43)
            XCTAssertTrue(id.allSatisfy(allowed.contains), id)
        }
    }
}
