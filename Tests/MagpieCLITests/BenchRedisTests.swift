import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench redis` at toy sizes against the private server it starts: every workload's rows for both
/// systems, with positive rates and latencies, no magpie error or miss, and the breaker row's calls all
/// failed fast.
@Suite("magpie-bench redis", .timeLimit(.minutes(3)))
struct BenchRedisTests {
    @Test(
        "rows for GET and SET, single and pipelined, magpie-redis and redis-benchmark; the breaker row",
        .enabled(
            if: RedisTools.isInstalled && RedisTools.path(of: "redis-benchmark") != nil,
            "redis-server, redis-cli or redis-benchmark is not installed (make deps installs them)"))
    func rows() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let json = directory.child("redis.json")
        let status = try runBench([
            "redis", "--seconds", "0.3", "--keys", "500", "--rounds", "1", "--breaker-calls", "2000", "--json", json,
        ])
        #expect(status == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: json))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let rows = try #require(report["results"] as? [[String: Any]])

        var seen: Set<String> = []
        for row in rows
        where (row["scenario"] as? String)?.hasPrefix("redis-") == true && row["scenario"] as? String != "redis-breaker"
        {
            let scenario = try #require(row["scenario"] as? String)
            let system = try #require(row["system"] as? String)
            let extra = try #require(row["extra"] as? [String: Any])
            let mode = try #require(extra["mode"] as? String)
            let label = "\(scenario) \(system) \(mode)"
            seen.insert(label)
            #expect(["redis-get", "redis-set"].contains(scenario), "\(label)")
            #expect(["magpie-redis", "redis-benchmark"].contains(system), "\(label)")
            #expect(["single", "pipelined"].contains(mode), "\(label)")
            #expect((row["ops_per_sec"] as? Double ?? 0) > 0, "\(label)")
            #expect((row["operations"] as? Int ?? 0) > 0, "\(label)")
            let latency = try #require(row["latency_ns"] as? [String: Any])
            let p50 = latency["p50"] as? Int ?? 0
            let p99 = latency["p99"] as? Int ?? 0
            let max = latency["max"] as? Int ?? 0
            #expect(p50 > 0 && p50 <= p99 && p99 <= max, "\(label): \(latency)")
            #expect(extra["round"] as? Int == 1, "\(label)")
            #expect(extra["pipeline_depth"] as? Int == (mode == "single" ? 1 : 16), "\(label)")
            if system == "magpie-redis" {
                #expect(extra["errors"] as? Int == 0, "\(label)")
                #expect(extra["misses"] as? Int == 0, "\(label)")
            }
        }
        var expected: Set<String> = []
        for scenario in ["redis-get", "redis-set"] {
            for system in ["magpie-redis", "redis-benchmark"] {
                for mode in ["single", "pipelined"] { expected.insert("\(scenario) \(system) \(mode)") }
            }
        }
        #expect(seen == expected)

        let breaker = try #require(rows.first { $0["scenario"] as? String == "redis-breaker" })
        let extra = try #require(breaker["extra"] as? [String: Any])
        #expect(breaker["system"] as? String == "magpie-redis")
        #expect(extra["calls"] as? Int == 2000)
        #expect(extra["non_circuit_open_outcomes"] as? Int == 0)
        #expect(extra["breaker_rejections"] as? Int == 4000)  // the calls of get(key), then of prebuilt commands
        let probes = try #require(extra["connect_failures_during"] as? Int)
        #expect(probes <= (extra["background_probe_bound"] as? Int ?? 0))
        let latency = try #require(breaker["latency_ns"] as? [String: Any])
        #expect((latency["p50"] as? Int ?? 0) > 0)
    }
}
