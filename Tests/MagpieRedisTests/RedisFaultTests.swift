import MagpieTestSupport
import NIOCore
import Synchronization
import Testing

@testable import MagpieRedis

/// What the callers of a load saw: successes, each error code, and wrong values (which must stay 0).
final class LoadTally: Sendable {
    let successes = Atomic<Int>(0)
    let wrongValues = Atomic<Int>(0)
    let errors = RedisLock<[String: Int]>([:])
    let stopped = Atomic<Bool>(false)

    func stop() { stopped.store(true, ordering: .relaxed) }

    func error(_ error: any Error) {
        let code = (error as? RedisError).map { "\($0.code)" } ?? "\(type(of: error))"
        errors.withLock { $0[code, default: 0] += 1 }
    }

    var errorCodes: Set<String> { errors.withLock { Set($0.keys) } }
}

/// Callers that each own a key, write increasing versions and read them back: a reply delivered to the
/// wrong caller shows up as a wrong value.
func runLoad(_ redis: RedisClient, tasks: Int, tally: LoadTally) async {
    await withTaskGroup(of: Void.self) { group in
        for task in 0..<tasks {
            group.addTask {
                var version = 0
                var lastWritten: String?
                while !tally.stopped.load(ordering: .relaxed), !Task.isCancelled {
                    version += 1
                    let key = "load-\(task)"
                    let value = "\(key):\(version)"
                    do {
                        try await redis.set(key, Array(value.utf8))
                        lastWritten = value
                        tally.successes.add(1, ordering: .relaxed)
                    } catch {
                        tally.error(error)
                        // The SET may or may not have run: both versions are acceptable next.
                        lastWritten = nil
                    }
                    do {
                        let read = try await redis.get(key).map { String(buffer: $0) }
                        tally.successes.add(1, ordering: .relaxed)
                        if let read {
                            let valid = read.hasPrefix("\(key):") && (lastWritten == nil || read == lastWritten)
                            if !valid { tally.wrongValues.add(1, ordering: .relaxed) }
                        }
                    } catch {
                        tally.error(error)
                    }
                    if tally.errors.withLock({ !$0.isEmpty }) {
                        // Failing calls are fast: do not spin.
                        try? await Task.sleep(for: .milliseconds(1))
                    }
                }
            }
        }
    }
}

