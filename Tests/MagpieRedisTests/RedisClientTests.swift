import MagpieTestSupport
import NIOCore
import Testing

@testable import MagpieRedis

/// A configuration for a test server on loopback, with short deadlines.
func testConfiguration(port: Int, _ adjust: (inout RedisConfiguration) -> Void = { _ in }) -> RedisConfiguration {
    var configuration = RedisConfiguration(endpoints: [RedisEndpoint(host: "127.0.0.1", port: port)])
    configuration.connectTimeout = .seconds(2)
    configuration.commandTimeout = .seconds(2)
    adjust(&configuration)
    return configuration
}

func bytes(_ buffer: ByteBuffer?) -> String? {
    buffer.map { String(buffer: $0) }
}

@Suite("RedisClient against a real redis-server", .timeLimit(.minutes(1)))
struct RedisClientTests {
    @Test("GET, SET (with expiry and conditions), DEL, EXISTS, INCR, PTTL")
    func basicCommands() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            defer { Task { await redis.shutdown() } }
            #expect(try await redis.get("missing") == nil)
            #expect(try await redis.set("k", Array("v1".utf8)))
            #expect(bytes(try await redis.get("k")) == "v1")
            #expect(try await redis.set("k", Array("v2".utf8), condition: .ifNotExists) == false)
            #expect(try await redis.set("k", Array("v3".utf8), condition: .ifExists))
            #expect(bytes(try await redis.get("k")) == "v3")
            let binary: [UInt8] = [0, 13, 10, 255, 36, 42, 13, 10]
            try await redis.set("bin", binary, expiration: .seconds(100))
            #expect(try await redis.get("bin").map { Array($0.readableBytesView) } == binary)
            let ttl = try #require(try await redis.timeToLive("bin"))
            #expect(ttl > .seconds(90) && ttl <= .seconds(100))
            #expect(try await redis.timeToLive("k") == nil)
            #expect(try await redis.exists("k"))
            #expect(try await redis.incr("n") == 1)
            #expect(try await redis.incr("n") == 2)
            #expect(try await redis.del("k", "n", "missing") == 2)
            #expect(try await redis.exists("k") == false)
            // A server error reply is a typed error, and the connection stays usable.
            await #expect {
                _ = try await redis.incr("bin")
            } throws: { error in
                (error as? RedisError)?.code == .server && (error as? RedisError)?.serverError?.kind == .generic
            }
            let wrongType = try await redis.send(batch: [RedisCommand("LPUSH", ["bin", "x"], keyIndices: [0]), .ping])
            guard case .failure(let error) = wrongType[0] else { Issue.record("LPUSH on a string succeeded"); return }
            #expect(error.serverError?.kind == .wrongType)
            #expect(try wrongType[1].get() == .simpleString("PONG"))
            try await redis.ping()
        }
    }

    @Test("every RESP3 type the server can send decodes (DEBUG PROTOCOL)")
    func everyRESP3Type() async throws {
        try await withRedisServer(.init(extraConfig: ["enable-debug-command yes"])) { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            defer { Task { await redis.shutdown() } }
            func debug(_ type: String) async throws -> RESPValue {
                try await redis.send(RedisCommand("DEBUG", ["PROTOCOL", .string(type)]))
            }
            #expect(try await debug("string") == .bulkString(ByteBuffer(string: "Hello World")))
            #expect(try await debug("integer") == .integer(12345))
            #expect(try await debug("double") == .double(3.141))
            #expect(try await debug("bignum") == .bigNumber("1234567999999999999999999999999999999"))
            #expect(try await debug("null") == .null)
            #expect(try await debug("array") == .array([.integer(0), .integer(1), .integer(2)]))
            #expect(try await debug("set") == .set([.integer(0), .integer(1), .integer(2)]))
            #expect(try await debug("map") == .map([
                RESPPair(key: .integer(0), value: .boolean(false)),
                RESPPair(key: .integer(1), value: .boolean(true)),
                RESPPair(key: .integer(2), value: .boolean(false)),
            ]))
            #expect(try await debug("true") == .boolean(true))
            #expect(try await debug("false") == .boolean(false))
            #expect(try await debug("verbatim") == .verbatimString(format: "txt", text: ByteBuffer(string: "This is a verbatim\nstring")))
            let attributed = try await debug("attrib")
            guard case .attributed(let attributes, let value) = attributed else {
                Issue.record("attrib decoded as \(attributed)")
                return
            }
            #expect(attributes.first?.key.string == "key-popularity")
            #expect(value == .bulkString(ByteBuffer(string: "Some real reply following the attribute")))
            // A push frame is not a reply: DEBUG PROTOCOL push sends one push, then the real reply.
            let afterPush = try await debug("push")
            #expect(afterPush.string == "Some real reply following the push reply")
            try await redis.ping()
        }
    }

    @Test("pipelining under concurrency: every caller gets its own reply, in order")
    func pipeliningOrder() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port) { $0.pool.maximumConnections = 3 })
            defer { Task { await redis.shutdown() } }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for task in 0..<64 {
                    group.addTask {
                        for version in 0..<40 {
                            let key = "key-\(task)"
                            let value = "\(key):v\(version)"
                            try await redis.set(key, Array(value.utf8))
                            let read = bytes(try await redis.get(key))
                            #expect(read == value)
                            #expect(try await redis.incr("counter-\(task)") == version + 1)
                        }
                    }
                }
                try await group.waitForAll()
            }
            // A batch of 2,000 commands: replies in order.
            var batch: [RedisCommand] = []
            for index in 0..<1000 {
                batch.append(.set("b\(index)", Array("value-\(index)".utf8)))
                batch.append(.get("b\(index)"))
            }
            let replies = try await redis.send(batch: batch)
            #expect(replies.count == 2000)
            for index in 0..<1000 {
                #expect(try replies[2 * index].get() == .simpleString("OK"))
                #expect(try replies[2 * index + 1].get().string == "value-\(index)")
            }
            #expect(redis.statistics.commands >= 64 * 40 * 3 + 2000)
        }
    }

    @Test("connections closed for idleness while traffic comes in bursts: no command fails, none is lost")
    func idleClosesUnderTraffic() async throws {
        try await withRedisServer { server in
            // Every connection beyond none is idle after 1 ms and checked every 2 ms: the pool closes and
            // reopens connections all the time, under the callers' feet.
            let redis = try RedisClient(testConfiguration(port: server.port) {
                $0.pool.minimumConnections = 0
                $0.pool.maximumConnections = 4
                $0.pool.idleTimeout = .milliseconds(1)
                $0.pool.healthCheckInterval = .milliseconds(2)
            })
            let tasks = 8, rounds = 150
            let failures = await withTaskGroup(of: [String].self) { group in
                for task in 0..<tasks {
                    group.addTask {
                        var failures: [String] = []
                        for round in 0..<rounds {
                            do {
                                _ = try await redis.incr("idle-counter")
                            } catch {
                                failures.append("task \(task) round \(round): \(error)")
                            }
                            if round % 3 == 0 { try? await Task.sleep(for: .milliseconds(Int.random(in: 1...6))) }
                        }
                        return failures
                    }
                }
                return await group.reduce(into: []) { $0 += $1 }
            }
            #expect(failures.isEmpty, "\(failures.prefix(5))")
            #expect(try await redis.get("idle-counter").map { String(buffer: $0) } == "\(tasks * rounds)")
            // The churn really happened: the server saw many connections come and go.
            let stats = try server.cli(["INFO", "stats"])
            let accepted = stats.split(whereSeparator: \.isNewline)
                .first { $0.hasPrefix("total_connections_received:") }
                .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
            #expect(accepted >= 5, "only \(accepted) connections")
            await redis.shutdown()
        }
    }

    @Test("HELLO with AUTH (ACL user), SETNAME, SELECT; a wrong password is a clear error")
    func authentication() async throws {
        try await withRedisServer(.init(requirePassword: "s3cret", aclUsers: [(name: "app", password: "app-pass")])) { server in
            let good = try RedisClient(testConfiguration(port: server.port) {
                $0.username = "app"
                $0.password = "app-pass"
                $0.clientName = "magpie-test"
                $0.database = 3
            })
            defer { Task { await good.shutdown() } }
            try await good.set("x", Array("in-db-3".utf8))
            let list = try await good.send(RedisCommand("CLIENT", ["LIST"]))
            #expect(list.string?.contains("name=magpie-test") == true)
            #expect(list.string?.contains("db=3") == true)
            #expect(try server.cli(["-a", "s3cret", "--no-auth-warning", "-n", "3", "GET", "x"]) == "in-db-3")

            let defaultUser = try RedisClient(testConfiguration(port: server.port) { $0.password = "s3cret" })
            defer { Task { await defaultUser.shutdown() } }
            try await defaultUser.ping()

            for bad in [("app", "wrong"), ("nobody", "x")] {
                let client = try RedisClient(testConfiguration(port: server.port) {
                    $0.username = bad.0
                    $0.password = bad.1
                    $0.breaker.failureThreshold = 100
                })
                await #expect {
                    try await client.ping()
                } throws: { error in
                    guard let error = error as? RedisError else { return false }
                    return error.code == .authenticationFailed && error.serverError?.kind == .wrongPass
                }
                await client.shutdown()
            }
            let anonymous = try RedisClient(testConfiguration(port: server.port) { $0.breaker.failureThreshold = 100 })
            await #expect {
                try await anonymous.ping()
            } throws: { error in
                (error as? RedisError)?.code == .authenticationFailed
            }
            await anonymous.shutdown()
        }
    }

    @Test("URLs: credentials, database, TLS scheme, several seeds; bad ones are errors")
    func urls() throws {
        let plain = try RedisConfiguration(url: "redis://cache.internal:6380/2")
        #expect(plain.endpoints == [RedisEndpoint(host: "cache.internal", port: 6380)])
        #expect(plain.database == 2)
        #expect(plain.tls == nil)
        let full = try RedisConfiguration(url: "rediss://app:p%40ss@10.0.0.1")
        #expect(full.username == "app")
        #expect(full.password == "p@ss")
        #expect(full.endpoints == [RedisEndpoint(host: "10.0.0.1", port: 6379)])
        #expect(full.tls != nil)
        let passwordOnly = try RedisConfiguration(url: "redis://:pw@[::1]:7000")
        #expect(passwordOnly.username == nil && passwordOnly.password == "pw")
        #expect(passwordOnly.endpoints == [RedisEndpoint(host: "::1", port: 7000)])
        let seeds = try RedisConfiguration(url: "redis://a:7000,b:7001,c")
        #expect(seeds.endpoints.map(\.description) == ["a:7000", "b:7001", "c:6379"])
        for bad in ["http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/-1", "redis://h/x", "nothing"] {
            #expect(throws: RedisError.self, "\(bad)") { try RedisConfiguration(url: bad) }
        }
    }

    @Test("the backoff grows, is capped, and jitters within its bounds")
    func backoff() {
        let backoff = RedisConfiguration.Backoff()
        #expect(backoff.delay(attempt: 0, random: 0.5) == .milliseconds(25))
        #expect(backoff.delay(attempt: 2, random: 0.5) == .milliseconds(100))
        #expect(backoff.delay(attempt: 40, random: 0.5) == .seconds(2))
        #expect(backoff.delay(attempt: 0, random: 0) == .milliseconds(20))
        #expect(backoff.delay(attempt: 1000, random: 0.999_999) <= .milliseconds(2400))
    }
}
