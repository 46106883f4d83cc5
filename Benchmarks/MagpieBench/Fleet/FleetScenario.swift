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
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var results: [BenchResult] = []
        // Per concurrency, every system (the ratio of Magpie to cache-aside is within a tasks value).
        for tasks in options.tasks {
            for system in options.systems {
                try await flush(url)
                let callers = tasks > 0 ? "\(tasks) async tasks" : "\(options.threads) threads"
                progress("fleet: \(system), \(options.workers) workers × \(callers), \(options.seconds) s\(options.fault ? ", with faults" : "")")
                results.append(try await measure(system, url: url, server: server, directory: directory, tasks: tasks))
            }
        }
        if options.systems.contains("magpie-fleet"), options.singleFlightCallers > 0 {
            try await flush(url)
            progress("fleet: single flight, \(options.workers) workers × \(options.singleFlightCallers) callers")
            results.append(try await singleFlight(url: url, directory: directory))
        }
        return results
    }

    private var scenario: String { options.fault ? "fleet-fault" : "fleet" }

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

    private func arguments(_ system: String, url: String, shared: String, index: Int, namespace: String, tasks: Int = 0) -> [String] {
        [
            "fleet-worker", "--system", system, "--url", url, "--shared", shared, "--index", "\(index)",
            "--workers", "\(options.workers)", "--keys", "\(options.keys)", "--probes", "\(options.probes)",
            "--threads", "\(options.threads)", "--value-size", "\(options.valueSize)", "--zipf", "\(options.zipf)",
            "--set-share", "\(options.setShare)", "--remove-share", "\(options.removeShare)", "--bound-ms", "\(options.boundMs)",
            "--origin-us", "\(options.originUs)", "--probe-interval-us", "\(options.probeIntervalUs)", "--namespace", namespace,
            "--tasks", "\(tasks)",
        ]
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

    private func measure(_ system: String, url: String, server: RedisServerProcess?, directory: String, tasks: Int) async throws
        -> BenchResult
    {
        let path = "\(directory)/\(system).shared"
        let table = try FleetShared(path: path, keys: options.keys, probes: options.probes, workers: options.workers, create: true)
        let processes = try spawn(
            { arguments(system, url: url, shared: path, index: $0, namespace: "bench:\(system):", tasks: tasks) }, table: table,
            directory: directory)
        let warmup = monotonicNanoseconds() + 200_000_000
        let start = warmup + Int64(options.warmupSeconds * 1e9)
        let duration = Int64(options.seconds) * 1_000_000_000
        table.store(table.endWord, start + duration)
        table.store(table.startWord, start)
        table.store(table.warmupWord, warmup)
        var faults = FaultTimeline()
        if options.fault, let server {
            faults = try await injectFaults(
                server, table: table, start: start, duration: duration, feeds: system == "magpie-fleet")
        }
        let deadline = start + duration + 60_000_000_000
        let outputs = try await onOwnThread { try processes.map { try $0.finish(deadline: deadline) } }
        return aggregate(system, outputs: outputs, table: table, faults: faults, tasks: tasks)
    }

    /// Kills Redis at 30 % of the run (restarted 2 s later) and pauses it at 65 % (1.5 s); after each
    /// return, the time until every worker's change feed is confirmed again (`feeds`: only Magpie has
    /// one; the other systems are not waited for, so that their pause too falls inside the run). The
    /// instants go to the shared table too: the workers tally their memory hits and stores in the pause
    /// apart.
    private func injectFaults(_ server: RedisServerProcess, table: FleetShared, start: Int64, duration: Int64, feeds: Bool)
        async throws -> FaultTimeline
    {
        var timeline = FaultTimeline()
        func sleep(until instant: Int64) async throws {
            let remaining = instant - monotonicNanoseconds()
            if remaining > 0 { try await Task.sleep(for: .nanoseconds(remaining)) }
        }
        func recovered(after back: Int64) async throws -> Double {
            guard feeds else { return 0 }
            // 10 s at most; and not past the run's end, after which the workers no longer report (10
            // then means: not recovered within the run).
            let deadline = min(back + 10_000_000_000, start + duration + 100_000_000)
            while monotonicNanoseconds() < deadline {
                let statuses = (0..<options.workers).map { table.load(table.statusWord(worker: $0)) }
                if statuses.allSatisfy({ $0 > back }) { return Double((statuses.max() ?? back) - back) / 1e9 }
                try await Task.sleep(for: .milliseconds(5))
            }
            return 10
        }
        let only = ProcessInfo.processInfo.environment["FLEET_FAULT"]
        if only != "pause" {
            try await sleep(until: start + duration * 3 / 10)
            let down = monotonicNanoseconds()
            table.store(table.downBeganWord, down)
            try await onOwnThread { server.kill() }
            try await Task.sleep(for: .seconds(2))
            try await onOwnThread { try server.restart() }
            let back = monotonicNanoseconds()
            table.store(table.downEndedWord, back)
            timeline.add(down: down, back: back, recovery: try await recovered(after: back))
        }
        if only == "kill" { return timeline }
        try await sleep(until: start + duration * 65 / 100)
        let paused = monotonicNanoseconds()
        table.store(table.pauseBeganWord, paused)
        try await onOwnThread { server.pause() }
        try await Task.sleep(for: .milliseconds(1500))
        try await onOwnThread { server.resume() }
        let resumed = monotonicNanoseconds()
        table.store(table.pauseEndedWord, resumed)
        timeline.add(down: paused, back: resumed, recovery: try await recovered(after: resumed))
        timeline.pause = (paused, resumed)
        return timeline
    }

    private func aggregate(_ system: String, outputs: [[String: JSONValue]], table: FleetShared, faults: FaultTimeline, tasks: Int)
        -> BenchResult
    {
        let recoveries = faults.recoveries
        var sums: [String: Int] = [:]
        var reads = LogHistogram()
        var all = LogHistogram()
        var phases: [String: LogHistogram] = [:]  // memory hits and stores, Redis running and paused
        for output in outputs {
            for (key, value) in output {
                switch value {
                case .int(let v): sums[key, default: 0] += v
                case .array(let counts) where key == "read_latency":
                    reads.merge(counts.map { if case .int(let c) = $0 { c } else { 0 } })
                case .array(let counts) where key == "all_latency":
                    all.merge(counts.map { if case .int(let c) = $0 { c } else { 0 } })
                case .array(let counts) where key.hasSuffix("_running") || key.hasSuffix("_paused"):
                    phases[key, default: LogHistogram()].merge(counts.map { if case .int(let c) = $0 { c } else { 0 } })
                default: break
                }
            }
        }
        let operations = all.total
        let readCount = max(1, sums["reads", default: 0])
        var extra: [String: JSONValue] = [:]
        for key in ["reads", "writes", "removes", "origin_calls", "caller_errors", "wrong_values", "remote_errors", "invalidations",
                    "epoch_bumps", "owed_removals", "replayed_removals", "stale_from_remote", "store_hits", "unkept", "withheld", "fenced"] {
            if let v = sums[key] { extra[key] = .int(v) }
        }
        // Stale and resurrected reads: those that started while Redis was down or within the 2 s its
        // return is allowed (the fault bar) are reported apart from all the others.
        func instants(_ key: String) -> [Int64] {
            outputs.flatMap { output -> [Int64] in
                guard case .array(let values)? = output[key] else { return [] }
                return values.compactMap { if case .int(let v) = $0 { Int64(v) } else { nil } }
            }
        }
        for (key, name) in [("stale_at", "stale_reads"), ("resurrected_at", "resurrected_removals")] {
            let all = instants(key)
            let during = all.filter { faults.covers($0) }.count
            let total = sums[name == "stale_reads" ? "stale_reads_beyond_bound" : "resurrected_removals", default: 0]
            extra[name == "stale_reads" ? "stale_reads_beyond_bound" : "resurrected_removals"] = .int(total - during)
            if options.fault { extra[name + "_during_outage"] = .int(during) }
        }
        // The pause window's tallies: from the SIGSTOP to 2 s after the SIGCONT (a write that timed out
        // in the pause runs when Redis resumes: what it brings back is read after the pause), as the
        // outage's counts above. At most `FleetTally.instantsKept` instants per caller and kind.
        if let pause = faults.pause {
            let window = pause.began...(pause.ended + FaultTimeline.grace)
            extra["pause_seconds"] = .double(Double(pause.ended - pause.began) / 1e9)
            extra["pause_grace_seconds"] = .double(Double(FaultTimeline.grace) / 1e9)
            extra["pause_caller_errors"] = .int(instants("caller_error_at").filter { window.contains($0) }.count)
            extra["pause_stale_beyond_bound"] = .int(instants("stale_at").filter { window.contains($0) }.count)
            extra["pause_resurrected"] = .int(instants("resurrected_at").filter { window.contains($0) }.count)
        }
        extra["hit_ratio_memory"] = .double(Double(sums["memory_hits", default: 0]) / Double(readCount))
        extra["hit_ratio_disk"] = .double(Double(sums["disk_hits", default: 0]) / Double(readCount))
        extra["hit_ratio_remote"] = .double(Double(sums["remote_hits", default: 0]) / Double(readCount))
        extra["operation_latency_ns"] = all.percentiles.json
        extra["tasks"] = .int(tasks)
        // The pause rows: callers' memory hits and stores that overlapped the SIGSTOP, beside those while
        // Redis ran (neither paused nor killed); also flat (`pause_hit_p99_ns`, `running_store_p50_ns`, …).
        for (key, histogram) in phases where histogram.total > 0 {
            let percentiles = histogram.percentiles
            extra[key + "_ns"] = percentiles.json
            extra[key + "_count"] = .int(histogram.total)
            let kind = key.hasPrefix("hit") ? "hit" : "store"
            let phase = key.hasSuffix("_paused") ? "pause" : "running"
            for (name, value) in [("p50", percentiles.p50), ("p99", percentiles.p99), ("max", percentiles.max)] {
                extra["\(phase)_\(kind)_\(name)_ns"] = .int(Int(value))
            }
        }
        // Recovery is the time until every worker's change feed is confirmed again: only Magpie has one.
        if system == "magpie-fleet" {
            extra["recovery_seconds"] = .double(recoveries.max() ?? 0)
            if !recoveries.isEmpty { extra["recoveries_seconds"] = .array(recoveries.map { .double($0) }) }
        }
        if system == "magpie-fleet" {
            let (lag, lost, early) = invalidationLag(table)
            extra["invalidation_lag_ns"] = lag.percentiles.json
            extra["lag_probes"] = .int(lag.total)
            extra["lag_probes_never_dropped"] = .int(lost)
            extra["lag_probes_dropped_before_return"] = .int(early)
        }
        let seconds = Double(options.seconds)
        return BenchResult(
            scenario: scenario, system: system, threads: options.workers * (tasks > 0 ? tasks : options.threads), operations: operations,
            seconds: seconds, ops_per_sec: Double(operations) / seconds, latency_ns: reads.percentiles,
            hit_ratio: 1 - Double(sums["origin_calls", default: 0]) / Double(readCount), extra: extra)
    }

    /// Per probe: from its write returning to the last other worker dropping it (0 when they all
    /// dropped it before the writer saw its reply). Probes some worker never dropped are counted apart.
    private func invalidationLag(_ table: FleetShared) -> (LogHistogram, Int, Int) {
        var lag = LogHistogram()
        var lost = 0
        var early = 0
        for probe in 0..<table.probes {
            let written = table.load(table.probeWord(probe, 0))
            guard written > 0 else { continue }
            let writer = probe % options.workers
            var last: Int64 = 0
            var missing = false
            for worker in 0..<options.workers where worker != writer {
                let dropped = table.load(table.probeWord(probe, 1 + worker))
                if dropped == 0 { missing = true } else { last = max(last, dropped) }
            }
            if missing {
                lost += 1
                continue
            }
            if last < written { early += 1 }
            lag.record(max(0, last - written))
        }
        return (lag, lost, early)
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

/// When Redis was down (killed or paused) during a run, and how long every worker took to be confirmed
/// again after each return.
struct FaultTimeline {
    var windows: [(down: Int64, back: Int64)] = []
    var recoveries: [Double] = []
    /// The SIGSTOP window (one of `windows`).
    var pause: (began: Int64, ended: Int64)? = nil
    /// How long after Redis's return reads may still see the outage's effects (the fault bar: coherence
    /// back within 2 s).
    static let grace: Int64 = 2_000_000_000

    mutating func add(down: Int64, back: Int64, recovery: Double) {
        windows.append((down, back))
        recoveries.append(recovery)
    }

    func covers(_ instant: Int64) -> Bool {
        windows.contains { instant >= $0.down && instant <= $0.back + Self.grace }
    }
}
