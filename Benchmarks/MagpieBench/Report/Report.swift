import Foundation
import Histogram

/// A JSON value for the open-ended parts of the report (`config`, `extra`).
enum JSONValue: Codable, Sendable, Equatable {
    case int(Int)
    case double(Double)
    case string(String)
    case bool(Bool)
    case array([JSONValue])
    case object([String: JSONValue])

    func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .int(let v): try container.encode(v)
        case .double(let v): try container.encode(v.isFinite ? v : 0)
        case .string(let v): try container.encode(v)
        case .bool(let v): try container.encode(v)
        case .array(let v): try container.encode(v)
        case .object(let v): try container.encode(v)
        }
    }

    init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let v = try? container.decode(Int.self) { self = .int(v) }
        else if let v = try? container.decode(Double.self) { self = .double(v) }
        else if let v = try? container.decode(Bool.self) { self = .bool(v) }
        else if let v = try? container.decode(String.self) { self = .string(v) }
        else if let v = try? container.decode([JSONValue].self) { self = .array(v) }
        else { self = .object(try container.decode([String: JSONValue].self)) }
    }

    var intValue: Int? { if case .int(let v) = self { v } else { nil } }
    /// An int or a double.
    var numberValue: Double? {
        switch self {
        case .int(let v): Double(v)
        case .double(let v): v
        default: nil
        }
    }
    var stringValue: String? { if case .string(let v) = self { v } else { nil } }
    var objectValue: [String: JSONValue]? { if case .object(let v) = self { v } else { nil } }
}

/// One measured (scenario, system, threads) row of the report, as in DESIGN.md's contract.
struct BenchResult: Codable, Sendable {
    var scenario: String
    var system: String
    var threads: Int
    var operations: Int
    var seconds: Double
    var ops_per_sec: Double
    var latency_ns: Percentiles
    var hit_ratio: Double
    var extra: [String: JSONValue]
}

struct Machine: Codable, Sendable {
    var cores: Int
    var os: String
    var cpu: String
    var memory_bytes: Int
    var swift: String

    static func current() -> Machine {
        let info = ProcessInfo.processInfo
        let cpu =
            (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
            .split(separator: "\n").first { $0.hasPrefix("model name") }
            .map { String($0.split(separator: ":", maxSplits: 1).last ?? "").trimmingCharacters(in: .whitespaces) }
            ?? "unknown"
        #if swift(>=6.3)
            let swift = "6.3+"
        #else
            let swift = "6.x"
        #endif
        return Machine(
            cores: info.activeProcessorCount, os: info.operatingSystemVersionString, cpu: cpu,
            memory_bytes: Int(info.physicalMemory), swift: swift)
    }
}

struct Report: Codable, Sendable {
    var tool = "magpie-bench"
    var version = magpieBenchVersion
    var date: String
    var machine: Machine
    var config: [String: JSONValue]
    var results: [BenchResult]
    /// The commit the suite was built from (`Provenance.commit()`); nil in reports of older builds and of
    /// single commands.
    var commit: String? = nil
    /// Per scenario, the command line that reproduces its rows alone (`magpie-bench memory --hot-keys 16`);
    /// written by the suite, read by `report --markdown`.
    var commands: [String: String]? = nil

    func write(to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        let url = URL(fileURLWithPath: path)
        try FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try encoder.encode(self).write(to: url)
    }
}

let magpieBenchVersion = "0.1.0"

/// The human table: one row per result.
func resultsTable(_ results: [BenchResult]) -> Table {
    var table = Table(nil, [
        "scenario", "system", "threads", "ops/s", "min ops/s", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "max ns", "hit ratio",
    ])
    for r in results {
        // Latency not measured (the RocksDB peer, a simulation): shown as "-".
        let latency = [r.latency_ns.p50, r.latency_ns.p90, r.latency_ns.p99, r.latency_ns.p999, r.latency_ns.max].map {
            r.latency_ns.max == 0 ? "-" : String($0)
        }
        let minimum = r.extra["ops_per_sec_min"]?.numberValue.map(formatRate) ?? "-"
        let system = r.extra["hot_keys"]?.intValue.map { "\(r.system) (\($0) keys)" } ?? r.system
        table.append([r.scenario, system, String(r.threads), formatRate(r.ops_per_sec), minimum] + latency + [String(format: "%.4f", r.hit_ratio)])
    }
    return table
}

func formatRate(_ rate: Double) -> String {
    rate >= 1e6 ? String(format: "%.2f M", rate / 1e6) : String(format: "%.0f k", rate / 1e3)
}

/// Nanoseconds, as µs from 10 µs on.
func formatNanoseconds(_ value: Double) -> String {
    value >= 10_000 ? String(format: "%.1f µs", value / 1000) : String(format: "%.0f ns", value)
}

/// Nanoseconds as microseconds, one decimal.
func micros(_ ns: UInt64) -> String { String(format: "%.1f", Double(ns) / 1000) }

/// Runs `executable` with `arguments` to its end: its exit status and standard output (its standard error
/// passes through, or with `quiet` is dropped).
func runProcess(_ executable: String, _ arguments: [String], quiet: Bool = false) throws -> (status: Int32, output: Data) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    if quiet { process.standardError = FileHandle.nullDevice }
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, data)
}

/// The process's resident set size, from /proc/self/statm.
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Monotonic nanoseconds (vDSO clock_gettime).
@inline(__always)
func nowNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

/// The median cost of one `nowNanoseconds()` pair, included in every latency sample.
func timerOverheadNanoseconds() -> UInt64 {
    var samples = [UInt64](repeating: 0, count: 10_001)
    for i in samples.indices {
        let a = nowNanoseconds()
        let b = nowNanoseconds()
        samples[i] = b &- a
    }
    return percentile(50, of: samples) ?? 0
}

/// The values in the order they first appear, each once.
func distinct<T: Equatable>(_ values: [T]) -> [T] {
    var seen: [T] = []
    for value in values where !seen.contains(value) { seen.append(value) }
    return seen
}
