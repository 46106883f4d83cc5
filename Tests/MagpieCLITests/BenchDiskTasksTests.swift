import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench disk-tasks` at toy sizes: a row per system and concurrency with the report's fields,
/// every read checked.
@Suite("magpie-bench disk-tasks")
struct BenchDiskTasksTests {
    @Test("a synchronous row and one per async read (value, lookup, loader) per concurrency, every read a correct disk hit; then a synchronous and an async store row per concurrency, every stored value read back")
    func rows() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "disk-tasks", "--tasks", "1", "8", "--keys", "300", "--gets", "800", "--stores", "400", "--value-size", "2048",
            "--work-directory", directory.path, "--json", directory.child("tasks.json"),
        ])
        #expect(status == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: directory.child("tasks.json")))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let rows = try #require(report["results"] as? [[String: Any]])
        let systems = ["magpie-sync", "magpie-async", "magpie-async-lookup", "magpie-loader"]
        let stores = ["magpie-sync-set", "magpie-async-set"]
        #expect(rows.compactMap { $0["system"] as? String } == systems + systems + stores + stores)
        #expect(rows.compactMap { $0["threads"] as? Int } == [1, 1, 1, 1, 8, 8, 8, 8, 1, 1, 8, 8])
        #expect(rows.compactMap { $0["operations"] as? Int } == [200, 200, 200, 200, 800, 800, 800, 800, 100, 100, 400, 400])
        for row in rows where (row["system"] as? String)?.hasSuffix("-set") == true {
            let extra = try #require(row["extra"] as? [String: Any])
            #expect(extra["workload"] as? String == "set")
            if row["system"] as? String == "magpie-async-set" { #expect(((extra["inline_stores"] as? Int) ?? -1) >= 0) }
        }
        for row in rows {
            #expect(row["scenario"] as? String == "disk-tasks")
            #expect((row["hit_ratio"] as? Double) == 1.0)
            let latency = try #require(row["latency_ns"] as? [String: Any])
            #expect(((latency["p50"] as? Int) ?? 0) > 0)
            let extra = try #require(row["extra"] as? [String: Any])
            #expect((extra["errors"] as? Int) == 0)
        }
        // The directory it made is gone.
        let left = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasPrefix("magpie-bench-disk-tasks") }
        #expect(left.isEmpty)
    }
}
