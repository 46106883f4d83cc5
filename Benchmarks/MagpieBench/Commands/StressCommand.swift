import ArgumentParser
import Foundation
import Magpie
import Synchronization

/// `magpie-bench stress`: a long randomized mixed workload over both tiers with invariant checks.
///
/// Every task owns some keys and shares others. For an owned key the task knows the latest value it set
/// (or that it removed the key), so a read must return nil (evicted, expired, or removed by another
/// task's remove-all) or exactly that value: an older version or a removed value coming back is a
/// violation. A shared key is written by every task; a read must return a value written for that key,
/// byte for byte. Every operation of the public API is in the mix (sync and async, the single-flight
/// loader, tier-only entries, groups, remove-all, expiry, statistics). Budgets are checked at every
/// report. Exit status 1 on any violation or unexpected error.
struct Stress: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Randomized mixed operations on a two-tier cache from many tasks, checking every read and both budgets.")

    @Option(help: "Seconds to run.") var duration = 60.0
    @Option(help: "Stop early after this many operations in all (0: no limit).") var maxOperations = 0
    @Option(help: "Tasks (0: 2 × cores).") var tasks = 0
    @Option(help: "Keys each task owns.") var ownedKeys = 64
    @Option(help: "Keys every task shares.") var sharedKeys = 64
    @Option(help: "Memory budget in bytes (small, so that eviction and promotion never stop).") var memoryBudget = 256 << 10
    @Option(help: "Disk budget in bytes (small, so that disk eviction and compaction never stop).") var diskBudget = 192 << 10
    @Option(help: "Disk bucket count.") var buckets = 8
    @Option(help: "Memory shard count.") var shards = 8
    @Option(help: "Seed of the operation sequences.") var seed: UInt64 = 1
    @Option(help: "Seconds between progress lines.") var reportEvery = 5.0
    @Option(help: "Parent directory for the cache directory (removed afterwards).") var workDirectory: String?

    func validate() throws {
        guard duration > 0, reportEvery > 0, ownedKeys >= 1, sharedKeys >= 1, tasks >= 0, maxOperations >= 0 else {
            throw ValidationError("--duration, --report-every > 0; --owned-keys, --shared-keys ≥ 1; --tasks, --max-operations ≥ 0")
        }
    }

    func run() async throws {
        let parent = workDirectory ?? NSTemporaryDirectory()
        let directory = parent + "/magpie-stress-\(getpid())"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var configuration = Cache.Configuration(directory: directory, memoryBudget: memoryBudget, diskBudget: diskBudget)
        configuration.disk?.bucketCount = buckets
        configuration.memory.shardCount = shards
        configuration.metrics = nil
        let cache = try Cache(configuration)
        let taskCount = tasks > 0 ? tasks : 2 * ProcessInfo.processInfo.activeProcessorCount
        let shared = StressShared()
        let start = nowNanoseconds()
        let end = start + UInt64(duration * 1e9)
        emit("stress: \(taskCount) tasks, \(ownedKeys) owned keys each, \(sharedKeys) shared, memory budget \(memoryBudget) B, "
            + "disk budget \(diskBudget) B, \(buckets) buckets, \(shards) shards, seed \(seed), \(duration) s")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<taskCount {
                group.addTask {
                    var worker = StressWorker(
                        task: task, cache: cache, shared: shared, ownedKeys: ownedKeys, sharedKeys: sharedKeys,
                        seed: seed &+ UInt64(task) &* 0x9E37_79B9_7F4A_7C15)
                    while nowNanoseconds() < end && !shared.stop.load(ordering: .relaxed) {
                        for _ in 0..<64 { await worker.step() }
                        let total = shared.operations.add(64, ordering: .relaxed).newValue
                        if maxOperations > 0 && total >= maxOperations { shared.stop.store(true, ordering: .relaxed) }
                    }
                }
            }
            group.addTask {
                var next = start + UInt64(reportEvery * 1e9)
                while nowNanoseconds() < end && !shared.stop.load(ordering: .relaxed) {
                    try await Task.sleep(for: .milliseconds(50))
                    if nowNanoseconds() >= next {
                        report(cache, shared, start: start, directory: directory)
                        next += UInt64(reportEvery * 1e9)
                    }
                }
            }
            try await group.waitForAll()
        }
        report(cache, shared, start: start, directory: directory)
        try cache.close()
        let violations = shared.violations.withLock { $0 }
        let operations = shared.operations.load(ordering: .relaxed)
        let seconds = Double(nowNanoseconds() - start) / 1e9
        emit(
            "stress: \(operations) operations in \(String(format: "%.1f", seconds)) s (\(formatRate(Double(operations) / seconds))/s), "
                + "\(shared.reads.load(ordering: .relaxed)) reads checked, \(violations.count) violations")
        for violation in violations.prefix(20) { emit("  violation: \(violation)") }
        if !violations.isEmpty { throw ExitCode(1) }
    }

    func report(_ cache: Cache, _ shared: StressShared, start: UInt64, directory: String) {
        let stats = cache.statistics
        let disk = stats.disk ?? DiskTierStatistics()
        if stats.memory.chargedBytes > memoryBudget {
            shared.violate("memory tier charged \(stats.memory.chargedBytes) B over its budget \(memoryBudget) B")
        }
        if disk.bytesOnDisk > diskBudget {
            shared.violate("disk tier holds \(disk.bytesOnDisk) B over its budget \(diskBudget) B")
        }
        if stats.diskErrors > 0 { shared.violate("\(stats.diskErrors) disk errors") }
        let seconds = Double(nowNanoseconds() - start) / 1e9
        let operations = shared.operations.load(ordering: .relaxed)
        emit(
            String(
                format: "  %6.1f s  %12d ops  %9@/s  rss %6.1f MiB  memory %4.0f%% of budget  disk %4.0f%%  "
                    + "hits mem %d disk %d  evictions %d/%d  violations %d",
                seconds, operations, formatRate(Double(operations) / seconds), Double(residentBytes()) / 1_048_576,
                100 * Double(stats.memory.chargedBytes) / Double(memoryBudget), 100 * Double(disk.bytesOnDisk) / Double(diskBudget),
                stats.memory.hits, disk.hits, stats.memory.evictions, disk.evictions,
                shared.violations.withLock { $0.count }))
    }
}
