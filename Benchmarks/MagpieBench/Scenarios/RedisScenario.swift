import ArgumentParser
import Foundation
import Glibc
import MagpieRedis
import MagpieTestSupport

// `magpie-bench redis`: the MagpieRedis client against `redis-benchmark` on the same server, the same
// workload and in the same invocation, so each ratio comes from one run on one host.
//
// The workload is redis-benchmark's own: `GET` / `SET` of 100-byte values on keys `key:NNNNNNNNNNNN`
// (its `-r <keys>`: twelve decimal digits, drawn uniformly from the keyspace). The keyspace is preloaded
// with 100-byte values first, so every GET of either system hits.
//
// Two modes, each with GET then SET:
//   single     one connection, one caller, one command at a time (redis-benchmark -c 1 -P 1). Latency is
//              per call.
//   pipelined  four connections, four callers, each sending batches of 16 commands and waiting for the
//              batch (redis-benchmark -c 4 -P 16). Each magpie caller owns its own one-connection client,
//              so the four really use four connections. Latency is the round trip of a whole batch, for
//              both systems (redis-benchmark measures a pipelined request the same way), not per command;
//              building the batch counts in ops/s, not in the latency.
// Every row also carries the client's CPU time per command (`client_cpu_ns_per_command`, getrusage): this
// whole process for magpie-redis, the redis-benchmark process for redis-benchmark. Unlike wall-clock
// figures it hardly moves when other work shares the two cores.
//
// Every round measures each (mode, command) with both systems back to back, alternating which goes
// first; every round is reported, so noise shows. redis-benchmark's `-n` is calibrated to run about as
// long as the magpie measurement (from the last rate seen for that workload). Nothing runs concurrently:
// on two cores the server takes one.
//
// A last row times calls failed fast by an open circuit breaker: a client of a loopback port where nothing
// listens (bound, never listening: connects are refused at once), driven until its breaker opens. The row
// times `get(key)` (the command built per call, as callers make it); `extra` adds `send(_:)` of commands
// built beforehand (the breaker's own path) and the connect attempts made meanwhile.
//
// The bars (from the issue), computed from the rows, never hard-coded:
//   pipelined GET ops/s ≥ 0.8 × redis-benchmark's (-P 16 -c 4 -t get -d 100)
//   single GET p50 ≤ 1.2 × redis-benchmark's p50 (-c 1 -P 1 -t get -d 100)
//   breaker open: a call fails within 10 µs at p99 (no connect attempt, no other error)
//
// Beside this file: the magpie-redis callers (RedisScenario+Magpie.swift), the breaker row
// (RedisScenario+Breaker.swift), redis-benchmark (RedisBenchmarkTool.swift) and the summary
// (RedisSummary.swift).

struct RedisBenchOptions: ParsableArguments {
    @Option(
        help:
            "An existing server, redis://[[user]:password@]host[:port][/db] (its keys key:000000000000… are overwritten). Default: a private redis-server on a free loopback port, without persistence, stopped at the end."
    )
    var url: String?
    @Option(help: "Length of each measurement, seconds.") var seconds = 5.0
    @Option(help: "Keyspace (redis-benchmark's -r): keys key:000000000000 …, preloaded with 100-byte values.")
    var keys = 100_000
    @Option(help: "Rounds: each measures both systems on every workload, alternating which goes first.") var rounds = 2
    @Option(help: "Calls timed with the circuit breaker open.") var breakerCalls = 100_000
    @Option(help: "Seed of the magpie callers' key draws.") var seed: UInt64 = 7
    @Option(
        help:
            "Where magpie-redis's callers run: 'task' (Swift tasks on the global executor: two thread hops per round trip), 'event-loop' (each caller a task preferring its connection's event loop, RedisEventLoopExecutor: no hop), or 'both' (both rows in every round)."
    )
    var callers: RedisCallerPlacement = .both

