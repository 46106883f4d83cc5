import ArgumentParser
import Foundation
import Histogram
import Magpie
import MagpieRedis

// `magpie-bench fleet-async`: the remote tier called the way services call it, from N concurrent tasks
// on Swift's global executor, beside the best plain alternative at the same concurrency (the same
// RedisClient configuration, called from the same kind of tasks), on one private redis-server.
//
// Per concurrency (default 1, 16 and 256 tasks), in one run:
//   set      RedisClient SET, and the hand-built pattern's store (SET + PUBLISH of the key, pipelined,
//            one subscriber on the channel, as the writer's own cache has)  vs  cache.async.set through
//            to Redis (each key once)
//   get      RedisClient GET            vs  cache.async.value of keys only Redis holds (a fresh
//                                           instance reads each key once: every read a remote hit)
//   hit      cache.async.value memory hits of a cache without a remote tier  vs  the same hits of
//            the cache with a remote tier (its local copies confirmed by the feed)
// Each row is timed over a fixed number of operations; latency per operation, from its caller.

struct RemoteAsyncOptions: ParsableArguments {
    @Option(parsing: .upToNextOption, help: "Concurrent tasks per measurement.") var tasks: [Int] = [1, 16, 256]
    @Option(help: "Operations per set/get row (a quarter of it at 1 task).") var operations = 40_000
    @Option(help: "Memory hits per hit row.") var hits = 400_000
    @Option(help: "Value size in bytes.") var valueSize = 100

    /// Every workload parameter, for the JSON report.
    var config: [String: JSONValue] {
        [
            "tasks": .array(tasks.map { .int($0) }), "operations": .int(operations), "hits": .int(hits),
            "value_size": .int(valueSize), "server": .string("private redis-server (no persistence)"),
        ]
    }
}

struct RemoteAsyncScenario {
    let options: RemoteAsyncOptions

    func run(progress: (String) -> Void) async throws -> [BenchResult] {
        let target = try await RedisTarget.open(nil)
        do {
            let results = try await measure(target, progress: progress)
            try await target.close()
            return results
        } catch {
            try? await target.close()
            throw error
        }
    }

    private func measure(_ target: RedisTarget, progress: (String) -> Void) async throws -> [BenchResult] {
        let value = (0..<options.valueSize).map { UInt8(ascii: "a") + UInt8($0 % 26) }
        var results: [BenchResult] = []
        let client = try RedisClient(target.configuration)
        defer { Task { await client.shutdown() } }
        for (round, tasks) in options.tasks.enumerated() {
            let count = tasks == 1 ? options.operations / 4 : options.operations
            let namespace = "fa\(round):"
            // set: the plain client, then the cache with a remote tier (its local copies kept, its store answered).
            progress("fleet-async: \(tasks) task(s), SET ×\(count)")
            results.append(
                try await timed("set", system: "redis-client", tasks: tasks, count: count) { i in
                    _ = try await client.set("\(namespace)c:\(i)", value)
                    return true
                })
            // The pattern users build by hand (FleetLocalPubSubSystem): SET, then PUBLISH the key, in one batch.
            let subscriber = client.makeSubscriber()
            let subscription = try await subscriber.subscribe(to: ["\(namespace)invalidations"])
            let listener = Task { for await _ in subscription {} }
            progress("fleet-async: \(tasks) task(s), SET + PUBLISH ×\(count)")
            results.append(
                try await timed("set", system: "redis-set-publish", tasks: tasks, count: count) { i in
                    let key = "\(namespace)p:\(i)"
                    for reply in try await client.send(batch: [.set(key, value), RedisCommand("PUBLISH", [.string("\(namespace)invalidations"), .string(key)])]) {
                        _ = try reply.get()
                    }
                    return true
                })
            listener.cancel()
            await subscriber.close()
            let writer = try RemoteTierCache(target, namespace: namespace)
            try await writer.confirmed()
            progress("fleet-async: \(tasks) task(s), cache.async.set ×\(count)")
            results.append(
                try await timed("set", system: "magpie-fleet", tasks: tasks, count: count) { i in
                    try await writer.cache.async.set(value, forKey: "m:\(i)")
                    return true
                })
            // get: the plain client, then a fresh instance whose every read is a remote hit.
            progress("fleet-async: \(tasks) task(s), GET ×\(count)")
            results.append(
                try await timed("get", system: "redis-client", tasks: tasks, count: count) { i in
                    try await client.get("\(namespace)c:\(i)") != nil
                })
            let reader = try RemoteTierCache(target, namespace: namespace)
            try await reader.confirmed()
            progress("fleet-async: \(tasks) task(s), cache.async.value (remote hits) ×\(count)")
            var remote = try await timed("get", system: "magpie-fleet", tasks: tasks, count: count) { i in
                try await reader.cache.async.value(forKey: "m:\(i)") != nil
            }
            remote.extra["remote_hits"] = .int(Int(reader.cache.statistics.remote?.hits ?? 0))
            results.append(remote)
            // hit: memory hits of a plain cache, then of the cache with a remote tier (the reader's kept copies).
            var plainConfiguration = Cache.Configuration(memoryBudget: 64 << 20)
            plainConfiguration.metrics = nil
            let plain = try Cache(plainConfiguration)
            let hot = 1_000
            for i in 0..<hot { try plain.set(value, forKey: "m:\(i)") }
            progress("fleet-async: \(tasks) task(s), memory hits ×\(options.hits), cache without and with a remote tier")
            results.append(
                try await timed("hit", system: "magpie-local", tasks: tasks, count: options.hits) { i in
                    try await plain.async.value(forKey: "m:\(i % hot)") != nil
                })
            for i in 0..<hot { _ = try await reader.cache.async.value(forKey: "m:\(i)") }  // kept locally
            let before = reader.cache.statistics.remote?.hits ?? 0
            var remoteHits = try await timed("hit", system: "magpie-fleet", tasks: tasks, count: options.hits) { i in
                try await reader.cache.async.value(forKey: "m:\(i % hot)") != nil
            }
            remoteHits.extra["remote_hits_during"] = .int(Int((reader.cache.statistics.remote?.hits ?? 0) - before))
            results.append(remoteHits)
            try plain.close()
            await writer.close()
            await reader.close()
        }
        return results
    }

