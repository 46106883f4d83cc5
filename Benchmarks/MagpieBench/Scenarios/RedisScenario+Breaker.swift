import Glibc
import Histogram
import MagpieRedis

// `magpie-bench redis`, the last row: calls failed fast by an open circuit breaker, against a loopback
// port where nothing listens.

extension RedisScenario {
    // MARK: Breaker

    /// Calls failed fast by an open breaker, timed one by one.
    private struct FastFailures {
        var latency = latencyHistogram()
        /// Calls that did not throw `circuitOpen` (another error, or a reply).
        var otherOutcomes = 0
        var elapsed: UInt64 = 0
    }

    /// Times `calls` calls of `call` (given the call's number).
    private static func timeFastFailures(_ calls: Int, _ call: (Int) async throws -> Void) async -> FastFailures {
        var result = FastFailures()
        let start = nowNanoseconds()
        for n in 0..<calls {
            let began = nowNanoseconds()
            do {
                try await call(n)
                result.otherOutcomes += 1
            } catch let error as RedisError where error.code == .circuitOpen {
            } catch {
                result.otherOutcomes += 1
            }
            result.latency.record(nowNanoseconds() - began)
        }
        result.elapsed = nowNanoseconds() - start
        return result
    }

    /// Calls of a client whose breaker is open: each must fail at once with `circuitOpen`, without a
    /// connect attempt beyond the pool's background probe. The row times `get(key)` as a caller makes it
    /// (the command is built per call); `extra.prebuilt_command_latency_ns` times `send(_:)` of commands
    /// built beforehand, which isolates the breaker's own path from building the command.
    func measureBreaker(keys: [[UInt8]]) async throws -> BenchResult {
        let refusing = try RefusingPort()
        defer { withExtendedLifetime(refusing) {} }  // bound until the measurement ends
        var configuration = RedisConfiguration(endpoints: [RedisEndpoint(host: "127.0.0.1", port: refusing.port)])
        configuration.pool.minimumConnections = 1
        configuration.pool.maximumConnections = 1
        configuration.breaker.failureThreshold = 2
        configuration.connectTimeout = .milliseconds(500)
        let calls = options.breakerCalls
        let prebuilt = keys.prefix(1_000).map { RedisCommand.get($0) }
        struct Outcome {
            var asCalled: FastFailures
            var prebuilt: FastFailures
            var before: RedisClientStatistics
            var after: RedisClientStatistics
            var stillOpen: Bool
            var timerOverhead: UInt64
        }
        let outcome = try await withClients(1, of: configuration, connections: 1) { clients in
            let client = clients[0]
            let deadline = nowNanoseconds() + 10_000_000_000
            while !client.isBreakerOpen {
                guard nowNanoseconds() < deadline else {
                    throw RedisBenchFailure("breaker: still closed after 10 s of refused connects")
                }
                _ = try? await client.get(keys[0])
            }
            // Warm-up, not counted.
            _ = await Self.timeFastFailures(min(10_000, calls)) { _ = try await client.get(keys[$0 % keys.count]) }
            let timerOverhead = timerOverheadNanoseconds()
            let before = client.statistics
            let asCalled = await Self.timeFastFailures(calls) { _ = try await client.get(keys[$0 % keys.count]) }
            let fast = await Self.timeFastFailures(calls) { _ = try await client.send(prebuilt[$0 % prebuilt.count]) }
            return Outcome(
                asCalled: asCalled, prebuilt: fast, before: before, after: client.statistics,
                stillOpen: client.isBreakerOpen, timerOverhead: timerOverhead)
        }
        // The pool's probe reconnects one attempt at a time on the backoff schedule: at most one attempt
        // per `reconnect.initial` (the shortest wait) during the loops, plus one already under way.
        let elapsed = outcome.asCalled.elapsed + outcome.prebuilt.elapsed
        let initialBackoff = configuration.reconnect.initial.components
        let initialNs =
            UInt64(initialBackoff.seconds) * 1_000_000_000 + UInt64(initialBackoff.attoseconds / 1_000_000_000)
        let probeBound = Int(elapsed / max(1, initialNs)) + 1
        let seconds = Double(outcome.asCalled.elapsed) / 1e9
        let (before, after) = (outcome.before, outcome.after)
        return BenchResult(
            scenario: "redis-breaker", system: "magpie-redis", threads: 1, operations: calls, seconds: seconds,
            ops_per_sec: Double(calls) / seconds, latency_ns: Percentiles(outcome.asCalled.latency), hit_ratio: 0,
            extra: [
                "mode": .string("single"),
                "latency_of": .string(
                    "call of RedisClient.get(key) failed fast with circuitOpen (command built per call)"),
                "calls": .int(calls),
                "non_circuit_open_outcomes": .int(outcome.asCalled.otherOutcomes + outcome.prebuilt.otherOutcomes),
                "prebuilt_command_latency_ns": Percentiles(outcome.prebuilt.latency).json,
                "breaker_rejections": .int(Int(after.breakerRejections - before.breakerRejections)),
                "connect_failures_during": .int(Int(after.connectFailures - before.connectFailures)),
                "background_probe_bound": .int(probeBound), "breaker_open_after": .bool(outcome.stillOpen),
                "failure_threshold": .int(configuration.breaker.failureThreshold),
                "timer_overhead_ns": .int(Int(outcome.timerOverhead)),
            ])
    }
}

/// A loopback TCP port bound but never listened on: connects to it are refused at once. Closed when freed.
private final class RefusingPort {
    let port: Int
    private let descriptor: Int32

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw RedisBenchFailure("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                bind(fd, raw, length) == 0 && getsockname(fd, raw, &length) == 0
            }
        }
        guard bound else {
            let code = errno
            Glibc.close(fd)
            throw RedisBenchFailure("bind to a loopback port: errno \(code)")
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { Glibc.close(descriptor) }
}
