import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench compare`, run as CI would run it: its exit status is the contract.
@Suite("magpie-bench compare")
struct BenchCompareTests {
    static func report(opsPerSecond: Double, p99: Int, hitRatio: Double) -> String {
        """
        {"tool": "magpie-bench", "version": "0.1.0", "date": "2026-11-22T00:00:00Z",
         "machine": {"cores": 2, "os": "Linux", "cpu": "test", "memory_bytes": 1, "swift": "6.3+"},
         "config": {},
         "results": [
          {"scenario": "memory", "system": "magpie", "threads": 1, "operations": 100, "seconds": 1.0,
           "ops_per_sec": \(opsPerSecond), "hit_ratio": \(hitRatio), "extra": {},
           "latency_ns": {"p50": 100, "p90": 200, "p99": \(p99), "p999": 900, "max": 1000}},
          {"scenario": "memory", "system": "NSCache", "threads": 1, "operations": 100, "seconds": 1.0,
           "ops_per_sec": 1000, "hit_ratio": 0.5, "extra": {},
           "latency_ns": {"p50": 100, "p90": 200, "p99": 300, "p999": 900, "max": 1000}}
         ]}
        """
    }

    func compare(_ baseline: String, _ candidate: String, _ arguments: [String] = []) throws -> Int32 {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try baseline.write(toFile: directory.child("a.json"), atomically: true, encoding: .utf8)
        try candidate.write(toFile: directory.child("b.json"), atomically: true, encoding: .utf8)
        return try runBench(["compare", directory.child("a.json"), directory.child("b.json")] + arguments)
    }

    @Test("exit 0 within the threshold, 1 beyond it, per chosen metric; 2 for a file that is not a report")
    func exitStatus() throws {
        let base = Self.report(opsPerSecond: 1000, p99: 300, hitRatio: 0.80)
        #expect(try compare(base, Self.report(opsPerSecond: 950, p99: 300, hitRatio: 0.80)) == 0)
        #expect(try compare(base, Self.report(opsPerSecond: 850, p99: 300, hitRatio: 0.80)) == 1)
        #expect(try compare(base, Self.report(opsPerSecond: 850, p99: 300, hitRatio: 0.80), ["--threshold", "20"]) == 0)
        #expect(try compare(base, Self.report(opsPerSecond: 1000, p99: 400, hitRatio: 0.80), ["--metric", "p99"]) == 1)
        #expect(try compare(base, Self.report(opsPerSecond: 1000, p99: 400, hitRatio: 0.80)) == 0)  // p99 not chosen
        #expect(try compare(base, Self.report(opsPerSecond: 1000, p99: 300, hitRatio: 0.60), ["--metric", "hit_ratio"]) == 1)
        #expect(try compare(base, Self.report(opsPerSecond: 2000, p99: 100, hitRatio: 0.90), ["--metric", "ops_per_sec", "p99", "hit_ratio"]) == 0)
        #expect(try compare(base, "not json") == 2)
    }
}
