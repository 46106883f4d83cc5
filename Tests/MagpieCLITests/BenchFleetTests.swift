import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench fleet` at toy sizes: four worker processes, each a `Cache` with the Redis remote tier,
/// sharing one private redis-server. Across processes: no wrong value, no stale read beyond the bound,
/// every lag probe dropped by every other instance, one loader run per lease; with faults (Redis killed
/// and restarted, then paused), no caller error and no removal served again.
@Suite("magpie-bench fleet", .serialized, .timeLimit(.minutes(3)))
struct BenchFleetTests {
    /// Runs the bench on a thread of its own (it takes seconds: a cooperative thread blocked that long
    /// starves the suites running beside it).
    func run(_ arguments: [String]) async throws -> [[String: Any]] {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let json = directory.child("fleet.json")
        let status = try await offloaded { try runBench(["fleet", "--json", json] + arguments) }
        #expect(status == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: json))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        return try #require(report["results"] as? [[String: Any]])
    }

    @Test("coherent across processes; one loader run per lease",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func coherentAcrossProcesses() async throws {
        let rows = try await run([
            "--seconds", "3", "--keys", "500", "--single-flight-callers", "25", "--probe-interval-us", "5000", "--tasks", "16",
        ])
        let fleet = try #require(rows.first { $0["system"] as? String == "magpie-fleet" && ($0["extra"] as? [String: Any])?["single_flight"] == nil })
        let extra = try #require(fleet["extra"] as? [String: Any])
        #expect(fleet["scenario"] as? String == "fleet")
        #expect(extra["wrong_values"] as? Int == 0)
        #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
        #expect(extra["caller_errors"] as? Int == 0)
        #expect(extra["lag_probes_never_dropped"] as? Int == 0)
        #expect((extra["lag_probes"] as? Int ?? 0) > 100)
        #expect((extra["hit_ratio_memory"] as? Double ?? 0) > 0.5)
        #expect(extra["tasks"] as? Int == 16)  // async callers
        // The cache-aside baseline (a plain RedisClient from the same tasks) reads only what it wrote.
        let aside = try #require(rows.first { $0["system"] as? String == "redis-cache-aside" })
        #expect(((aside["extra"] as? [String: Any])?["wrong_values"] as? Int) == 0)
        #expect(((aside["extra"] as? [String: Any])?["caller_errors"] as? Int) == 0)
        let single = try #require(rows.first { ($0["extra"] as? [String: Any])?["single_flight"] != nil })
        let singleExtra = try #require(single["extra"] as? [String: Any])
        #expect(singleExtra["loader_runs"] as? Int == 1)
        #expect(singleExtra["loader_runs_per_lease"] as? Double == 1)
        #expect(singleExtra["caller_errors"] as? Int == 0)
        // The uncoherent caches serve stale values (the detector works).
        let uncoherent = try #require(rows.first { $0["system"] as? String == "local-uncoherent" })
        #expect(((uncoherent["extra"] as? [String: Any])?["stale_reads_beyond_bound"] as? Int ?? 0) > 0)
    }

    @Test("Redis killed and paused under load: no caller error, no removal served again, coherence back",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func faults() async throws {
        let rows = try await run([
            // 4 tasks per worker: the fault run shares the machine with the other suites, and its recovery
            // bar (2 s) is about Redis coming back, not about CPU.
            "--seconds", "8", "--keys", "500", "--fault", "--systems", "magpie-fleet", "--single-flight-callers", "0", "--tasks", "4",
        ])
        let fleet = try #require(rows.first { $0["system"] as? String == "magpie-fleet" })
        let extra = try #require(fleet["extra"] as? [String: Any])
        #expect(fleet["scenario"] as? String == "fleet-fault")
        #expect(extra["wrong_values"] as? Int == 0)
        #expect(extra["caller_errors"] as? Int == 0)
        #expect(extra["resurrected_removals"] as? Int == 0)
        #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
        #expect((extra["recovery_seconds"] as? Double ?? 99) < 2)
        // The pause rows: memory hits were served (and timed) while Redis was stopped.
        #expect((extra["hit_latency_paused_count"] as? Int ?? 0) > 0)
        #expect(extra["hit_latency_paused_ns"] as? [String: Any] != nil)
    }
}