    func validate() throws {
        guard seconds > 0, keys >= 1, keys < 1_000_000_000_000, rounds >= 1, breakerCalls >= 1 else {
            throw ValidationError("--seconds > 0, 1 ≤ --keys < 10¹², --rounds ≥ 1, --breaker-calls ≥ 1")
        }
        if let url {
            let configuration = try RedisConfiguration(url: url)
            guard configuration.tls == nil, configuration.endpoints.count == 1 else {
                throw ValidationError("--url: one server, plain TCP (redis-benchmark runs here without TLS)")
            }
        }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("redis"),
            "server": .string(url.map(RedisBenchOptions.redacted) ?? "private redis-server"),
            "seconds": .double(seconds), "keys": .int(keys), "rounds": .int(rounds),
            "breaker_calls": .int(breakerCalls),
            "value_bytes": .int(RedisWorkload.valueBytes), "pipeline_depth": .int(RedisWorkload.Mode.pipelined.depth),
            "pipelined_connections": .int(RedisWorkload.Mode.pipelined.connections),
            "seed": .int(Int(truncatingIfNeeded: seed)),
        ]
    }

    /// The URL without its password.
    static func redacted(_ url: String) -> String {
        guard let at = url.lastIndex(of: "@"), let scheme = url.range(of: "://") else { return url }
        return String(url[..<scheme.upperBound]) + "…" + String(url[at...])
    }
}

/// Where the magpie-redis callers run.
enum RedisCallerPlacement: String, ExpressibleByArgument, Sendable, CaseIterable {
    case task, eventLoop = "event-loop", both

    var placements: [RedisCallerPlacement] { self == .both ? [.task, .eventLoop] : [self] }
}

/// One measured workload: a command in a mode.
struct RedisWorkload: Hashable, Sendable {
    static let valueBytes = 100

    enum Command: String, Sendable { case get, set }

    enum Mode: String, Sendable {
        case single, pipelined

        /// Connections (and callers) of both systems.
        var connections: Int { self == .single ? 1 : 4 }
        /// Commands per round trip.
        var depth: Int { self == .single ? 1 : 16 }
    }

    var command: Command
    var mode: Mode

    var scenario: String { "redis-\(command.rawValue)" }
    var label: String { "\(command.rawValue.uppercased()) \(mode.rawValue)" }

    static let all = [
        RedisWorkload(command: .get, mode: .single), RedisWorkload(command: .set, mode: .single),
        RedisWorkload(command: .get, mode: .pipelined), RedisWorkload(command: .set, mode: .pipelined),
    ]
}

struct RedisBenchFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// redis-benchmark's key of `n` under `-r`: `key:` and twelve decimal digits.
func redisBenchmarkKey(_ n: Int) -> [UInt8] {
    var bytes = Array("key:000000000000".utf8)
    writeRedisBenchmarkKey(n, into: &bytes)
    return bytes
}

/// Rewrites the twelve digits of a key made by ``redisBenchmarkKey(_:)`` in place: the callers draw their
/// keys this way, as redis-benchmark does, rather than from an array of 100,000 separate allocations
/// (a cache miss per command that redis-benchmark does not pay; seen in `perf`).
func writeRedisBenchmarkKey(_ n: Int, into bytes: inout [UInt8]) {
    var rest = n
    var index = bytes.count - 1
    for _ in 0..<12 {
        bytes[index] = UInt8(48 + rest % 10)
        rest /= 10
        index -= 1
    }
}

struct RedisScenario {
    let options: RedisBenchOptions

    /// Every row: per round and workload one per system, then the breaker row.
    func run(progress: (String) -> Void) async throws -> [BenchResult] {
        let benchmark = try RedisBenchmarkTool()
        let target = try await RedisTarget.open(options.url)
        do {
            let results = try await run(target: target, benchmark: benchmark, progress: progress)
            try await target.close()
            return results
        } catch {
            try? await target.close()
            throw error
        }
    }

