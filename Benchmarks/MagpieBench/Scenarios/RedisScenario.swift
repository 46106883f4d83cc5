import ArgumentParser
import Foundation
import Glibc
import Histogram
import MagpieRedis
import MagpieTestSupport
import NIOCore
import NIOPosix

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
    var rest = n
    var index = bytes.count - 1
    while rest > 0 {
        bytes[index] = UInt8(48 + rest % 10)
        rest /= 10
        index -= 1
    }
    return bytes
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
                    if system == "magpie-redis" {
                        for placement in options.callers.placements {
                            progress("redis round \(round): \(workload.label), magpie-redis (\(placement.rawValue) callers), \(options.seconds) s")
                            var row = try await measureMagpie(
                                workload, target: target, keys: keys, value: value, round: round, placement: placement)
                            magpieRate[workload] = row.ops_per_sec
                            row.extra["round"] = .int(round)
                            if case .int(let errors) = row.extra["errors"], errors > 0 {
                                progress("redis: magpie-redis \(workload.label) had \(errors) error(s)")
                            }
                            results.append(row)
                        }
                        continue
                    }
                    var row: BenchResult
                    do {
                        let rate = benchmarkRate[workload] ?? magpieRate[workload] ?? 10_000
                        let requests = benchmark.requests(rate: rate, seconds: options.seconds, mode: workload.mode)
                        progress("redis round \(round): \(workload.label), redis-benchmark, -n \(requests)")
                        row = try await benchmark.run(
                            workload, target: target, keys: options.keys, requests: requests, seconds: options.seconds)
                        benchmarkRate[workload] = row.ops_per_sec
                    }
                    row.extra["round"] = .int(round)
                    if case .int(let errors) = row.extra["errors"], errors > 0 {
                        progress("redis: \(system) \(workload.label) had \(errors) error(s)")
                    }
                    results.append(row)
                }
            }
        }
        progress("redis: breaker open, \(options.breakerCalls) calls")
        results.append(try await measureBreaker(keys: keys))
        return results
    }

    // MARK: magpie-redis

    /// Runs `body` with `count` clients of `configuration`'s server, each of `connections` connections;
    /// shuts them down after, whether `body` returns or throws.
    private func withClients<T>(
        _ count: Int, of configuration: RedisConfiguration, connections: Int, oneEventLoop: Bool = false,
        _ body: ([RedisClient]) async throws -> T
    ) async throws -> T {
        var configuration = configuration
        configuration.pool.minimumConnections = connections
        configuration.pool.maximumConnections = connections
        var clients: [RedisClient] = []
        do {
            // One event loop for all the clients (as redis-benchmark is one thread), or NIO's default group.
            let group: any EventLoopGroup =
                oneEventLoop ? MultiThreadedEventLoopGroup.singleton.next() : MultiThreadedEventLoopGroup.singleton
            for _ in 0..<count { clients.append(try RedisClient(configuration, eventLoopGroup: group)) }
            let result = try await body(clients)
            for client in clients { await client.shutdown() }
            return result
        } catch {
            for client in clients { await client.shutdown() }
            throw error
        }
    }

    /// SETs every key in pipelined batches, then checks one value comes back whole.
    private func preload(_ target: RedisTarget, keys: [[UInt8]], value: [UInt8]) async throws {
        try await withClients(1, of: target.configuration, connections: 1) { clients in
            var start = 0
            while start < keys.count {
                let batch = keys[start..<min(keys.count, start + 1_000)].map { RedisCommand.set($0, value) }
                for reply in try await clients[0].send(batch: batch) { _ = try reply.get() }
                start += batch.count
            }
            let last = try await clients[0].get(keys[keys.count - 1])
            guard last?.readableBytes == RedisWorkload.valueBytes else {
                throw RedisBenchFailure("preload: GET of the last key returned \(String(describing: last))")
            }
        }
    }

    /// One caller's tallies.
    private struct CallerTally: Sendable {
        var latency = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        var commands = 0
        var misses = 0
        var errors = 0
        var finished: UInt64 = 0

        mutating func merge(_ other: CallerTally) {
            latency.add(other.latency)
            commands += other.commands
            misses += other.misses
            errors += other.errors
            finished = max(finished, other.finished)
        }
    }

    /// `mode.connections` callers, each with a client of one connection (so each caller has a connection
    /// of its own), sending for `options.seconds` after a short warm-up.
    private func measureMagpie(
        _ workload: RedisWorkload, target: RedisTarget, keys: [[UInt8]], value: [UInt8],
        round: Int, placement: RedisCallerPlacement
    ) async throws -> BenchResult {
        let mode = workload.mode
        let seed = options.seed &+ UInt64(round) &* 1_000_003
        let (tally, start, commandsSent, timerOverhead, cpu) = try await withClients(
            mode.connections, of: target.configuration, connections: 1, oneEventLoop: placement == .eventLoop
        ) { clients in
            // Warm-up: connections open, code paths and buffers warm. Not counted.
            _ = try await callers(
                workload, clients: clients, keys: keys, value: value, seed: ~seed, placement: placement,
                until: nowNanoseconds() + UInt64(min(0.5, options.seconds / 10) * 1e9))
            let timerOverhead = timerOverheadNanoseconds()
            let commandsBefore = clients.reduce(0) { $0 + $1.statistics.commands }
            let cpuBefore = cpuNanoseconds(children: false)
            let start = nowNanoseconds()
            let tally = try await callers(
                workload, clients: clients, keys: keys, value: value, seed: seed, placement: placement,
                until: start + UInt64(options.seconds * 1e9))
            let cpu = cpuNanoseconds(children: false) - cpuBefore
            let commandsSent = clients.reduce(0) { $0 + $1.statistics.commands } - commandsBefore
            return (tally, start, commandsSent, timerOverhead, cpu)
        }
        let seconds = Double(tally.finished - start) / 1e9
        return BenchResult(
            scenario: workload.scenario, system: "magpie-redis", threads: mode.connections, operations: tally.commands,
            seconds: seconds, ops_per_sec: Double(tally.commands) / seconds, latency_ns: Percentiles(tally.latency),
            hit_ratio: workload.command == .get
                ? Double(tally.commands - tally.misses) / Double(max(1, tally.commands)) : 0,
            extra: [
                "mode": .string(mode.rawValue), "connections": .int(mode.connections),
                "pipeline_depth": .int(mode.depth),
                "latency_of": .string(
                    mode == .single
                        ? "call (building the command included)"
                        : "batch of \(mode.depth) commands: the round trip of the whole batch, not per command (building it is not timed)"
                ),
                "callers": .string(
                    "\(mode.connections) Swift task(s), each with its own RedisClient of one connection"
                        + (placement == .eventLoop
                            ? ", all on one event loop, each preferring it (RedisEventLoopExecutor)"
                            : ", on the global executor; connections on NIO's default group")),
                "api": .string(
                    mode == .single
                        ? "RedisClient.\(workload.command.rawValue)"
                        : "RedisClient.send(batch:) of RedisCommand.\(workload.command.rawValue)"),
                "caller": .string(placement.rawValue),
                "misses": .int(tally.misses), "errors": .int(tally.errors),
                "value_bytes": .int(RedisWorkload.valueBytes),
                "keys": .int(options.keys), "client_commands": .int(Int(commandsSent)),
                "timer_overhead_ns": .int(Int(timerOverhead)),
                "client_cpu_ns_per_command": .double(Double(cpu) / Double(max(1, tally.commands))),
                "client_cpu_of": .string("this process (callers, event loops, everything), user + system"),
            ])
    }

    /// Runs one caller per client until `until` (monotonic ns); their tallies merged.
    private func callers(
        _ workload: RedisWorkload, clients: [RedisClient], keys: [[UInt8]], value: [UInt8],
        seed: UInt64, placement: RedisCallerPlacement, until end: UInt64
    ) async throws -> CallerTally {
        var executors: [RedisEventLoopExecutor] = []
        if placement == .eventLoop {
            for client in clients { executors.append(RedisEventLoopExecutor(try await client.connection().eventLoop)) }
        }
        return try await withThrowingTaskGroup(of: CallerTally.self) { group in
            for (index, client) in clients.enumerated() {
                let seed = splitmix64(seed &+ UInt64(index))
                if placement == .eventLoop {
                    group.addTask(executorPreference: executors[index]) {
                        workload.mode == .single
                            ? await Self.singleCaller(
                                workload.command, client: client, keys: keys, value: value, seed: seed, until: end)
                            : await Self.pipelinedCaller(
                                workload.command, client: client, keys: keys, value: value,
                                depth: workload.mode.depth, seed: seed, until: end)
                    }
                    continue
                }
                group.addTask {
                    workload.mode == .single
                        ? await Self.singleCaller(
                            workload.command, client: client, keys: keys, value: value, seed: seed, until: end)
                        : await Self.pipelinedCaller(
                            workload.command, client: client, keys: keys, value: value,
                            depth: workload.mode.depth, seed: seed, until: end)
                }
            }
            var total = CallerTally()
            for try await tally in group { total.merge(tally) }
            return total
        }
    }

    /// One command at a time, as a caller of `get` / `set` makes it (the command is built per call).
    private static func singleCaller(
        _ command: RedisWorkload.Command, client: RedisClient, keys: [[UInt8]],
        value: [UInt8], seed: UInt64, until end: UInt64
    ) async -> CallerTally {
        var tally = CallerTally()
        var state = seed
        let count = UInt64(keys.count)
        var now = nowNanoseconds()
        while now < end {
            state &+= 0x9e37_79b9_7f4a_7c15
            let key = keys[Int(splitmix64(state) % count)]
            let began = now
            do {
                switch command {
                case .get:
                    if try await client.get(key)?.readableBytes != RedisWorkload.valueBytes { tally.misses += 1 }
                case .set:
                    try await client.set(key, value)
                }
            } catch {
                tally.errors += 1
            }
            now = nowNanoseconds()
            tally.latency.record(now - began)
            tally.commands += 1
        }
        tally.finished = now
        return tally
    }

    /// Batches of `depth` commands with `send(batch:)`, one batch in flight; latency per batch.
    private static func pipelinedCaller(
        _ command: RedisWorkload.Command, client: RedisClient, keys: [[UInt8]],
        value: [UInt8], depth: Int, seed: UInt64, until end: UInt64
    ) async -> CallerTally {
        var tally = CallerTally()
        var state = seed
        let count = UInt64(keys.count)
        var batch: [RedisCommand] = []
        batch.reserveCapacity(depth)
        var now = nowNanoseconds()
        while now < end {
            batch.removeAll(keepingCapacity: true)
            for _ in 0..<depth {
                state &+= 0x9e37_79b9_7f4a_7c15
                let key = keys[Int(splitmix64(state) % count)]
                batch.append(command == .get ? RedisCommand.get(key) : RedisCommand.set(key, value))
            }
            let began = nowNanoseconds()  // the round trip only, as redis-benchmark times it (building counts in ops/s)
            do {
                for reply in try await client.send(batch: batch) {
                    switch (command, reply) {
                    case (.get, .success(.bulkString(let bytes))) where bytes.readableBytes == RedisWorkload.valueBytes:
                        break
                    case (.get, .success): tally.misses += 1
                    case (.set, .success(.simpleString)): break
                    default: tally.errors += 1
                    }
                }
            } catch {
                tally.errors += depth
            }
            now = nowNanoseconds()
            tally.latency.record(now - began)
            tally.commands += depth
        }
        tally.finished = now
        return tally
    }

    // MARK: Breaker

    /// Calls failed fast by an open breaker, timed one by one.
    private struct FastFailures {
        var latency = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
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
    private func measureBreaker(keys: [[UInt8]]) async throws -> BenchResult {
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
private func cpuNanoseconds(children: Bool) -> UInt64 {
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

// MARK: redis-benchmark

/// `redis-benchmark`: runs one workload with `--csv` and reads its row.
struct RedisBenchmarkTool: Sendable {
    let version: String

    init() throws {
        guard RedisTools.path(of: "redis-benchmark") != nil else {
            throw RedisBenchFailure(
                "redis-benchmark is not installed (it comes with redis-tools; `make deps` installs it)")
        }
        let output = try runTool("redis-benchmark", ["--version"])
        version = output.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `-n` for about `seconds` at `rate`, a whole number of rounds of all clients' pipelines.
    func requests(rate: Double, seconds: Double, mode: RedisWorkload.Mode) -> Int {
        let unit = mode.connections * mode.depth
        let wanted = max(Double(unit) * 16, rate * seconds)
        return (Int(wanted) + unit - 1) / unit * unit
    }

    func run(_ workload: RedisWorkload, target: RedisTarget, keys: Int, requests: Int, seconds: Double) async throws
        -> BenchResult
    {
        let endpoint = target.endpoint
        var arguments = ["-h", endpoint.host, "-p", String(endpoint.port)]
        if let password = target.configuration.password { arguments += ["-a", password] }
        if let user = target.configuration.username { arguments += ["--user", user] }
        if target.configuration.database != 0 { arguments += ["--dbnum", String(target.configuration.database)] }
        arguments += [
            "-c", String(workload.mode.connections), "-P", String(workload.mode.depth), "-t", workload.command.rawValue,
            "-d", String(RedisWorkload.valueBytes), "-r", String(keys), "-n", String(requests), "--csv",
        ]
        // Generous: a calibration far off (a slower second round) must not kill the run.
        let timeout = Duration.seconds(60) + .seconds(seconds * 10)
        let started = nowNanoseconds()
        let cpuBefore = cpuNanoseconds(children: true)
        let output = try await onOwnThread { [arguments] in try runTool("redis-benchmark", arguments, timeout: timeout)
        }
        let cpu = cpuNanoseconds(children: true) - cpuBefore
        let wall = Double(nowNanoseconds() - started) / 1e9
        let shown = arguments.map { $0 == target.configuration.password ? "…" : $0 }.joined(separator: " ")
        guard output.succeeded,
            let row = Self.parseCSV(output.standardOutput, test: workload.command.rawValue.uppercased())
        else {
            let said = (output.standardError + output.standardOutput).prefix(500)
            throw RedisBenchFailure(
                "redis-benchmark \(shown) failed (status \(output.exitStatus)\(output.timedOut ? ", timed out" : "")): \(said)"
            )
        }
        let mode = workload.mode
        return BenchResult(
            scenario: workload.scenario, system: "redis-benchmark", threads: mode.connections, operations: requests,
            seconds: Double(requests) / row.rps, ops_per_sec: row.rps,
            latency_ns: Percentiles(p50: row.p50, p90: 0, p99: row.p99, p999: 0, max: row.max),
            hit_ratio: 0,
            extra: [
                "mode": .string(mode.rawValue), "connections": .int(mode.connections),
                "pipeline_depth": .int(mode.depth),
                "latency_of": .string(
                    mode == .single
                        ? "call"
                        : "pipelined request of \(mode.depth) commands (redis-benchmark times the batch round trip)"),
                "latency_reported": .string(
                    "p50, p95, p99, max, avg, min from --csv (1 µs resolution); p90 and p99.9 not reported (0)"),
                "p95_ns": .int(Int(row.p95)), "avg_ns": .int(Int(row.avg)), "min_ns": .int(Int(row.min)),
                "arguments": .string("redis-benchmark " + shown), "wall_seconds": .double(wall),
                "version": .string(version),
                "value_bytes": .int(RedisWorkload.valueBytes), "keys": .int(keys),
                "client_cpu_ns_per_command": .double(Double(cpu) / Double(requests)),
                "client_cpu_of": .string(
                    "the redis-benchmark process (its whole run, connecting included), user + system"),
            ])
    }

    struct CSVRow: Equatable {
        var rps: Double
        var avg: UInt64
        var min: UInt64
        var p50: UInt64
        var p95: UInt64
        var p99: UInt64
        var max: UInt64
    }

    /// The row of `test` in redis-benchmark 7's CSV (`"test","rps","avg_latency_ms","min_latency_ms",
    /// "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"`), latencies in ns.
    static func parseCSV(_ text: String, test: String) -> CSVRow? {
        let lines = text.split(whereSeparator: \.isNewline).map { line in
            line.split(separator: ",").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\" ")) }
        }
        guard let header = lines.first(where: { $0.first == "test" }),
            let fields = lines.first(where: { $0.first == test && $0.count == header.count })
        else { return nil }
        func number(_ column: String) -> Double? {
            header.firstIndex(of: column).flatMap { Double(fields[$0]) }
        }
        func nanoseconds(_ column: String) -> UInt64? {
            number(column).map { UInt64(($0 * 1e6).rounded()) }
        }
        guard let rps = number("rps"), rps > 0, let avg = nanoseconds("avg_latency_ms"),
            let min = nanoseconds("min_latency_ms"),
            let p50 = nanoseconds("p50_latency_ms"), let p95 = nanoseconds("p95_latency_ms"),
            let p99 = nanoseconds("p99_latency_ms"), let max = nanoseconds("max_latency_ms")
        else { return nil }
        return CSVRow(rps: rps, avg: avg, min: min, p50: p50, p95: p95, p99: p99, max: max)
    }
}

// MARK: Summary

/// The rows side by side per round, then each bar with its ratio per round and its verdict (on the
/// median ratio over the rounds).
func printRedisSummary(_ results: [BenchResult]) {
    func string(_ row: BenchResult, _ key: String) -> String {
        if case .string(let value) = row.extra[key] { return value }
        return ""
    }
    func int(_ row: BenchResult, _ key: String) -> Int? {
        if case .int(let value) = row.extra[key] { return value }
        return nil
    }
    func micros(_ ns: UInt64) -> String { ns == 0 ? "-" : String(format: "%.1f", Double(ns) / 1e3) }
    let rows = results.filter { $0.scenario == "redis-get" || $0.scenario == "redis-set" }
    guard !rows.isEmpty || results.contains(where: { $0.scenario == "redis-breaker" }) else { return }

    func double(_ row: BenchResult, _ key: String) -> Double? {
        if case .double(let value) = row.extra[key] { return value }
        return nil
    }
    var table = [
        [
            "round", "workload", "system", "ops/s", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs", "latency of",
            "client CPU µs/cmd", "errors",
        ]
    ]
    for row in rows {
        table.append([
            String(int(row, "round") ?? 0), "\(row.scenario) \(string(row, "mode"))",
            row.system + (string(row, "caller").isEmpty ? "" : " (\(string(row, "caller")))"),
            formatRate(row.ops_per_sec), micros(row.latency_ns.p50), micros(row.latency_ns.p90),
            micros(row.latency_ns.p99), micros(row.latency_ns.p999), micros(row.latency_ns.max),
            string(row, "mode") == "single" ? "call" : "batch of \(int(row, "pipeline_depth") ?? 0)",
            double(row, "client_cpu_ns_per_command").map { String(format: "%.2f", $0 / 1e3) } ?? "-",
            int(row, "errors").map(String.init) ?? "-",
        ])
    }
    print("\nredis: magpie-redis and redis-benchmark on the same server, same workload, this run")
    printAligned(table)

    /// Per round: (magpie, redis-benchmark) rows of one scenario and mode.
    func pairs(_ scenario: String, _ mode: String, _ caller: String) -> [(round: Int, magpie: BenchResult, benchmark: BenchResult)] {
        let matching = rows.filter { $0.scenario == scenario && string($0, "mode") == mode }
        return Set(matching.compactMap { int($0, "round") }).sorted().compactMap { round in
            guard let magpie = matching.first(where: {
                    int($0, "round") == round && $0.system == "magpie-redis" && string($0, "caller") == caller
                }),
                let benchmark = matching.first(where: { int($0, "round") == round && $0.system == "redis-benchmark" })
            else { return nil }
            return (round, magpie, benchmark)
        }
    }
    func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return .nan }
        return sorted.count % 2 == 1
            ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    var bars = [["bar", "round", "magpie-redis", "redis-benchmark", "ratio", "target", "verdict"]]
    /// A ratio per round, then the median's verdict (`atLeast`: the ratio must be ≥ the bar, else ≤).
    func addRatio(
        _ title: String, _ scenario: String, _ mode: String, bar: Double?, atLeast: Bool,
        _ measure: (BenchResult) -> Double, _ show: (Double) -> String
    ) {
        for caller in ["task", "event-loop"] {
        let rounds = pairs(scenario, mode, caller)
        guard !rounds.isEmpty else { continue }
        let title = "\(title) (\(caller) callers)"
        var ratios: [Double] = []
        for pair in rounds {
            let ratio = measure(pair.magpie) / measure(pair.benchmark)
            ratios.append(ratio)
            bars.append([
                title, String(pair.round), show(measure(pair.magpie)), show(measure(pair.benchmark)),
                String(format: "%.2f", ratio), "", "",
            ])
        }
        let middle = median(ratios)
        let target = bar.map { (atLeast ? "≥ " : "≤ ") + String(format: "%.2f", $0) } ?? "(no bar)"
        let verdict = bar.map { bar in (atLeast ? middle >= bar : middle <= bar) ? "met" : "not met" } ?? "-"
        bars.append([title, "median", "", "", String(format: "%.2f", middle), target, verdict])
        }
    }
    let rate: (BenchResult) -> Double = { $0.ops_per_sec }
    let p50: (BenchResult) -> Double = { Double($0.latency_ns.p50) }
    addRatio("pipelined GET ops/s", "redis-get", "pipelined", bar: 0.8, atLeast: true, rate, formatRate)
    addRatio("single GET p50", "redis-get", "single", bar: 1.2, atLeast: false, p50) { micros(UInt64($0)) + " µs" }
    addRatio("pipelined SET ops/s", "redis-set", "pipelined", bar: nil, atLeast: true, rate, formatRate)
    addRatio("single SET p50", "redis-set", "single", bar: nil, atLeast: false, p50) { micros(UInt64($0)) + " µs" }
    let cpu: (BenchResult) -> Double = { double($0, "client_cpu_ns_per_command") ?? .nan }
    addRatio("single GET client CPU/cmd", "redis-get", "single", bar: nil, atLeast: false, cpu) {
        String(format: "%.2f µs", $0 / 1e3)
    }
    addRatio("pipelined GET client CPU/cmd", "redis-get", "pipelined", bar: nil, atLeast: false, cpu) {
        String(format: "%.2f µs", $0 / 1e3)
    }
    if let breaker = results.first(where: { $0.scenario == "redis-breaker" }) {
        let p99 = breaker.latency_ns.p99
        let clean = int(breaker, "non_circuit_open_outcomes") == 0
        let probes = int(breaker, "connect_failures_during") ?? 0
        let withinProbe = probes <= (int(breaker, "background_probe_bound") ?? 0)
        let met = p99 <= 10_000 && clean && withinProbe
        bars.append([
            "breaker open: fail-fast p99", "-", String(format: "%.2f µs", Double(p99) / 1e3), "", "",
            "≤ 10 µs", met ? "met" : "not met",
        ])
        bars.append([
            "  (p50 / p99.9 / max)", "-",
            String(
                format: "%.2f / %.2f / %.1f µs", Double(breaker.latency_ns.p50) / 1e3,
                Double(breaker.latency_ns.p999) / 1e3, Double(breaker.latency_ns.max) / 1e3), "", "", "", "",
        ])
        if case .object(let prebuilt) = breaker.extra["prebuilt_command_latency_ns"],
            case .int(let p50) = prebuilt["p50"], case .int(let p99) = prebuilt["p99"]
        {
            bars.append([
                "  send(prebuilt command) p50 / p99", "-",
                String(format: "%.2f / %.2f µs", Double(p50) / 1e3, Double(p99) / 1e3), "", "", "", "",
            ])
        }
        bars.append([
            "  other outcomes, connects during", "-",
            "\(int(breaker, "non_circuit_open_outcomes") ?? -1), \(probes)", "", "",
            "0, ≤ \(int(breaker, "background_probe_bound") ?? 0)", clean && withinProbe ? "met" : "not met",
        ])
    }
    print("\nredis: bars (ratio = magpie-redis / redis-benchmark; verdict on the median over the rounds)")
    printAligned(bars)
}
