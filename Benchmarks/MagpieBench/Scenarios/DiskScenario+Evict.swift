import Foundation
import Histogram
import Magpie

// The eviction-heavy workload: a working set of 5 × the budget, Zipf-popular reads, and a store of the
// value on each miss (cache-aside), so every system must delete to stay within its budget, and that work
// is inside the measured stores.

extension DiskScenario {
    /// Runs the workload on one system: one `disk-evict` row. Operations are timed one by one (a get,
    /// and on a miss the set that follows it, as one operation); the hit ratio is the second half's
    /// (the first half fills the store). Bytes on disk are sampled every 1,000 operations (outside the
    /// timed region) and the largest sample is reported; device writes are counted from the first
    /// operation to the close.
    func measureEviction(_ name: String, directory: String, values: DiskValues) throws -> BenchResult {
        let budget = options.evictBudget
        let keys = options.evictKeys
        let operations = options.evictOps
        let ranks = ZipfWorkload(keyCount: keys, alpha: options.evictAlpha).ranks(seed: options.seed ^ 0xE71C, count: operations)
        // Zipf ranks shuffled over the key space (Fisher-Yates, seeded), so popular keys are not all JSON
        // or all random.
        var permutation = Array(0..<keys)
        var shuffle = options.seed ^ 0x5EED
        for index in stride(from: keys - 1, to: 0, by: -1) {
            shuffle = splitmix64(shuffle)
            permutation.swapAt(index, Int(shuffle % UInt64(index + 1)))
        }
        let names = (0..<keys).map { values.key($0) }
        let digest = KeyHash(seed: 0)
        var digests = [UInt64?](repeating: nil, count: keys)
        let system = try open(name, directory, budget: budget)

        var allLatency = latencyHistogram()
        var getLatency = allLatency
        var setLatency = allLatency
        var nanoseconds: UInt64 = 0
        var setNanoseconds: UInt64 = 0
        var (sets, failures, wrong, hits, measured, storedBytes, largest) = (0, 0, 0, 0, 0, 0, 0)
        let writesBefore = ProcessIO.current()
        let cpuBefore = processCPUSeconds()
        for (n, rank) in ranks.enumerated() {
            let i = permutation[Int(rank)]
            let key = names[i]
            let start = nowNanoseconds()
            let got = system.get(key)
            let afterGet = nowNanoseconds()
            var elapsed = afterGet - start
            _ = getLatency.record(elapsed)
            if let got {
                if n >= operations / 2 { hits += 1 }
                if digests[i] != digest.hash(got) { wrong += 1 }
            } else {
                let value = values.value(i)
                if digests[i] == nil { digests[i] = digest.hash(value) }
                storedBytes += key.utf8.count + value.count
                let setStart = nowNanoseconds()
                if !system.set(value, key: key) { failures += 1 }
                let setElapsed = nowNanoseconds() - setStart
                setNanoseconds += setElapsed
                _ = setLatency.record(setElapsed)
                sets += 1
                elapsed += setElapsed
            }
            if n >= operations / 2 { measured += 1 }
            nanoseconds += elapsed
            _ = allLatency.record(elapsed)
            if n % 1000 == 999 { largest = max(largest, directoryBytes(directory)) }
        }
        let cpu = processCPUSeconds() - cpuBefore
        var extra = system.extra()
        let entries = extra["entries"]
        system.close()
        let written = ProcessIO.current().deviceWrites(since: writesBefore)
        largest = max(largest, directoryBytes(directory))
        extra["configuration"] = .string(system.configuration)
        extra["entries"] = entries
        extra["budget_bytes"] = .int(budget)
        extra["du_bytes"] = .int(largest)
        extra["du_bytes_after_close"] = .int(directoryBytes(directory))
        extra["slack_bytes"] = .int(system.slackBytes)
        extra["within_budget_and_slack"] = .bool(largest <= budget + system.slackBytes)
        extra["working_set_keys"] = .int(keys)
        extra["zipf_alpha"] = .double(options.evictAlpha)
        extra["sets"] = .int(sets)
        extra["set_failures"] = .int(failures)
        extra["wrong_values"] = .int(wrong)
        extra["stored_bytes"] = .int(storedBytes)
        extra["device_write_bytes"] = .int(written)
        extra["write_amplification"] = .double(Double(written) / Double(max(storedBytes, 1)))
        extra["set_ops_per_sec"] = .double(setNanoseconds == 0 ? 0 : Double(sets) / (Double(setNanoseconds) / 1e9))
        extra["process_cpu_seconds"] = .double(cpu)
        extra["process_cpu_us_per_op"] = .double(cpu * 1e6 / Double(max(operations, 1)))
        extra["set_latency_ns"] = Percentiles(setLatency).json
        extra["get_latency_ns"] = Percentiles(getLatency).json
        // The reopen of a full store (a service's steady state): open, then a get of the hottest key.
        let reopenStart = nowNanoseconds()
        let reopened = try open(name, directory, budget: budget)
        let reopenNanoseconds = nowNanoseconds() - reopenStart
        let firstStart = nowNanoseconds()
        let first = reopened.get(names[permutation[0]])  // rank 0: the most popular
        let firstGet = nowNanoseconds() - firstStart
        extra["reopen_seconds"] = .double(Double(reopenNanoseconds) / 1e9)
        extra["first_get_after_reopen_ns"] = .int(Int(firstGet))
        extra["first_get_after_reopen_hit"] = .bool(first != nil)
        reopened.close()
        let seconds = Double(nanoseconds) / 1e9
        return BenchResult(
            scenario: "disk-evict", system: name, threads: 1, operations: operations, seconds: seconds,
            ops_per_sec: operations == 0 ? 0 : Double(operations) / seconds, latency_ns: Percentiles(allLatency),
            hit_ratio: measured == 0 ? 0 : Double(hits) / Double(measured), extra: extra)
    }
}