    private func run(target: RedisTarget, benchmark: RedisBenchmarkTool, progress: (String) -> Void) async throws
        -> [BenchResult]
    {
        let keys = (0..<options.keys).map(redisBenchmarkKey)
        let value = (0..<RedisWorkload.valueBytes).map { UInt8(ascii: "a") + UInt8($0 % 26) }
        progress("redis: server \(target.description) (\(target.serverVersion)), \(benchmark.version)")
        progress("redis: preloading \(options.keys) keys with \(RedisWorkload.valueBytes)-byte values")
        try await preload(target, keys: keys, value: value)

        var results: [BenchResult] = []
        // redis-benchmark's -n comes from its own last rate on the workload, else magpie-redis's (round 1).
        var magpieRate: [RedisWorkload: Double] = [:]
        var benchmarkRate: [RedisWorkload: Double] = [:]
        for round in 1...options.rounds {
            let order = round % 2 == 1 ? ["magpie-redis", "redis-benchmark"] : ["redis-benchmark", "magpie-redis"]
            for workload in RedisWorkload.all {
                for system in order {
                    var rows: [BenchResult] = []
                    if system == "magpie-redis" {
                        for placement in options.callers.placements {
                            progress("redis round \(round): \(workload.label), magpie-redis (\(placement.rawValue) callers), \(options.seconds) s")
                            rows.append(try await measureMagpie(
                                workload, target: target, keys: keys, value: value, round: round, placement: placement))
                            magpieRate[workload] = rows.last?.ops_per_sec
                        }
                    } else {
                        let rate = benchmarkRate[workload] ?? magpieRate[workload] ?? 10_000
                        let requests = benchmark.requests(rate: rate, seconds: options.seconds, mode: workload.mode)
                        progress("redis round \(round): \(workload.label), redis-benchmark, -n \(requests)")
                        rows.append(try await benchmark.run(
                            workload, target: target, keys: options.keys, requests: requests, seconds: options.seconds))
                        benchmarkRate[workload] = rows.last?.ops_per_sec
                    }
                    for var row in rows {
                        row.extra["round"] = .int(round)
                        if let errors = row.extra["errors"]?.intValue, errors > 0 {
                            progress("redis: \(system) \(workload.label) had \(errors) error(s)")
                        }
                        results.append(row)
                    }
                }
            }
        }
        progress("redis: breaker open, \(options.breakerCalls) calls")
        results.append(try await measureBreaker(keys: keys))
        return results
    }
}

// MARK: The server

/// The server both systems measure: `--url`, or a private redis-server stopped by ``close()``.
struct RedisTarget: Sendable, CustomStringConvertible {
    let configuration: RedisConfiguration
    let serverVersion: String
    private let server: RedisServerProcess?

    var endpoint: RedisEndpoint { configuration.endpoints[0] }
    var description: String { server == nil ? "\(endpoint)" : "private, \(endpoint)" }

    static func open(_ url: String?) async throws -> RedisTarget {
        var server: RedisServerProcess?
        var configuration: RedisConfiguration
        if let url {
            configuration = try RedisConfiguration(url: url)
        } else {
            // No persistence (`save ""`, `appendonly no`), loopback, a free port, a temporary directory.
            let started = try await onOwnThread { try RedisServerProcess.start() }
            server = started
            configuration = RedisConfiguration(endpoints: [RedisEndpoint(host: started.host, port: started.port)])
        }
        configuration.connectTimeout = .seconds(2)
        configuration.commandTimeout = .seconds(2)
        do {
            let client = try RedisClient(configuration)
            let version: String
            do {
                version = try await client.connection().serverVersion
            } catch {
                await client.shutdown()
                throw error
            }
            await client.shutdown()
            return RedisTarget(configuration: configuration, serverVersion: version, server: server)
        } catch {
            if let server { try? await onOwnThread { server.stop() } }
            throw error
        }
    }

    /// Stops the private server (SIGTERM, then SIGKILL after 3 s) and removes its directory.
    func close() async throws {
        if let server { try await onOwnThread { server.stop() } }
    }
}

/// CPU time, user and system, of this process or (`children`) of its children that have been waited
/// for, in nanoseconds (getrusage(2)).
func cpuNanoseconds(children: Bool) -> UInt64 {
    var usage = rusage()
    _ = getrusage((children ? RUSAGE_CHILDREN : RUSAGE_SELF).rawValue, &usage)
    let seconds = UInt64(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
    let micros = UInt64(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec)
    return seconds * 1_000_000_000 + micros * 1_000
}

/// Runs blocking `work` (spawning, waiting for a child) on a thread of its own, not on one of the
/// cooperative pool's two.
func onOwnThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}
