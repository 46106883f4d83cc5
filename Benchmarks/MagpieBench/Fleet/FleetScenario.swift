import Foundation
import Magpie
import MagpieRedis
import MagpieTestSupport

/// Runs the fleet benchmark: for each system, `workers` processes against one Redis, started together,
/// then (Magpie only) the single-flight phase.
struct FleetScenario {
    let options: FleetOptions

    func run(progress: (String) -> Void) async throws -> [BenchResult] {
        let server: RedisServerProcess?
        let url: String
        if let given = options.url {
            server = nil
            url = given
        } else {
            // A private server. With --fault, with an append-only file synced on every write, so that a
            // restart keeps every write Redis acknowledged (what a removal owed during the outage must
            // still remove); without, no persistence (as a cache's Redis usually runs: an fsync per
            // write would make the write path the disk's).
            let persistence = options.fault ? ["appendonly yes", "appendfsync always"] : []
            let started = try await onOwnThread { try RedisServerProcess.start(.init(extraConfig: persistence)) }
            server = started
            url = started.url
        }
        defer { if let server { server.stop() } }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("magpie-fleet-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        // FLEET_TRACE (FleetWorker.swift): the workers' logs, with their traces, are kept there.
        let keep = ProcessInfo.processInfo.environment["FLEET_TRACE"] != nil
        if keep { progress("fleet: FLEET_TRACE set, the workers' logs stay in \(directory)") }
        defer { if !keep { try? FileManager.default.removeItem(atPath: directory) } }
        var results: [BenchResult] = []
        // Per concurrency and mix, every system (the ratio of Magpie to cache-aside is within a tasks value
        // and a mix).
        for tasks in options.tasks {
            for mix in options.runMixes {
                for system in options.systems(for: mix) {
                    try await flush(url)
                    let callers = tasks > 0 ? "\(tasks) async tasks" : "\(options.threads) threads"
                    let shares = options.shares(of: mix)
                    progress(
                        "fleet: \(system), \(options.workers) workers × \(callers), \(mix.label(removeShare: shares.remove)), "
                            + "\(options.seconds) s\(options.fault ? ", with faults" : "")")
                    results.append(try await measure(system, url: url, server: server, directory: directory, tasks: tasks, mix: mix))
                }
            }
        }
        if options.systems.contains("magpie-fleet"), options.singleFlightCallers > 0 {
            try await flush(url)
            progress("fleet: single flight, \(options.workers) workers × \(options.singleFlightCallers) callers")
            results.append(try await singleFlight(url: url, directory: directory))
        }
        return results
    }

    var scenario: String { options.fault ? "fleet-fault" : "fleet" }

    private func flush(_ url: String) async throws {
        let client = try RedisClient(try RedisConfiguration(url: url))
        defer { Task { await client.shutdown() } }
        var attempts = 0
        while true {
            do {
                _ = try await client.send(RedisCommand("FLUSHALL"))
                return
            } catch {
                attempts += 1
                if attempts > 50 { throw error }
                try await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    private func arguments(
        _ system: String, url: String, shared: String, index: Int, namespace: String, tasks: Int = 0, mix: FleetMix = .standard
    ) -> [String] {
        let shares = options.shares(of: mix)
        return [
            "fleet-worker", "--system", system, "--url", url, "--shared", shared, "--index", "\(index)",
            "--workers", "\(options.workers)", "--keys", "\(options.keys)", "--probes", "\(options.probes)",
            "--threads", "\(options.threads)", "--value-size", "\(options.valueSize)", "--zipf", "\(options.zipf)",
            "--set-share", "\(shares.set)", "--remove-share", "\(shares.remove)", "--bound-ms", "\(options.boundMs)",
            "--origin-us", "\(options.originUs)", "--probe-interval-us", "\(options.probeIntervalUs)", "--namespace", namespace,
            "--tasks", "\(tasks)", "--drop-messages", "\(options.droppedMessages)", "--own-write-probe-ms", "\(options.ownWriteProbeMs)",
        ] + (options.pubsubEcho ? ["--pubsub-echo"] : [])
    }

    /// Starts the workers and waits until every one is ready (or one exits).
    private func spawn(_ argumentsOf: (Int) -> [String], table: FleetShared, directory: String) throws -> [FleetProcess] {
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let processes = try (0..<options.workers).map { index in
            try FleetProcess(executable: executable, arguments: argumentsOf(index), log: "\(directory)/worker-\(index).log")
        }
        let deadline = monotonicNanoseconds() + 60_000_000_000
        while table.load(table.readyWord) < Int64(options.workers) {
            if let dead = processes.first(where: { !$0.process.isRunning }) {
                throw BenchError("a fleet worker exited before it was ready: \(dead.logTail())")
            }
            guard monotonicNanoseconds() < deadline else { throw BenchError("the fleet workers were not ready in 60 s") }
            usleep(5_000)
        }
        return processes
    }

    private func measure(
        _ system: String, url: String, server: RedisServerProcess?, directory: String, tasks: Int, mix: FleetMix
    ) async throws -> BenchResult {
        let path = "\(directory)/\(system).shared"
        let table = try FleetShared(path: path, keys: options.keys, probes: options.probes, workers: options.workers, create: true)
        let processes = try spawn(
            { arguments(system, url: url, shared: path, index: $0, namespace: "bench:\(system):", tasks: tasks, mix: mix) }, table: table,
            directory: directory)
        let warmup = monotonicNanoseconds() + 200_000_000
        let start = warmup + Int64(options.warmupSeconds * 1e9)
        let duration = Int64(options.seconds) * 1_000_000_000
        table.store(table.endWord, start + duration)
        table.store(table.startWord, start)
        table.store(table.warmupWord, warmup)
        // What Redis spent in the measured window: INFO before and after it (and just before a kill,
        // which resets the server's counters).
        let sampler = try FleetRedisSampler(url: url)
        async let opening = sampler.sample(at: start)
        async let closing = sampler.sample(at: start + duration)
        var faults = FaultTimeline()
        if options.fault, let server {
            faults = try await injectFaults(
                server, table: table, start: start, duration: duration, feeds: system == "magpie-fleet" || system == "local-pubsub",
                sampler: sampler)
        }
        var redis: FleetRedisStats? = nil
        if let first = await opening, let last = await closing {
            if let beforeKill = faults.beforeKill { redis = (beforeKill - first) + last } else { redis = last - first }
        }
        await sampler.close()
        let deadline = start + duration + 60_000_000_000
        let outputs = try await onOwnThread { try processes.map { try $0.finish(deadline: deadline) } }
        return aggregate(system, outputs: outputs, table: table, faults: faults, tasks: tasks, mix: mix, redis: redis)
    }

    private func singleFlight(url: String, directory: String) async throws -> BenchResult {
        let path = "\(directory)/single-flight.shared"
        let table = try FleetShared(path: path, keys: 1, probes: 1, workers: options.workers, create: true)
        let processes = try spawn(
            { arguments("magpie-fleet", url: url, shared: path, index: $0, namespace: "bench:single-flight:")
                + ["--single-flight-callers", "\(options.singleFlightCallers)"] },
            table: table, directory: directory)
        table.store(table.startWord, monotonicNanoseconds())
        table.store(table.warmupWord, monotonicNanoseconds())
        let deadline = monotonicNanoseconds() + 60_000_000_000
        let outputs = try await onOwnThread { try processes.map { try $0.finish(deadline: deadline) } }
        let runs = Int(table.load(4))
        let leases = outputs.map { if case .int(let v)? = $0["leases"] { v } else { 0 } }.reduce(0, +)
        let errors = outputs.map { if case .int(let v)? = $0["caller_errors"] { v } else { 0 } }.reduce(0, +)
        return BenchResult(
            scenario: scenario, system: "magpie-fleet", threads: options.workers, operations: options.workers * options.singleFlightCallers,
            seconds: 0, ops_per_sec: 0, latency_ns: .zero, hit_ratio: 0,
            extra: [
                "single_flight": .bool(true), "loader_runs": .int(runs), "leases": .int(leases), "caller_errors": .int(errors),
                "loader_runs_per_lease": .double(Double(runs) / Double(max(1, leases))),
            ])
    }
}

/// A worker process: its stdout (one JSON object at the end) and a log file for its stderr.
final class FleetProcess: @unchecked Sendable {
    // @unchecked Sendable invariant: used by one thread at a time (spawned, then finished).
    let process = Process()
    let output = Pipe()
    let log: String

    init(executable: String, arguments: [String], log: String) throws {
        self.log = log
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardOutput = output
        process.standardError = FileHandle(forWritingAtPath: log)
        try process.run()
    }

    func logTail() -> String {
        String(((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").suffix(2000))
    }

    /// Waits for the worker to exit and returns its JSON object; a worker still running at `deadline`
    /// (monotonic ns) is terminated (and reported failed).
    func finish(deadline: Int64) throws -> [String: JSONValue] {
        let process = self.process
        let watchdog = DispatchWorkItem { if process.isRunning { process.terminate() } }
        DispatchQueue.global().asyncAfter(
            deadline: .now() + .nanoseconds(Int(max(0, deadline - monotonicNanoseconds()))), execute: watchdog)
        defer { watchdog.cancel() }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw BenchError("a fleet worker failed (status \(process.terminationStatus)): \(logTail())")
        }
        let line = String(decoding: data, as: UTF8.self).split(separator: "\n").last.map(String.init) ?? ""
        guard case .object(let object) = try JSONDecoder().decode(JSONValue.self, from: Data(line.utf8)) else {
            throw BenchError("a fleet worker printed no JSON object: \(line.prefix(200))")
        }
        return object
    }
}
