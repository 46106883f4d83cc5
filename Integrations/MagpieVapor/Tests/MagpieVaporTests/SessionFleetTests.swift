import Foundation
import Magpie
import MagpieRedis
import MagpieVapor
import NIOHTTP1
import Vapor
import XCTVapor
import XCTest

/// Two instances of a service, each with its own Magpie cache (memory and disk) over one Redis remote
/// tier: a session created through one is read, changed and ended through the other. A real
/// `redis-server` on loopback (installed by `make deps`), started and stopped by the test.
final class SessionFleetTests: XCTestCase {
    /// A `redis-server` of the test's own on a free loopback port, without persistence.
    final class RedisServer {
        let process: Process
        let port: Int
        let directory: TemporaryDirectory

        init() async throws {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/redis-server") else {
                throw Abort(.internalServerError, reason: "redis-server is not installed (make deps installs it)")
            }
            directory = try TemporaryDirectory()
            // A random port; a server that exits at once found it taken, and the next try takes another.
            for _ in 0..<5 {
                let port = Int.random(in: 30_000..<60_000)
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
                process.arguments = [
                    "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", directory.path,
                ]
                process.standardOutput = FileHandle.nullDevice
                process.standardError = FileHandle.nullDevice
                try process.run()
                try await Task.sleep(for: .milliseconds(300))
                if process.isRunning {
                    self.process = process
                    self.port = port
                    return
                }
            }
            directory.remove()
            throw Abort(.internalServerError, reason: "redis-server did not start")
        }

        /// Kills the server (SIGKILL: a child of the test process may inherit SIGTERM blocked, and ignore
        /// it) and waits for it.
        func stop() {
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
            directory.remove()
        }
    }

    /// An instance: its own cache over the fleet's Redis namespace, sessions on it, three routes.
    func makeInstance(_ redis: RedisServer, namespace: String) async throws -> (Application, Magpie.Cache, TemporaryDirectory) {
        let directory = try TemporaryDirectory()
        var configuration = Magpie.Cache.Configuration(directory: directory.path, memoryBudget: 8 << 20, diskBudget: 64 << 20)
        configuration.metrics = nil
        configuration.remote = RemoteTierOptions(store: try RedisRemoteStore(.init(url: "redis://127.0.0.1:\(redis.port)", namespace: namespace)))
        let cache = try Magpie.Cache(configuration)
        let app = try await Application.make(.testing)
        app.sessions.use(.magpie(cache, lifetime: .seconds(600)))
        let routes = app.grouped(app.sessions.middleware)
        routes.get("login", ":user") { request -> String in
            request.session.data["user"] = try request.parameters.require("user")
            return "hello"
        }
        routes.get("whoami") { request -> String in request.session.data["user"] ?? "anonymous" }
        routes.get("logout") { request -> String in
            request.session.destroy()
            return "bye"
        }
        return (app, cache, directory)
    }

    func whoami(_ app: Application, _ cookie: HTTPCookies.Value?) async throws -> String {
        var headers = HTTPHeaders()
        if let cookie { headers.cookie = ["vapor-session": cookie] }
        var body = ""
        try await app.testable(method: .running(port: 0)).test(.GET, "/whoami", headers: headers) { response async in
            body = response.body.string
        }
        return body
    }

    /// Asks `app` until it answers `expected` (a change reaches the other instance's local copies through
    /// Redis's change feed, within milliseconds), for up to 5 s; the last answer.
    func eventually(_ app: Application, _ cookie: HTTPCookies.Value?, _ expected: String) async throws -> String {
        var answer = ""
        for _ in 0..<250 {
            answer = try await whoami(app, cookie)
            if answer == expected { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        return answer
    }

    func testASessionIsSharedByEveryInstance() async throws {
        let redis = try await RedisServer()
        defer { redis.stop() }
        let namespace = "vapor-sessions-\(UUID().uuidString)"
        let (a, cacheA, directoryA) = try await makeInstance(redis, namespace: namespace)
        let (b, cacheB, directoryB) = try await makeInstance(redis, namespace: namespace)

        // Redis accepts connections a moment after it starts: log in until the store takes the write.
        var cookie: HTTPCookies.Value?
        for _ in 0..<100 {
            try await a.testable(method: .running(port: 0)).test(.GET, "/login/ada") { response async in
                cookie = response.headers.setCookie?["vapor-session"]
            }
            if try await whoami(b, cookie) == "ada" { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let readByB = try await whoami(b, cookie)
        XCTAssertEqual(readByB, "ada", "the session written by one instance is not read by the other")

        // Changed through B, read through A.
        var headers = HTTPHeaders()
        headers.cookie = ["vapor-session": try XCTUnwrap(cookie)]
        try await b.testable(method: .running(port: 0)).test(.GET, "/login/grace", headers: headers) { response async in
            XCTAssertEqual(response.headers.setCookie?["vapor-session"]?.string, cookie?.string)
        }
        let changed = try await eventually(a, cookie, "grace")
        XCTAssertEqual(changed, "grace")

        // Ended through A: B no longer knows it.
        try await a.testable(method: .running(port: 0)).test(.GET, "/logout", headers: headers) { response async in
            XCTAssertEqual(response.body.string, "bye")
        }
        let ended = try await eventually(b, cookie, "anonymous")
        XCTAssertEqual(ended, "anonymous")

        try await a.asyncShutdown()
        try await b.asyncShutdown()
        try await cacheA.shutdown()
        try await cacheB.shutdown()
        directoryA.remove()
        directoryB.remove()
    }
}
