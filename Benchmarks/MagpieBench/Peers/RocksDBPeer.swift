import ArgumentParser
import Foundation

// The RocksDB peer (Benchmarks/Peers/rocksdb_cache_peer.cc, built by `make peers`) as systems of the
// memory scenario, and the scenario's summary of ratios, all from one run.

extension MemoryScenario {
    /// Runs the RocksDB peer on the same workload (same keys, same sequences, same budget) and reads its
    /// passes. It times throughput only: its latency fields are 0.
    func runPeer(_ path: String, kind: String, workload: MemoryWorkload, threads: Int) throws -> BenchResult {
        let (status, data) = try runProcess(path, [
            kind, "\(threads)", "\(options.ops)", "\(workload.hotKeys)", "\(options.keys)", "\(options.alpha)",
            "\(options.effectiveBudget)", "\(options.valueSize)", "\(options.repetitions)", "\(options.warmup)",
            "\(options.seed)", "\(options.threadSeedBase)",
        ])
        guard status == 0 else { throw ValidationError("the RocksDB peer (\(path)) exited with \(status)") }
        var rates: [Double] = []
        var hitRatio = 0.0
        var usage = 0
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ")
            if fields.count == 8, fields[0] == "pass", let seconds = Double(fields[3]), let hits = Double(fields[5]),
                let operations = Double(fields[7]), seconds > 0
            {
                if rates.isEmpty { hitRatio = hits / operations }
                rates.append(operations / seconds)
            } else if fields.count == 2, fields[0] == "usage", let bytes = Int(fields[1]) {
                usage = bytes
            }
        }
        guard !rates.isEmpty else { throw ValidationError("the RocksDB peer (\(path)) printed no pass") }
        let median = percentile(50, of: rates)!
        let operations = options.ops * threads
        var extra: [String: JSONValue] = [
            "ops_per_sec_passes": .array(rates.map { .double($0) }), "ops_per_sec_min": .double(rates.min()!),
            "peer": .string(path), "usage_bytes": .int(usage), "latency_measured": .bool(false),
            "configuration": .string(
                kind == "hcc"
                    ? "HyperClockCache(capacity \(options.effectiveBudget), estimated entry charge \(16 + options.valueSize)), metadata not charged"
                    : "LRUCache(capacity \(options.effectiveBudget), default shards), metadata not charged"),
        ]
        if workload != .zipf { extra["hot_keys"] = .int(workload.hotKeys) }
        return BenchResult(
            scenario: workload.scenario, system: "rocksdb-\(kind)", threads: threads, operations: operations,
            seconds: Double(operations) / median, ops_per_sec: median, latency_ns: .zero, hit_ratio: hitRatio, extra: extra)
    }
}

/// The memory scenario's ratios, all from this run: per workload and system, the rate at the lowest and
/// highest thread counts, the scaling between them, the ratio to the RocksDB peer at the highest, and
/// steadiness (the slowest pass over the median, worst over the thread counts). Nil without memory rows.
func memorySummaryTable(_ results: [BenchResult]) -> Table? {
    let rows = results.filter { ($0.scenario == "memory" || $0.scenario == "memory-hotkeys") && $0.extra["sweep_parameter"] == nil }
    let counts = Set(rows.map(\.threads)).sorted()
    guard let low = counts.first, let high = counts.last, !rows.isEmpty else { return nil }
    func hot(_ r: BenchResult) -> Int { r.extra["hot_keys"]?.intValue ?? 0 }
    var table = Table(
        "Memory: scaling with threads and the RocksDB peer, from this run (ops/s: median of the passes)",
        ["workload", "system", "\(low) thr", "\(high) thr", "scaling", "× rocksdb-hcc at \(high)", "min/median"])
    var workloads: [(String, Int)] = []
    for r in rows where !workloads.contains(where: { $0 == (r.scenario, hot(r)) }) { workloads.append((r.scenario, hot(r))) }
    for (scenario, keys) in workloads {
        let group = rows.filter { $0.scenario == scenario && hot($0) == keys }
        let peer = group.first { $0.system == "rocksdb-hcc" && $0.threads == high }
        for system in distinct(group.map(\.system)) {
            let one = group.first { $0.system == system && $0.threads == low }
            let many = group.first { $0.system == system && $0.threads == high }
            let scaling = one.flatMap { a in many.map { $0.ops_per_sec / a.ops_per_sec } }
            let versus = peer.flatMap { p in many.map { $0.ops_per_sec / p.ops_per_sec } }
            let steady = group.filter { $0.system == system }.compactMap { r in r.extra["ops_per_sec_min"]?.numberValue.map { $0 / r.ops_per_sec } }.min()
            table.append([
                keys == 0 ? "Zipf" : "\(keys) hot keys", system, one.map { formatRate($0.ops_per_sec) } ?? "-",
                many.map { formatRate($0.ops_per_sec) } ?? "-", scaling.map { String(format: "%.2f ×", $0) } ?? "-",
                versus.map { String(format: "%.2f", $0) } ?? "-", steady.map { String(format: "%.2f", $0) } ?? "-",
            ])
        }
    }
    return table
}
