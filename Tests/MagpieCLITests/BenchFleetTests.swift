import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench fleet` at toy sizes: four worker processes, each with async caller tasks (`--tasks`),
/// sharing one private redis-server. Across processes: no wrong value, no stale read beyond the bound,
/// every lag probe dropped by every other instance, one loader run per lease, a row per tasks value and
/// system, each system's remote share, stores and Redis CPU; the hand-built local + pub/sub pattern's
/// failure modes counted; with faults (the subscriber connections killed, Redis killed and restarted,
/// then paused, messages dropped), no caller error (in the pause window too), no removal served again
/// outside the outage, the pause rows' latencies and the per-window tallies.
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

    /// A row of `rows` by system and tasks (not the single-flight row).
    func row(_ rows: [[String: Any]], _ system: String, tasks: Int) -> [String: Any]? {
        rows.first {
            guard $0["system"] as? String == system, let extra = $0["extra"] as? [String: Any] else { return false }
            return extra["single_flight"] == nil && extra["tasks"] as? Int == tasks
        }
    }

    @Test("coherent across processes; one loader run per lease; every system's remote reads, stores and Redis CPU",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func coherentAcrossProcesses() async throws {
        let rows = try await run([
            "--seconds", "3", "--warmup-seconds", "1", "--keys", "500", "--single-flight-callers", "25", "--probe-interval-us", "5000",
            "--tasks", "1", "16", "--mixes", "default",
        ])
        // A row per tasks value and system, each from that many async tasks per worker.
        #expect(rows.count == 2 * 4 + 1)
        for tasks in [1, 16] {
            let fleet = try #require(row(rows, "magpie-fleet", tasks: tasks))
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
            // Its remote reads from the cache's statistics: hits and misses, a share of the reads.
            let remoteReads = try #require(extra["remote_reads"] as? Int)
            #expect(remoteReads == (extra["remote_read_hits"] as? Int ?? -1) + (extra["remote_read_misses"] as? Int ?? -1))
            let share = try #require(extra["remote_share"] as? Double)
            #expect(share > 0 && share < 0.5)
            #expect((extra["own_write_probes"] as? Int ?? 0) > 0)
            // Its stores are scripts: their Redis time per store, and the process's CPU.
            #expect(extra["redis_store_commands"] as? [String] == ["evalsha", "eval"])
            #expect((extra["redis_usec_per_call_evalsha"] as? Double ?? 0) > 0)
            #expect((extra["redis_store_usec_per_store"] as? Double ?? 0) > 0)
            #expect((extra["redis_cpu_seconds"] as? Double ?? 0) > 0)
            #expect((extra["redis_cpu_us_per_op"] as? Double ?? 0) > 0)
            #expect((extra["stores_per_sec"] as? Double ?? 0) > 0)
            #expect(((extra["store_latency_ns"] as? [String: Any])?["p999"] as? Int ?? 0) > 0)
            // No fault: no pause rows.
            #expect(extra["pause_seconds"] == nil)
            // The cache-aside baseline (a plain RedisClient from the same tasks) reads only what it wrote,
            // every read a GET.
            let aside = try #require(row(rows, "redis-cache-aside", tasks: tasks))
            let asideExtra = try #require(aside["extra"] as? [String: Any])
            #expect(asideExtra["wrong_values"] as? Int == 0)
            #expect(asideExtra["caller_errors"] as? Int == 0)
            #expect((asideExtra["reads"] as? Int ?? 0) > 0)
            #expect((asideExtra["hit_ratio_remote"] as? Double ?? 0) > 0.5)
            let asideShare = try #require(asideExtra["remote_share"] as? Double)
            #expect(asideShare > 0.99 && asideShare < 1.01)  // every read (the window's edges aside)
            #expect((asideExtra["origin_calls"] as? Int ?? 0) > 0)
            #expect(asideExtra["redis_store_commands"] as? [String] == ["set", "del"])
            #expect((asideExtra["redis_usec_per_call_set"] as? Double ?? 0) > 0)
            #expect((asideExtra["redis_usec_per_call_get"] as? Double ?? 0) > 0)
            #expect((asideExtra["redis_store_usec_per_store"] as? Double ?? 0) > 0)
            // Redis saw a GET per read (the window's edges aside).
            let gets = Double(asideExtra["redis_gets"] as? Int ?? 0)
            let asideReads = Double(asideExtra["reads"] as? Int ?? 0)
            #expect(gets > 0.9 * asideReads && gets < 1.1 * asideReads + 1000)
            // The hand-built local + pub/sub pattern: most reads local, its writes SET + PUBLISH, its own
            // writes kept (the origin tag), every lag probe dropped by every other instance.
            let pubsub = try #require(row(rows, "local-pubsub", tasks: tasks))
            let pubsubExtra = try #require(pubsub["extra"] as? [String: Any])
            #expect(pubsubExtra["wrong_values"] as? Int == 0)
            #expect(pubsubExtra["caller_errors"] as? Int == 0)
            #expect((pubsubExtra["hit_ratio_memory"] as? Double ?? 0) > 0.5)
            let pubsubShare = try #require(pubsubExtra["remote_share"] as? Double)
            #expect(pubsubShare > 0 && pubsubShare < 0.5)
            #expect(pubsubExtra["lag_probes_never_dropped"] as? Int == 0)
            #expect((pubsubExtra["lag_probes"] as? Int ?? 0) > 100)
            #expect((pubsubExtra["own_write_probes"] as? Int ?? 0) > 0)
            #expect(pubsubExtra["own_write_probes_not_local"] as? Int == 0)
            #expect((pubsubExtra["own_messages_skipped"] as? Int ?? 0) > 0)
            #expect(pubsubExtra["messages_dropped"] as? Int == 0)
            #expect(pubsubExtra["redis_store_commands"] as? [String] == ["set", "del", "publish"])
            #expect((pubsubExtra["redis_usec_per_call_publish"] as? Double ?? 0) > 0)
            #expect((pubsubExtra["redis_store_usec_per_store"] as? Double ?? 0) > 0)
            #expect((pubsubExtra["stores_per_sec"] as? Double ?? 0) > 0)
            // The uncoherent caches serve stale values (the detector works).
            let uncoherent = try #require(row(rows, "local-uncoherent", tasks: tasks))
            #expect(((uncoherent["extra"] as? [String: Any])?["stale_reads_beyond_bound"] as? Int ?? 0) > 0)
        }
        let single = try #require(rows.first { ($0["extra"] as? [String: Any])?["single_flight"] != nil })
        let singleExtra = try #require(single["extra"] as? [String: Any])
        #expect(singleExtra["loader_runs"] as? Int == 1)
        #expect(singleExtra["loader_runs_per_lease"] as? Double == 1)
        #expect(singleExtra["caller_errors"] as? Int == 0)
    }

    @Test("a row per mix (default, no changes, removals only); each row's CPU per operation and Redis round trips per change",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func mixesAndCosts() async throws {
        let rows = try await run([
            "--seconds", "2", "--warmup-seconds", "1", "--keys", "500", "--single-flight-callers", "0", "--tasks", "16",
            "--systems", "magpie-fleet", "redis-cache-aside", "--mixes", "default", "none", "removals",
        ])
        #expect(rows.count == 3 * 2)
        func extra(_ system: String, _ mix: String) throws -> [String: Any] {
            let row = try #require(rows.first { ($0["extra"] as? [String: Any])?["mix"] as? String == mix && $0["system"] as? String == system })
            return try #require(row["extra"] as? [String: Any])
        }
        for system in ["magpie-fleet", "redis-cache-aside"] {
            for mix in ["default", "none", "removals"] {
                let row = try extra(system, mix)
                #expect(row["wrong_values"] as? Int == 0 && row["caller_errors"] as? Int == 0)
                // CPU per operation: the workers' (getrusage over the window) and the private server's.
                #expect((row["worker_cpu_us_per_op"] as? Double ?? 0) > 0)
                #expect((row["redis_cpu_us_per_op"] as? Double ?? 0) > 0)
                // Every read reaches Redis in cache-aside; a read of a Magpie row counts its round trips too.
                #expect(row["redis_round_trips_per_read"] as? Double != nil)
            }
            let none = try extra(system, "none")
            #expect(none["writes"] as? Int == 0 && none["removes"] as? Int == 0)
            #expect(none["redis_operations_set"] as? Int == 0 && none["redis_operations_removal"] as? Int == 0)
            #expect(none["redis_round_trips_per_set"] == nil && none["redis_round_trips_per_removal"] == nil)
            let removals = try extra(system, "removals")
            #expect(removals["writes"] as? Int == 0 && (removals["removes"] as? Int ?? 0) > 0)
            #expect(removals["set_share"] as? Double == 0 && removals["remove_share"] as? Double == 0.03)
            // A removal reaches Redis: at least one round trip each, counted as the removal's (the task-local
            // cause reaches the system's client).
            #expect((removals["redis_round_trips_per_removal"] as? Double ?? 0) >= 0.95)
            let standard = try extra(system, "default")
            #expect((standard["redis_round_trips_per_set"] as? Double ?? 0) >= 0.95)
            // Where a set's and a removal's time went: each stage measured, and the round trips' stages
            // within the change's mean latency from the caller (10 %: the histogram's 3 % buckets, and round
            // trips of changes begun before the window that end in it).
            for (row, cause, latency) in [(standard, "set", "store_latency_mean_ns"), (removals, "removal", "remove_latency_mean_ns")] {
                let stages = try #require(row["redis_stage_us_per_round_trip_\(cause)"] as? [String: Double], "\(system) \(cause)")
                let (queued, server, resumed) = (stages["queued"] ?? -1, stages["server"] ?? -1, stages["resumed"] ?? -1)
                #expect(queued >= 0 && server > 0 && resumed >= 0, "\(system) \(cause): \(stages)")
                let trips = row["redis_round_trips_per_\(cause)"] as? Double ?? 0
                let mean = (row[latency] as? Double ?? 0) / 1e3
                #expect(trips * (queued + server + resumed) <= mean * 1.1 + 1, "\(system) \(cause): \(stages) × \(trips) against \(mean) µs")
            }
        }
        // Cache-aside's are known: a removal is one DEL, a set one SET, a read a GET and, on a miss, a SET.
        // Within 1 %, not exactly: under CI's load a call at the window's edge was once counted on one side
        // of the ratio and not the other (not explained); a command attributed to the wrong operation, or
        // not at all, is off by far more.
        let aside = try extra("redis-cache-aside", "default")
        let asideSets = try #require(aside["redis_round_trips_per_set"] as? Double)
        #expect(abs(asideSets - 1) < 0.01, "\(asideSets)")
        let asideRemovals = try #require(try extra("redis-cache-aside", "removals")["redis_round_trips_per_removal"] as? Double)
        #expect(abs(asideRemovals - 1) < 0.01, "\(asideRemovals)")
        let asideReads = try #require(aside["redis_round_trips_per_read"] as? Double)
        #expect(asideReads > 0.95 && asideReads < 1.5)
    }

    @Test("the hand-built pattern's failure modes are counted: dropped messages serve stale reads, its own echo sends reads to Redis",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func pubsubFailureModes() async throws {
        let rows = try await run([
            "--seconds", "3", "--warmup-seconds", "1", "--keys", "500", "--single-flight-callers", "0", "--tasks", "16",
            "--systems", "local-pubsub", "--drop-messages", "0.5", "--pubsub-echo", "--mixes", "default",
        ])
        let pubsub = try #require(row(rows, "local-pubsub", tasks: 16))
        let extra = try #require(pubsub["extra"] as? [String: Any])
        #expect(extra["drop_messages_applied"] as? Double == 0.5)
        let received = try #require(extra["messages_received"] as? Int)
        let dropped = try #require(extra["messages_dropped"] as? Int)
        #expect(dropped > received / 4 && dropped < received * 3 / 4)
        // A key whose message was dropped keeps its old value until the key changes again.
        #expect((extra["stale_reads_beyond_bound"] as? Int ?? 0) > 0)
        #expect(extra["wrong_values"] as? Int == 0)
        // Without the origin tag the writer's own message drops its copy (when that message is not dropped).
        #expect(extra["own_messages_skipped"] as? Int == 0)
        let probes = try #require(extra["own_write_probes"] as? Int)
        let remote = try #require(extra["own_write_probes_not_local"] as? Int)
        #expect(probes > 0 && remote > 0 && remote < probes)
    }

    @Test("subscribers killed, Redis killed and paused, messages dropped, under load: no caller error, no removal served again, coherence back",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func faults() async throws {
        let rows = try await run([
            // 4 tasks per worker: the fault run shares the machine with the other suites, and its recovery
            // bar (2 s) is about Redis coming back, not about CPU. 15 s (the least --fault takes): the run
            // goes on 2 s after the eviction window's place, so a recovery within the bar is seen. Without
            // the eviction window: with 1 % of the messages dropped unseen, a drop just before Redis evicts
            // the message counters is found by nothing (a stated risk, MagpieRedis's DocC; 2 stale reads
            // once in CI). The next test runs it without injected drops.
            "--seconds", "15", "--keys", "500", "--fault", "--faults", "pubsub", "kill", "pause",
            "--systems", "magpie-fleet", "local-pubsub", "--single-flight-callers", "0", "--tasks", "4",
        ])
        let fleet = try #require(row(rows, "magpie-fleet", tasks: 4))
        let extra = try #require(fleet["extra"] as? [String: Any])
        #expect(fleet["scenario"] as? String == "fleet-fault")
        #expect(extra["wrong_values"] as? Int == 0)
        #expect(extra["caller_errors"] as? Int == 0)
        #expect(extra["resurrected_removals"] as? Int == 0)
        #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
        // Coherence comes back after every fault (10: not within the run). The 2-s bar is magpie-bench's
        // to measure on a quiet machine: here the run shares 2 cores with the other suites (2.3 s once
        // in CI at 5494c91, its replay of owed removals slowed), so the test asks for recovery, not speed.
        #expect((extra["recovery_seconds"] as? Double ?? 99) < 5)
        #expect((extra["recoveries_seconds"] as? [Double])?.count == 3)
        // Inside the outages and the 2 s after each too: a removal or store that failed while Redis was
        // down is owed, and until its instance replays it the fleet's delivery watermark keeps every
        // other instance from serving what Redis (or its own copy) still holds.
        #expect(extra["stale_reads_during_outage"] as? Int == 0)
        #expect(extra["resurrected_removals_during_outage"] as? Int == 0)
        #expect(extra["pause_stale_beyond_bound"] as? Int == 0)
        #expect(extra["pause_resurrected"] as? Int == 0)
        #expect(extra["pause_caller_errors"] as? Int == 0)
        #expect(extra["pubsub_kill_stale_beyond_bound"] as? Int == 0)
        #expect(extra["pubsub_kill_caller_errors"] as? Int == 0)
        // Every fault's window is reported, and the rest of the run.
        let windows = try #require(extra["fault_windows"] as? [String: [String: Any]])
        #expect(Set(windows.keys) == ["pubsub_killed", "redis_killed", "redis_paused", "outside"])
        for (name, window) in windows {
            #expect(window["caller_errors"] as? Int == 0, "\(name)")
            #expect(window["resurrected"] as? Int == 0, "\(name)")
            #expect(window["stale_beyond_bound"] as? Int == 0, "\(name)")
        }
        // Each window's recovery, and its parts: the feed confirmed, every instance's writes delivered
        // (each seen no later than both together); the kill's from when the restarted server served,
        // its loading reported apart.
        for (name, window) in windows where name != "outside" {
            let healthy = try #require(window["recovery_seconds"] as? Double, "\(name)")
            let confirmed = try #require(window["recovery_confirmed_seconds"] as? Double, "\(name)")
            let delivered = try #require(window["recovery_delivered_seconds"] as? Double, "\(name)")
            #expect(confirmed <= healthy && delivered <= healthy, "\(name)")
        }
        #expect((windows["redis_killed"]?["loading_seconds"] as? Double ?? -1) >= 0)
        // The pause rows: reads were served (and timed) while Redis was stopped, stores were timed in the
        // pause and while Redis ran.
        #expect((extra["pause_seconds"] as? Double ?? 0) >= 1.4)
        #expect((extra["read_latency_paused_count"] as? Int ?? 0) > 0)
        #expect(extra["read_latency_paused_ns"] as? [String: Any] != nil)
        #expect((extra["pause_read_p50_ns"] as? Int ?? 0) > 0)
        #expect((extra["running_read_p99_ns"] as? Int ?? 0) > 0)
        #expect((extra["pause_store_p99_ns"] as? Int ?? 0) > 0)
        #expect((extra["running_store_p99_ns"] as? Int ?? 0) > 0)
        let pauseResurrected = try #require(extra["pause_resurrected"] as? Int)
        let pauseStale = try #require(extra["pause_stale_beyond_bound"] as? Int)
        #expect(pauseResurrected <= (extra["resurrected_removals_during_outage"] as? Int ?? -1))
        #expect(pauseStale <= (extra["stale_reads_during_outage"] as? Int ?? -1))
        // Redis's counters were read across its restart.
        #expect((extra["redis_store_usec_per_store"] as? Double ?? 0) > 0)

        // The hand-built pattern: its subscribers were killed and came back, its messages were dropped
        // (1 % with --fault), its memory hits timed in the pause.
        let pubsub = try #require(row(rows, "local-pubsub", tasks: 4))
        let pubsubExtra = try #require(pubsub["extra"] as? [String: Any])
        #expect((pubsubExtra["pubsub_clients_killed"] as? Int ?? 0) >= 4)
        #expect((pubsubExtra["subscription_losses"] as? Int ?? 0) >= 8)  // killed, then Redis killed
        #expect(pubsubExtra["drop_messages_applied"] as? Double == 0.01)
        #expect((pubsubExtra["messages_dropped"] as? Int ?? 0) > 0)
        #expect((pubsubExtra["recovery_seconds"] as? Double ?? 99) < 5)
        #expect(pubsubExtra["wrong_values"] as? Int == 0)
        #expect((pubsubExtra["hit_latency_paused_count"] as? Int ?? 0) > 0)
        #expect((pubsubExtra["pause_hit_p99_ns"] as? Int ?? 0) > 0)
        #expect((pubsubExtra["running_hit_p99_ns"] as? Int ?? 0) > 0)
        // Every caller error is tallied in the windows it fell in, or outside them all (none left out).
        let pubsubWindows = try #require(pubsubExtra["fault_windows"] as? [String: [String: Any]])
        let windowErrors = pubsubWindows.values.reduce(0) { $0 + ($1["caller_errors"] as? Int ?? 0) }
        #expect(windowErrors >= (pubsubExtra["caller_errors"] as? Int ?? 0))
        #expect((pubsubWindows["redis_killed"]?["caller_errors"] as? Int ?? 0) > 0)  // its writes failed
    }

    @Test("Redis evicting the fleet's keys (values, fences, counters) under load, no message lost unseen: no stale read, no caller error, coherence back",
          .enabled(if: RedisTools.isInstalled, "redis-server is not installed (make deps installs it)"))
    func evictionWindow() async throws {
        let rows = try await run([
            "--seconds", "15", "--keys", "500", "--fault", "--faults", "evict", "--drop-messages", "0",
            "--systems", "magpie-fleet", "--single-flight-callers", "0", "--tasks", "4",
        ])
        let fleet = try #require(row(rows, "magpie-fleet", tasks: 4))
        let extra = try #require(fleet["extra"] as? [String: Any])
        #expect(extra["wrong_values"] as? Int == 0)
        #expect(extra["caller_errors"] as? Int == 0)
        #expect(extra["stale_reads_beyond_bound"] as? Int == 0)
        #expect(extra["resurrected_removals"] as? Int == 0)
        let windows = try #require(extra["fault_windows"] as? [String: [String: Any]])
        #expect(Set(windows.keys) == ["redis_evicting", "outside"])
        let evicting = try #require(windows["redis_evicting"])
        #expect((evicting["keys_evicted"] as? Int ?? 0) > 0)
        #expect((evicting["maxmemory_bytes"] as? Int ?? 0) >= 1 << 20)
        #expect((evicting["recovery_seconds"] as? Double ?? 99) < 5)
        for (name, window) in windows {
            #expect(window["caller_errors"] as? Int == 0, "\(name)")
            #expect(window["stale_beyond_bound"] as? Int == 0, "\(name)")
        }
    }
}
