import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench fleet` at toy sizes: four worker processes, each with async caller tasks (`--tasks`),
/// sharing one private redis-server. Across processes: no wrong value, no stale read beyond the bound,
/// every lag probe dropped by every other instance, one loader run per lease, a row per tasks value and
/// system; with faults (Redis killed and restarted, then paused), no caller error (in the pause window
/// too), no removal served again outside the outage, and the pause rows' latencies.
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
            "--seconds", "3", "--warmup-seconds", "1", "--keys", "500", "--single-flight-callers", "25", "--probe-interval-us", "5000",
            "--tasks", "1", "16",
        ])
        func row(_ system: String, tasks: Int) -> [String: Any]? {
            rows.first {
                guard $0["system"] as? String == system, let extra = $0["extra"] as? [String: Any] else { return false }
                return extra["single_flight"] == nil && extra["tasks"] as? Int == tasks
            }
        }
        // A row per tasks value and system, each from that many async tasks per worker.
        #expect(rows.count == 2 * 3 + 1)
        for tasks in [1, 16] {
            let fleet = try #require(row("magpie-fleet", tasks: tasks))
            let extra = try #require(fleet["extra"] as? [String: Any])
            #expect(fleet["scenario"] as? String == "fleet")
            #expect(fleet["threads"] as? Int == 4 * tasks)  // callers across the workers
            #expect(extra["wrong_values"] as? Int == 0)
            #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
            #expect(extra["caller_errors"] as? Int == 0)
            #expect(extra["lag_probes_never_dropped"] as? Int == 0)
            #expect((extra["lag_probes"] as? Int ?? 0) > 100)
            #expect((extra["hit_ratio_memory"] as? Double ?? 0) > 0.5)
            #expect((fleet["ops_per_sec"] as? Double ?? 0) > 0)
            // No fault: no pause rows.
            #expect(extra["pause_seconds"] == nil)
            // The cache-aside baseline (a plain RedisClient from the same tasks) reads only what it wrote.
            let aside = try #require(row("redis-cache-aside", tasks: tasks))
            let asideExtra = try #require(aside["extra"] as? [String: Any])
            #expect(asideExtra["wrong_values"] as? Int == 0)
            #expect(asideExtra["caller_errors"] as? Int == 0)
            #expect((asideExtra["reads"] as? Int ?? 0) > 0)
            #expect((asideExtra["hit_ratio_remote"] as? Double ?? 0) > 0.5)  // every hit is a GET
            // The uncoherent caches serve stale values (the detector works).
            let uncoherent = try #require(row("local-uncoherent", tasks: tasks))
            #expect(((uncoherent["extra"] as? [String: Any])?["stale_reads_beyond_bound"] as? Int ?? 0) > 0)
        }
        let single = try #require(rows.first { ($0["extra"] as? [String: Any])?["single_flight"] != nil })
        let singleExtra = try #require(single["extra"] as? [String: Any])
        #expect(singleExtra["loader_runs"] as? Int == 1)
        #expect(singleExtra["loader_runs_per_lease"] as? Double == 1)
        #expect(singleExtra["caller_errors"] as? Int == 0)
    }

    @Test("Redis killed and paused under load: no caller error, no removal served again, coherence back",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func faults() async throws {
        let rows = try await run([
            // 4 tasks per worker: the fault run shares the machine with the other suites, and its recovery
            // bar (2 s) is about Redis coming back, not about CPU. 10 s (the least --fault takes): the run
            // goes on 2 s after the pause, so a recovery within the bar is seen.
            "--seconds", "10", "--keys", "500", "--fault", "--systems", "magpie-fleet", "--single-flight-callers", "0", "--tasks", "4",
        ])
        let fleet = try #require(rows.first { $0["system"] as? String == "magpie-fleet" })
        let extra = try #require(fleet["extra"] as? [String: Any])
        #expect(fleet["scenario"] as? String == "fleet-fault")
        #expect(extra["wrong_values"] as? Int == 0)
        #expect(extra["caller_errors"] as? Int == 0)
        #expect(extra["resurrected_removals"] as? Int == 0)
        #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
        #expect((extra["recovery_seconds"] as? Double ?? 99) < 2)
        // Inside the outages and the 2 s after each too: a removal or store that failed while Redis was
        // down is owed, and until its instance replays it the fleet's delivery watermark keeps every
        // other instance from serving what Redis (or its own copy) still holds.
        #expect(extra["stale_reads_during_outage"] as? Int == 0)
        #expect(extra["resurrected_removals_during_outage"] as? Int == 0)
        #expect(extra["pause_stale_beyond_bound"] as? Int == 0)
        #expect(extra["pause_resurrected"] as? Int == 0)
        #expect(extra["pause_caller_errors"] as? Int == 0)
        // The pause rows: memory hits were served (and timed) while Redis was stopped, stores were timed
        // in the pause and while Redis ran.
        #expect((extra["pause_seconds"] as? Double ?? 0) >= 1.4)
        #expect((extra["hit_latency_paused_count"] as? Int ?? 0) > 0)
        #expect(extra["hit_latency_paused_ns"] as? [String: Any] != nil)
        #expect((extra["pause_hit_p99_ns"] as? Int ?? 0) > 0)
        #expect((extra["running_hit_p99_ns"] as? Int ?? 0) > 0)
        #expect((extra["pause_store_p99_ns"] as? Int ?? 0) > 0)
        #expect((extra["running_store_p99_ns"] as? Int ?? 0) > 0)
        #expect(extra["pause_caller_errors"] as? Int == 0)
        let pauseResurrected = try #require(extra["pause_resurrected"] as? Int)
        let pauseStale = try #require(extra["pause_stale_beyond_bound"] as? Int)
        #expect(pauseResurrected <= (extra["resurrected_removals_during_outage"] as? Int ?? -1))
        #expect(pauseStale <= (extra["stale_reads_during_outage"] as? Int ?? -1))
    }
}