@Suite("Redis client under failure", .serialized, .timeLimit(.minutes(2)))
struct RedisFaultTests {
    @Test("a server killed and restarted mid-load: the breaker opens and closes, no reply reaches the wrong caller")
    func killAndRestart() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port) {
                $0.commandTimeout = .milliseconds(300)
                $0.connectTimeout = .milliseconds(300)
                $0.pool.maximumConnections = 2
            })
            defer { Task { await redis.shutdown() } }
            let tally = LoadTally()
            defer { tally.stop() }
            async let load: Void = runLoad(redis, tasks: 16, tally: tally)
            try await eventually(timeout: .seconds(15)) { tally.successes.load(ordering: .relaxed) > 500 }
            server.kill()
            try await eventually(timeout: .seconds(15)) { redis.isBreakerOpen }
            let rejectedBefore = redis.statistics.breakerRejections
            try await eventually(timeout: .seconds(15)) { redis.statistics.breakerRejections > rejectedBefore + 100 }
            try server.restart()
            try await eventually(timeout: .seconds(15)) { !redis.isBreakerOpen }
            let successesAfter = tally.successes.load(ordering: .relaxed)
            try await eventually(timeout: .seconds(15)) { tally.successes.load(ordering: .relaxed) > successesAfter + 500 }
            tally.stop()
            await load
            #expect(tally.wrongValues.load(ordering: .relaxed) == 0)
            let codes = tally.errorCodes
            let allowed: Set<String> = ["connectionClosed", "connectFailed", "circuitOpen", "timedOut"]
            #expect(codes.isSubset(of: allowed), "unexpected errors: \(codes)")
            #expect(codes.contains("circuitOpen"))
            let statistics = redis.statistics
            #expect(statistics.breakerOpenings >= 1)
            #expect(statistics.reconnects >= 1)
        }
    }

    @Test("a server loading its data set: one LOADING reply holds calls for loadingHold without touching the network, then one probes; no hold sends every call")
    func loadingHold() async throws {
        // 4,000 keys read back at 1 ms each (`key-load-delay`, a real server's own setting): about 4 s
        // of LOADING, with the server answering its clients between every kilobyte it reads.
        try await withRedisServer(.init(extraConfig: ["key-load-delay 1000", "loading-process-events-interval-bytes 1024"])) { server in
            let setup = try RedisClient(testConfiguration(port: server.port))
            for start in stride(from: 0, to: 4000, by: 500) {
                _ = try await setup.send(batch: (start..<start + 500).map { RedisCommand.set("k\($0)", Array("value \($0)".utf8)) })
            }
            #expect(try await setup.send(RedisCommand("SAVE")).string == "OK")
            await setup.shutdown()
            try await offloaded { try server.restart() }

            // Held for longer than the load: after the first LOADING reply nothing more is sent.
            let held = try RedisClient(testConfiguration(port: server.port) { $0.breaker.loadingHold = .seconds(30) })
            defer { Task { await held.shutdown() } }
            // No hold: every call goes to the server.
            let unheld = try RedisClient(testConfiguration(port: server.port) { $0.breaker.loadingHold = .zero })
            defer { Task { await unheld.shutdown() } }
            func isLoading(_ client: RedisClient) async -> Bool {
                do {
                    _ = try await client.send(.ping)
                    return false
                } catch {
                    return (error as? RedisError)?.serverError?.kind == .loading
                }
            }
            #expect(await isLoading(held))
            #expect(held.failsFast && !held.isBreakerOpen)
            let sent = held.statistics.commands
            for _ in 0..<50 { #expect(await isLoading(held)) }
            #expect(held.statistics.commands == sent)
            #expect(held.statistics.loadingRejections == 50)
            for _ in 0..<50 { #expect(await isLoading(unheld)) }
            #expect(unheld.statistics.loadingRejections == 0)
            #expect(unheld.statistics.commands >= 50)

            // A short hold: calls fail at once between probes, and the first probe after the load is
            // answered.
            let probing = try RedisClient(testConfiguration(port: server.port) { $0.breaker.loadingHold = .milliseconds(50) })
            defer { Task { await probing.shutdown() } }
            let began = ContinuousClock.now
            var calls = 0
            while await isLoading(probing) {
                calls += 1
                #expect(ContinuousClock.now - began < .seconds(20))
                try await Task.sleep(for: .milliseconds(1))
            }
            let elapsed = ContinuousClock.now - began
            let probes = Double(probing.statistics.commands)
            // At most one probe per hold (and a few more for the scheduling of this loop's sleeps).
            #expect(probes <= elapsed / .milliseconds(50) + 3, "\(probes) probes in \(elapsed)")
            #expect(probing.statistics.loadingRejections > 0)
            #expect(!probing.failsFast)
            #expect(try await probing.send(.get("k1")).string == "value 1")
        }
    }

    @Test("a paused server (SIGSTOP): deadlines fire, the breaker opens; resumed, it closes and late replies are never delivered")
    func pauseAndResume() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port) {
                $0.commandTimeout = .milliseconds(200)
                $0.connectTimeout = .milliseconds(200)
            })
            defer { Task { await redis.shutdown() } }
            let tally = LoadTally()
            defer { tally.stop() }
            async let load: Void = runLoad(redis, tasks: 8, tally: tally)
            try await eventually(timeout: .seconds(15)) { tally.successes.load(ordering: .relaxed) > 300 }
            server.pause()
            let paused = ContinuousClock.now
            try await eventually(timeout: .seconds(15)) { redis.statistics.timeouts > 0 }
            // The first deadline fires within the timeout plus scheduling slack, not at some later point.
            #expect(ContinuousClock.now - paused < .seconds(2))
            try await eventually(timeout: .seconds(15)) { redis.isBreakerOpen }
            server.resume()
            try await eventually(timeout: .seconds(15)) { !redis.isBreakerOpen }
            let successesAfter = tally.successes.load(ordering: .relaxed)
            try await eventually(timeout: .seconds(15)) { tally.successes.load(ordering: .relaxed) > successesAfter + 300 }
            tally.stop()
            await load
            #expect(tally.wrongValues.load(ordering: .relaxed) == 0)
            #expect(tally.errorCodes.contains("timedOut"))
            #expect(tally.errorCodes.isSubset(of: ["connectionClosed", "connectFailed", "circuitOpen", "timedOut"]))
        }
    }

    @Test("an open breaker fails calls at once, without connecting")
    func breakerFailsFast() async throws {
        let port = try freeLoopbackPort()  // nothing listens here
        let redis = try RedisClient(testConfiguration(port: port) {
            $0.breaker.failureThreshold = 2
            // The second attempt 10 ms after the first (opening the breaker), the next probe 30 s later:
            // none during the timed calls.
            $0.reconnect.initial = .milliseconds(10)
            $0.reconnect.multiplier = 3000
            $0.reconnect.maximum = .seconds(30)
            $0.reconnect.jitter = 0
        })
        defer { Task { await redis.shutdown() } }
        // A caller while the pool backs off fails at once with the last failure, without waiting.
        let start = ContinuousClock.now
        for _ in 0..<3 { _ = try? await redis.get("k") }
        #expect(ContinuousClock.now - start < .seconds(2))
        try await eventually(timeout: .seconds(15)) { redis.isBreakerOpen }
        let failuresBefore = redis.statistics.connectFailures
        var otherOutcomes = 0
        for _ in 0..<10_000 {
            do {
                _ = try await redis.get("k")
                otherOutcomes += 1
            } catch let error as RedisError where error.code == .circuitOpen {
            } catch {
                otherOutcomes += 1
            }
        }
        #expect(otherOutcomes == 0)
        #expect(redis.statistics.connectFailures == failuresBefore)
        #expect(redis.statistics.breakerRejections >= 10_000)
    }

    @Test("malformed, oversized and deeply nested replies from a fake server: a clear error, the connection closed, the pool healthy")
    func hostileServer() async throws {
        let hostile: [(String, [UInt8])] = [
            ("bad type byte", Array("?what\r\n".utf8)),
            ("oversized bulk", Array("$99999999999\r\n".utf8)),
            ("deep nesting", Array(String(repeating: "*1\r\n", count: 200).utf8)),
            ("bulk without CRLF", Array("$3\r\nabcXY".utf8)),
            ("huge aggregate", Array("*999999999\r\n".utf8)),
        ]
        for (label, garbage) in hostile {
            let connections = Atomic<Int>(0)
            let server = try await FakeRedisServer.start { command, reply in
                switch command.first?.uppercased() {
                case "GET":
                    reply.send(garbage)
                case "PING":
                    reply.send("+PONG\r\n")
                case "HELLO":
                    break  // the fake server's own answer
                default:
                    reply.send("-ERR unknown\r\n")
                }
            }
            _ = connections
            let redis = try RedisClient(testConfiguration(port: server.port) { $0.breaker.failureThreshold = 100 })
            await #expect("\(label)") {
                _ = try await redis.get("k")
            } throws: { error in
                (error as? RedisError)?.code == .protocolViolation
            }
            // The pool replaced the connection: the next call works.
            try await eventually(timeout: .seconds(3)) { (try? await redis.ping()) != nil }
            #expect(server.acceptedConnections >= 2, "\(label)")
            await redis.shutdown()
            await server.stop()
        }
    }

    @Test("a reply nobody asked for closes the connection; a server that never answers times out and is not reused")
    func unsolicitedAndSilent() async throws {
        let server = try await FakeRedisServer.start { command, reply in
            switch command.first?.uppercased() {
            case "PING":
                reply.send("+PONG\r\n+EXTRA\r\n")  // one reply too many
            case "GET":
                break  // never answers
            default:
                reply.send("+OK\r\n")
            }
        }
        let redis = try RedisClient(testConfiguration(port: server.port) {
            $0.commandTimeout = .milliseconds(200)
            $0.breaker.failureThreshold = 100
        })
        try await redis.ping()  // answered; the extra reply then closes that connection
        try await eventually(timeout: .seconds(3)) { server.acceptedConnections >= 2 }
        let before = server.acceptedConnections
        let start = ContinuousClock.now
        await #expect {
            _ = try await redis.get("k")
        } throws: { error in
            (error as? RedisError)?.code == .timedOut
        }
        #expect(ContinuousClock.now - start < .seconds(2))
        // The timed-out connection was closed: the pool opens another.
        try await eventually(timeout: .seconds(3)) { server.acceptedConnections > before }
        await redis.shutdown()
        await server.stop()
    }
}
