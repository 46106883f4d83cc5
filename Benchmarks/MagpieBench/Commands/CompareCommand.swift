import ArgumentParser
import Foundation

/// `magpie-bench compare A.json B.json`: the rows of two reports side by side, with B's change against
/// A, and a non-zero exit status when a chosen metric regressed by more than a threshold, so that CI can
/// gate on it.
struct Compare: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Compare two results.json reports; exit 1 if a chosen metric regressed beyond the threshold.",
        discussion: """
            Rows are matched by scenario, system and threads (a repeated key is matched by its order). \
            Higher is better for ops_per_sec and hit_ratio; lower is better for p50, p90, p99 and p999. \
            Exit status: 0 no regression, 1 a regression, 2 unreadable input or no row in common.
            """)

    @Argument(help: "The baseline report.") var baseline: String
    @Argument(help: "The report to judge against it.") var candidate: String
    @Option(parsing: .upToNextOption, help: "Metrics that fail the comparison when they regress.")
    var metric: [Metric] = [.ops_per_sec]
    @Option(help: "Regression threshold in percent (ratio metrics) or points (hit_ratio, × 100).")
    var threshold = 10.0
    @Option(help: "Only rows whose scenario contains this.") var scenario: String?
    @Option(help: "Only rows whose system contains this.") var system: String?

    enum Metric: String, ExpressibleByArgument, CaseIterable {
        case ops_per_sec, p50, p90, p99, p999, hit_ratio

        func value(_ r: BenchResult) -> Double {
            switch self {
            case .ops_per_sec: r.ops_per_sec
            case .p50: Double(r.latency_ns.p50)
            case .p90: Double(r.latency_ns.p90)
            case .p99: Double(r.latency_ns.p99)
            case .p999: Double(r.latency_ns.p999)
            case .hit_ratio: r.hit_ratio
            }
        }

        var higherIsBetter: Bool { self == .ops_per_sec || self == .hit_ratio }

        /// How much worse `b` is than `a`, in percent (hit ratio: in points), positive when worse.
        func regression(from a: Double, to b: Double) -> Double {
            if self == .hit_ratio { return (a - b) * 100 }
            guard a > 0 else { return 0 }
            return higherIsBetter ? (a - b) / a * 100 : (b - a) / a * 100
        }
    }

    func validate() throws {
        guard threshold >= 0 else { throw ValidationError("--threshold must be ≥ 0") }
    }

    func run() throws {
        let a: Report
        let b: Report
        do {
            a = try Self.load(baseline)
            b = try Self.load(candidate)
        } catch {
            print("compare: \(error)")
            throw ExitCode(2)
        }
        if a.machine.cpu != b.machine.cpu || a.machine.cores != b.machine.cores {
            print("note: different machines (\(a.machine.cores) × \(a.machine.cpu) vs \(b.machine.cores) × \(b.machine.cpu))")
        }
        let left = keyed(a.results)
        let right = keyed(b.results)
        let common = left.keys.filter { right[$0] != nil }.sorted()
        guard !common.isEmpty else {
            print("compare: no row in common")
            throw ExitCode(2)
        }
        var rows = Table(nil, ["scenario", "system", "threads", "ops/s A", "ops/s B", "B/A", "p50 A", "p50 B", "p99 A", "p99 B", "hit A", "hit B", "verdict"])
        var regressions: [String] = []
        for key in common {
            let (x, y) = (left[key]!, right[key]!)
            var worse: [String] = []
            for m in metric {
                let change = m.regression(from: m.value(x), to: m.value(y))
                if change > threshold {
                    worse.append(String(format: "%@ %.1f%@ worse", m.rawValue, change, m == .hit_ratio ? " pts" : " %"))
                }
            }
            if !worse.isEmpty { regressions.append("\(x.scenario) \(x.labeledSystem) \(x.threads)t: " + worse.joined(separator: ", ")) }
            rows.append([
                x.scenario, x.labeledSystem, String(x.threads), formatRate(x.ops_per_sec), formatRate(y.ops_per_sec),
                x.ops_per_sec > 0 ? String(format: "%.2f", y.ops_per_sec / x.ops_per_sec) : "-",
                String(x.latency_ns.p50), String(y.latency_ns.p50), String(x.latency_ns.p99), String(y.latency_ns.p99),
                String(format: "%.4f", x.hit_ratio), String(format: "%.4f", y.hit_ratio), worse.isEmpty ? "ok" : "REGRESSED",
            ])
        }
        rows.print()
        for key in left.keys.sorted() where right[key] == nil { print("only in A: \(key)") }
        for key in right.keys.sorted() where left[key] == nil { print("only in B: \(key)") }
        let metrics = metric.map(\.rawValue).joined(separator: ", ")
        if regressions.isEmpty {
            print("\nno regression beyond \(threshold) in \(metrics) over \(common.count) rows")
        } else {
            print("\n\(regressions.count) regression(s) beyond \(threshold) in \(metrics):")
            for line in regressions { print("  \(line)") }
            throw ExitCode(1)
        }
    }

    static func load(_ path: String) throws -> Report {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ValidationError("cannot read \(path)")
        }
        do {
            return try JSONDecoder().decode(Report.self, from: data)
        } catch {
            throw ValidationError("\(path) is not a magpie-bench report: \(error)")
        }
    }

    /// Rows by "scenario | system | threads", the n-th repeat of a key suffixed " #n" (a fleet row of
    /// another mix than the default names it beside the system: `BenchResult.labeledSystem`).
    func keyed(_ results: [BenchResult]) -> [String: BenchResult] {
        var out: [String: BenchResult] = [:]
        var seen: [String: Int] = [:]
        for r in results {
            if let scenario, !r.scenario.contains(scenario) { continue }
            if let system, !r.system.contains(system) { continue }
            let base = "\(r.scenario) | \(r.labeledSystem) | \(r.threads)"
            let n = seen[base, default: 0]
            seen[base] = n + 1
            out[n == 0 ? base : "\(base) #\(n + 1)"] = r
        }
        return out
    }
}
