import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench loader` at toy sizes: one row per system with the fields the report format names, and
/// the outage seen by cache-aside and single flight but not by stale-while-revalidate with fail-safe.
@Suite("magpie-bench loader")
struct BenchLoaderTests {
    @Test("three rows; during the outage magpie-swr serves every cached key, never a wrong or over-age value")
    func rows() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "loader", "--keys", "200", "--callers", "4", "--rate", "4000", "--seconds", "3", "--fresh-ms", "200",
            "--hard-ms", "3000", "--origin-p50-ms", "1", "--origin-p99-ms", "5", "--outage-at", "1",
            "--outage-seconds", "1", "--json", directory.child("loader.json"),
        ])
        #expect(status == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: directory.child("loader.json")))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let rows = try #require(report["results"] as? [[String: Any]])
        #expect(rows.compactMap { $0["system"] as? String } == ["cache-aside", "single-flight", "magpie-swr"])
        var outageErrors: [String: Int] = [:]
        for row in rows {
            #expect(row["scenario"] as? String == "loader")
            let extra = try #require(row["extra"] as? [String: Any])
            for field in ["origin_calls", "caller_errors", "outage_caller_errors", "stale_beyond_bound", "wrong_values"] {
                #expect(extra[field] is NSNumber, "\(field)")
            }
            let ages = try #require(extra["stale_age_ns"] as? [String: Any])
            #expect(ages["p50"] is NSNumber && ages["p99"] is NSNumber && ages["max"] is NSNumber)
            #expect((extra["wrong_values"] as? Int) == 0)
            #expect((extra["stale_beyond_bound"] as? Int) == 0)
            outageErrors[row["system"] as? String ?? ""] = extra["outage_caller_errors"] as? Int
        }
        #expect(outageErrors["magpie-swr"] == 0)
        #expect((outageErrors["cache-aside"] ?? 0) > 0 && (outageErrors["single-flight"] ?? 0) > 0, "\(outageErrors)")
    }
}
