import Foundation
import MagpieTestSupport

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
