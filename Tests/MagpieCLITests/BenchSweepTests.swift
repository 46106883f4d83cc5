import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench sweep` at toy sizes: the curves come out tagged and point the right way.
@Suite("magpie-bench sweep")
struct BenchSweepTests {
    @Test("hit ratio rises with the budget, zstd beats raw on JSON-like values, every point is tagged")
    func curves() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "sweep", "--budget-percents", "1", "30", "--shard-counts", "1", "4", "--threads", "1", "--levels", "0", "1",
            "--keys", "5000", "--ops", "20000", "--disk-keys", "300", "--trace-requests", "20000", "--trace-budgets", "1", "10",
            "--tiers", "memory", "disk",
            "--json", directory.child("sweep.json"),
        ])
        #expect(status == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: directory.child("sweep.json")))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let rows = try #require(report["results"] as? [[String: Any]])
        func points(_ parameter: String, scenario: String? = nil) -> [(Double, [String: Any])] {
            rows.compactMap { row in
                guard let extra = row["extra"] as? [String: Any], extra["sweep_parameter"] as? String == parameter,
                    scenario == nil || row["scenario"] as? String == scenario
                else { return nil }
                return ((extra["sweep_value"] as? NSNumber)?.doubleValue ?? -1, row)
            }
        }
        let budget = points("budget_percent")
        #expect(budget.map(\.0) == [1, 30])
        let hitRatios = budget.map { ($0.1["hit_ratio"] as? Double) ?? -1 }
        #expect(hitRatios.count == 2 && hitRatios[0] < hitRatios[1], "\(hitRatios)")
        #expect(points("shards").map(\.0) == [1, 4])
        // The policy curve: Magpie's memory tier and every reference policy at each budget, and Magpie's
        // misses falling as the budget grows. (Belady's choice ignores sizes, so with the trace's mixed
        // sizes it bounds nothing: not compared.)
        let policy = points("trace_budget_percent")
        let systems = Set(policy.compactMap { $0.1["system"] as? String })
        #expect(
            systems == ["magpie-memory", "magpie-disk", "LRU", "FIFO", "ARC", "S3-FIFO", "W-TinyLFU", "LIRS", "Belady"], "\(systems)")
        #expect(policy.count == 2 * systems.count)  // the references once, with the first tier
        func miss(_ system: String, _ percent: Double) -> Double {
            let row = policy.first { $0.0 == percent && $0.1["system"] as? String == system }?.1
            return ((row?["extra"] as? [String: Any])?["miss_ratio"] as? Double) ?? -1
        }
        for tier in ["magpie-memory", "magpie-disk"] { #expect(miss(tier, 1) > miss(tier, 10) && miss(tier, 10) > 0, "\(tier)") }
        for system in systems { for percent in [1.0, 10] { #expect(miss(system, percent) > 0 && miss(system, percent) <= 1) } }
        let sets = points("zstd_level", scenario: "disk-set")
        #expect(sets.map(\.0) == [0, 1])
        let ratios = sets.map { (($0.1["extra"] as? [String: Any])?["compression_ratio"] as? Double) ?? -1 }
        #expect(ratios.count == 2 && ratios[0] == 1 && ratios[1] > 1.3, "\(ratios)")
    }
}
