import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import MagpieBench

/// The fleet benchmark's parts that need no Redis: the Redis counters it reads, the round trips'
/// attribution, the hand-built pattern's local map, the per-process single flight.
@Suite("magpie-bench fleet: parts")
struct BenchFleetPartsTests {
    static let info = """
        # CPU\r
        used_cpu_sys:1.500000\r
        used_cpu_user:2.250000\r
        used_cpu_sys_children:0.000000\r
        # Commandstats\r
        cmdstat_evalsha:calls=100,usec=2000,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r
        cmdstat_set:calls=300,usec=600,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r
        cmdstat_get:calls=1000,usec=1000,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r
        """

    @Test(
        "INFO cpu commandstats: parsed, differenced, summed across a restart; a store sums only its system's top-level commands"
    )
    func redisStats() throws {
        let before = FleetRedisStats(info: Self.info)
        #expect(before.commands["evalsha"] == .init(calls: 100, usec: 2000))
        #expect(before.commands["set"] == .init(calls: 300, usec: 600))
        #expect(abs(before.cpuSeconds - 3.75) < 1e-9)  // user + sys, not the children's
        var after = before
        after.commands["evalsha"] = .init(calls: 150, usec: 3500)
        after.commands["publish"] = .init(calls: 10, usec: 50)
        after.cpuSeconds = 4.75
        let delta = after - before
        #expect(delta.commands["evalsha"] == .init(calls: 50, usec: 1500))
        #expect(delta.commands["set"] == .init(calls: 0, usec: 0))
        #expect(delta.commands["publish"] == .init(calls: 10, usec: 50))
        #expect(abs(delta.cpuSeconds - 1) < 1e-9)
        // A restarted server counts from zero: the window is the part before the kill plus what came after.
        let restarted = FleetRedisStats(
            info: "cmdstat_evalsha:calls=20,usec=400,usec_per_call=20.00\r\nused_cpu_user:0.5\r\n")
        let window = delta + restarted
        #expect(window.commands["evalsha"] == .init(calls: 70, usec: 1900))
        // Magpie's stores are scripts (their inner SETs are inside their time, not summed again).
        let extra = window.extra(system: "magpie-fleet", stores: 95, operations: 1000)
        #expect(extra["redis_store_usec"] == .int(1900))
        #expect(extra["redis_store_usec_per_store"] == .double(20))
        #expect(extra["redis_usec_per_call_evalsha"] == .double(1900.0 / 70))
        #expect(extra["redis_usec_per_call_publish"] == .double(5))
        let cacheAside = window.extra(system: "redis-cache-aside", stores: 10, operations: 1000)
        #expect(cacheAside["redis_store_usec"] == .int(0))  // no set or del in this window
        #expect(cacheAside["redis_store_commands"] == .array([.string("set"), .string("del")]))
    }

    @Test("round trips count as the operation's whose task sent them: its own, a task it started, a thread caller's blocking task")
    func roundTripsByCause() async throws {
        // What a client's pool does per round trip (the metrics backend calls this), here by hand:
        // `FleetRoundTrips.shared` is the process's, touched by no other test in this process.
        let counter = FleetRoundTrips.shared
        let before = counter.snapshot()
        await FleetRoundTrips.run(.set, measured: true) {
            counter.count(commands: 1)
            await Task { counter.count(commands: 2) }.value  // a task the operation started
        }
        await FleetRoundTrips.run(.removal, measured: false) { counter.count(commands: 1) }  // the warm-up's
        counter.count(commands: 1)  // no operation's: background
        try await offloaded {
            // A thread caller: the system's blocking form runs the call as a task (FleetInstance.blocking).
            try FleetRoundTrips.runBlocking(.read, measured: true) { try FleetInstance.blocking { counter.count(commands: 3) } }
        }
        let line = FleetRoundTrips.report(from: before, to: counter.snapshot())
        #expect(line["redis_operations_set"] == .int(1))
        #expect(line["redis_round_trips_set"] == .int(2) && line["redis_commands_set"] == .int(3))
        #expect(line["redis_operations_removal"] == .int(0) && line["redis_round_trips_removal"] == .int(0))
        #expect(line["redis_operations_read"] == .int(1) && line["redis_round_trips_read"] == .int(1))
        #expect(line["redis_commands_read"] == .int(3))
        #expect(line["redis_round_trips_background"] == .int(1))
        #expect(line["redis_round_trips_warmup"] == nil)
        #expect(counter.snapshot()[.warmup]?.roundTrips == (before[.warmup]?.roundTrips ?? 0) + 1)
    }

    @Test("the local map stays within its budget (CLOCK eviction keeps referenced entries) and drops what it is told")
    func localMap() {
        let value = [UInt8](repeating: 1, count: 100)
        // One stripe of 10 entries' room (each charged 100 + the key + 64 bytes).
        let map = FleetLocalMap(budget: 10 * (100 + 5 + 64), stripes: 1)
        for i in 0..<10 { map.set("k:\(i)", value) }
        #expect(map.count == 10)
        #expect(map.value("k:3") == value)  // referenced: survives the next sweep
        map.set("k:10", value)
        #expect(map.count == 10)
        #expect(map.contains("k:3"))
        #expect(map.contains("k:10"))
        for i in 11..<100 { map.set("k:\(i)", value) }
        #expect(map.count == 10)
        #expect(map.remove("k:99"))
        #expect(!map.contains("k:99"))
        #expect(map.count == 9)
        map.set("k:98", [2])  // replaced, not added
        #expect(map.value("k:98") == [2])
        #expect(map.count == 9)
        map.removeAll()
        #expect(map.count == 0)
    }

    @Test("per-process single flight: concurrent callers of a key share one load; a later caller loads again")
    func singleFlight() async throws {
        let flights = FleetFlights<Int>()
        let runs = Runs()
        let values = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<50 {
                group.addTask {
                    try await flights.run("key") {
                        runs.count.add(1, ordering: .relaxed)
                        try await Task.sleep(for: .milliseconds(200))
                        return 7
                    }
                }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(values == [Int](repeating: 7, count: 50))
        #expect(runs.count.load(ordering: .relaxed) == 1)
        #expect(flights.count == 0)
        _ = try await flights.run("key") {
            runs.count.add(1, ordering: .relaxed)
            return 8
        }
        #expect(runs.count.load(ordering: .relaxed) == 2)
    }
}

private final class Runs: Sendable {
    let count = Atomic<Int>(0)
}
