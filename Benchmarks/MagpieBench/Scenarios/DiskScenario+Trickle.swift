import Foundation
import Histogram
import Magpie

// Stores at a trickle: what an open store costs a service that writes little. Each system stores 4 KiB
// values (new keys; overwrites with `--keys` below the run's stores) at a fixed rate (0 = open and idle)
// for a few seconds, paced by sleeping to a schedule, and the row reports the process's CPU time and
// context switches per second of wall time, all threads included (a store's background threads are what
// this measures), beside a `none` row: the pacing loop alone, which every other row pays too. Not in the
// default workloads (`--workloads trickle`).

extension DiskScenario {
    /// One `disk-trickle-<rate>/s` row per rate for `name` (`none`: the pacing loop without a store).
    func measureTrickle(_ name: String, directory: String, values: DiskValues) throws -> [BenchResult] {
        // Keys and values are made before the clock starts (making a value costs more CPU than some stores
        // do): `--keys` distinct keys (up to the stores of the run), cycled, so that the default (100,000)
        // stores new keys and `--keys 2000` overwrites; 2,000 values, cycled. The store gets a second to
        // settle after its open (background index loads, first allocations).
        let storesInRun = options.trickleRates.reduce(0) { $0 + Int(Double($1) * options.trickleSeconds) + 1 }
        let names = (0..<max(1, min(options.keys, storesInRun))).map { values.key($0) }
        let pool = (0..<min(names.count, 2_000)).map { values.value($0) }
        let system: (any DiskSystem)? = name == "none" ? nil : try open(name, directory, budget: options.evictBudget)
        defer { system?.close() }
        usleep(1_000_000)
        var rows: [BenchResult] = []
        var key = 0
        for rate in options.trickleRates {
            var latency = latencyHistogram()
            let wallStart = nowNanoseconds()
            let cpuBefore = processCPUSeconds()
            let switchesBefore = contextSwitches()
            let duration = UInt64(options.trickleSeconds * 1e9)
            var stores = 0
            var failures = 0
            if rate == 0 {
                // Open and idle: sleep through the period in 10 ms naps, as a quiet service's thread would.
                while nowNanoseconds() - wallStart < duration { usleep(10_000) }
            } else {
                let interval = 1e9 / Double(rate)
                while true {
                    let due = wallStart + UInt64(Double(stores) * interval)
                    if due - wallStart >= duration { break }
                    let now = nowNanoseconds()
                    if due > now { usleep(UInt32((due - now) / 1000)) }
                    if let system {
                        let name = names[key % names.count]
                        let value = pool[key % names.count % pool.count]
                        let start = nowNanoseconds()
                        if !system.set(value, key: name) { failures += 1 }
                        _ = latency.record(nowNanoseconds() - start)
                    }
                    key += 1
                    stores += 1
                }
                // To the period's end, so that every row's wall time is the same period.
                let end = wallStart + duration
                let now = nowNanoseconds()
                if end > now { usleep(UInt32((end - now) / 1000)) }
            }
            let wall = Double(nowNanoseconds() - wallStart) / 1e9
            let cpu = processCPUSeconds() - cpuBefore
            let switches = contextSwitches() - switchesBefore
            rows.append(
                BenchResult(
                    scenario: "disk-trickle-\(rate)/s", system: name, threads: 1, operations: system == nil ? 0 : stores,
                    seconds: wall, ops_per_sec: system == nil ? 0 : Double(stores) / wall, latency_ns: Percentiles(latency), hit_ratio: 0,
                    extra: [
                        "rate_per_second": .int(rate), "cpu_ms_per_second": .double(cpu * 1000 / wall),
                        "context_switches_per_second": .double(Double(switches) / wall), "failed_stores": .int(failures),
                        "what": .string(
                            system == nil
                                ? "the pacing loop alone (sleeps to the schedule, stores nothing): every row's own cost"
                                : "\(rate) stores/s of 4 KiB values for \(options.trickleSeconds) s over \(names.count) keys, cycled; CPU and context switches of the whole process"),
                    ]))
        }
        return rows
    }
}

/// Voluntary and involuntary context switches of the whole process (all threads), from `getrusage`.
func contextSwitches() -> Int {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return usage.ru_nvcsw + usage.ru_nivcsw
}