    /// Runs `operation(i)` for i in 0..<count from `tasks` concurrent tasks (each takes the next i), on
    /// the global executor (Scenarios/TaskDriver.swift); a row with the rate, each operation's latency,
    /// and the share that found something.
    private func timed(
        _ workload: String, system: String, tasks: Int, count: Int, _ operation: @escaping @Sendable (Int) async throws -> Bool
    ) async throws -> BenchResult {
        taskRow("fleet-async", system, workload: workload, tasks: tasks, count: count, await driveTasks(tasks: tasks, count: count, operation) { $1 })
    }
}

/// One instance with a remote tier: memory only, in front of the private server's `namespace`.
struct RemoteTierCache {
    let cache: Cache
    let store: RedisRemoteStore

    init(_ target: RedisTarget, namespace: String) throws {
        store = try RedisRemoteStore(.init(redis: target.configuration, namespace: namespace))
        var configuration = Cache.Configuration(memoryBudget: 64 << 20)
        configuration.metrics = nil
        configuration.remote = RemoteTierOptions(store: store)
        cache = try Cache(configuration)
    }

    /// Waits (up to 10 s) until the change feed is confirmed: local copies are kept from then on.
    func confirmed() async throws {
        let start = ContinuousClock.now
        while (cache.statistics.remote?.confirmations ?? 0) == 0 {
            guard ContinuousClock.now - start < .seconds(10) else { throw BenchError("the change feed was never confirmed") }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    func close() async {
        try? await cache.shutdown(replayingFor: .seconds(1))
    }
}

/// The table: per concurrency and workload, the plain alternative and Magpie side by side.
func remoteAsyncTable(_ results: [BenchResult]) -> Table {
    var table = Table(
        "fleet-async: the remote tier from async tasks (one private redis-server, one run)",
        ["workload", "tasks", "system", "ops/s", "p50 µs", "p99 µs", "found", "ratio", "× SET+PUBLISH"], left: 1)
    var baseline: [String: Double] = [:]
    var pattern: [String: Double] = [:]
    for row in results where row.scenario == "fleet-async" {
        guard let workload = row.extra["workload"]?.stringValue else { continue }
        let key = "\(workload)/\(row.threads)"
        var (ratio, patternRatio) = ("", "")
        if row.system == "magpie-fleet", let base = baseline[key] { ratio = String(format: "%.2f ×", row.ops_per_sec / base) }
        if row.system == "magpie-fleet", let base = pattern[key] { patternRatio = String(format: "%.2f ×", row.ops_per_sec / base) }
        if row.system == "redis-set-publish" {
            pattern[key] = row.ops_per_sec
        } else if row.system != "magpie-fleet" {
            baseline[key] = row.ops_per_sec
        }
        table.append([
            workload, String(row.threads), row.system, String(format: "%.0f", row.ops_per_sec), micros(row.latency_ns.p50),
            micros(row.latency_ns.p99), String(format: "%.3f", row.hit_ratio), ratio, patternRatio,
        ])
    }
    table.alignments[2] = .left
    return table
}
