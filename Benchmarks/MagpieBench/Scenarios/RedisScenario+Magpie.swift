import Histogram
import MagpieRedis
import NIOCore
import NIOPosix

// `magpie-bench redis`, the magpie-redis side: clients of one connection each, the preload, and the
// callers that send one command at a time or pipelined batches (see the notes in RedisScenario.swift).

extension RedisScenario {
    // MARK: magpie-redis

    /// Runs `body` with `count` clients of `configuration`'s server, each of `connections` connections;
    /// shuts them down after, whether `body` returns or throws.
    func withClients<T>(
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
    func preload(_ target: RedisTarget, keys: [[UInt8]], value: [UInt8]) async throws {
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
        var latency = latencyHistogram()
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
    func measureMagpie(
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
                let caller: @Sendable () async -> CallerTally = {
                    workload.mode == .single
                        ? await Self.singleCaller(
                            workload.command, client: client, keys: keys, value: value, seed: seed, until: end)
                        : await Self.pipelinedCaller(
                            workload.command, client: client, keys: keys, value: value,
                            depth: workload.mode.depth, seed: seed, until: end)
                }
                // nil: the global executor (task callers).
                group.addTask(executorPreference: placement == .eventLoop ? executors[index] : nil) { await caller() }
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
        var key = redisBenchmarkKey(0)
        var now = nowNanoseconds()
        while now < end {
            state &+= 0x9e37_79b9_7f4a_7c15
            writeRedisBenchmarkKey(Int(splitmix64(state) % count), into: &key)
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
        var key = redisBenchmarkKey(0)
        var now = nowNanoseconds()
        while now < end {
            batch.removeAll(keepingCapacity: true)
            for _ in 0..<depth {
                state &+= 0x9e37_79b9_7f4a_7c15
                writeRedisBenchmarkKey(Int(splitmix64(state) % count), into: &key)
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
}
