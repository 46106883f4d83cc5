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
}

/// Latency percentiles in nanoseconds (keys stable: tuning scripts read them).
struct Percentiles: Codable, Sendable, Equatable {
    var p50: UInt64
    var p90: UInt64
    var p99: UInt64
    var p999: UInt64
    var max: UInt64

    /// No latency measured (a simulation).
    static let zero = Percentiles(p50: 0, p90: 0, p99: 0, p999: 0, max: 0)

    init(p50: UInt64, p90: UInt64, p99: UInt64, p999: UInt64, max: UInt64) {
        (self.p50, self.p90, self.p99, self.p999, self.max) = (p50, p90, p99, p999, max)
    }

    init(_ histogram: Histogram<UInt64>) {
        p50 = histogram.valueAtPercentile(50)
        p90 = histogram.valueAtPercentile(90)
        p99 = histogram.valueAtPercentile(99)
        p999 = histogram.valueAtPercentile(99.9)
        max = histogram.max
    }

    var json: JSONValue {
        .object([
            "p50": .int(Int(p50)), "p90": .int(Int(p90)), "p99": .int(Int(p99)),
            "p999": .int(Int(p999)), "max": .int(Int(max)),
        ])
    }
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
func printTable(_ results: [BenchResult]) {
    let header = [
        "scenario", "system", "threads", "ops/s", "min ops/s", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "max ns", "hit ratio",
    ]
    var rows = [header]
    for r in results {
        // Latency not measured (the RocksDB peer, a simulation): shown as "-".
        let latency = [r.latency_ns.p50, r.latency_ns.p90, r.latency_ns.p99, r.latency_ns.p999, r.latency_ns.max].map {
            r.latency_ns.max == 0 ? "-" : String($0)
        }
        var minimum = "-"
        if case .double(let rate) = r.extra["ops_per_sec_min"] { minimum = formatRate(rate) }
        let system = r.extra["hot_keys"].map { key -> String in
            if case .int(let n) = key { return "\(r.system) (\(n) keys)" }
            return r.system
        } ?? r.system
        rows.append([r.scenario, system, String(r.threads), formatRate(r.ops_per_sec), minimum] + latency + [String(format: "%.4f", r.hit_ratio)])
    }
    printAligned(rows)
}

func formatRate(_ rate: Double) -> String {
    rate >= 1e6 ? String(format: "%.2f M", rate / 1e6) : String(format: "%.0f k", rate / 1e3)
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
    samples.sort()
    return samples[samples.count / 2]
}

/// Prints rows as a table: first two columns left-aligned, the rest right-aligned.
func printAligned(_ rows: [[String]]) {
    guard let header = rows.first else { return }
    let widths = (0..<header.count).map { column in rows.map { $0[column].count }.max() ?? 0 }
    for (n, row) in rows.enumerated() {
        let line = row.enumerated().map { column, cell in
            column < 2 ? cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                : String(repeating: " ", count: widths[column] - cell.count) + cell
        }.joined(separator: "  ")
        print(line)
        if n == 0 { print(String(repeating: "-", count: line.count)) }
    }
}
