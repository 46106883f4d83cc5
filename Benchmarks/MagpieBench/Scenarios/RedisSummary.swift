import Foundation

/// The Redis rows as two tables: the rows side by side per round (nil with none), then each bar with its
/// ratio per round and its verdict (on the median ratio over the rounds); nil without Redis rows.
func redisTables(_ results: [BenchResult]) -> (rows: Table?, bars: Table)? {
    func string(_ row: BenchResult, _ key: String) -> String { row.extra[key]?.stringValue ?? "" }
    func int(_ row: BenchResult, _ key: String) -> Int? { row.extra[key]?.intValue }
    func micros(_ ns: UInt64) -> String { ns == 0 ? "-" : String(format: "%.1f", Double(ns) / 1e3) }
    let rows = results.filter { $0.scenario == "redis-get" || $0.scenario == "redis-set" }
    guard !rows.isEmpty || results.contains(where: { $0.scenario == "redis-breaker" }) else { return nil }
    var table = Table(
        "redis: magpie-redis and redis-benchmark on the same server, same workload, this run",
        [
            "round", "workload", "system", "ops/s", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs", "latency of",
            "client CPU µs/cmd", "errors",
        ])
    for row in rows {
        table.append([
            String(int(row, "round") ?? 0), "\(row.scenario) \(string(row, "mode"))",
            row.system + (string(row, "caller").isEmpty ? "" : " (\(string(row, "caller")))"),
            formatRate(row.ops_per_sec), micros(row.latency_ns.p50), micros(row.latency_ns.p90),
            micros(row.latency_ns.p99), micros(row.latency_ns.p999), micros(row.latency_ns.max),
            string(row, "mode") == "single" ? "call" : "batch of \(int(row, "pipeline_depth") ?? 0)",
            row.extra["client_cpu_ns_per_command"]?.numberValue.map { String(format: "%.2f", $0 / 1e3) } ?? "-",
            int(row, "errors").map(String.init) ?? "-",
        ])
    }

    /// Per round: (magpie, redis-benchmark) rows of one scenario and mode.
    func pairs(_ scenario: String, _ mode: String, _ caller: String) -> [(round: Int, magpie: BenchResult, benchmark: BenchResult)] {
        let matching = rows.filter { $0.scenario == scenario && string($0, "mode") == mode }
        return Set(matching.compactMap { int($0, "round") }).sorted().compactMap { round in
            guard let magpie = matching.first(where: {
                    int($0, "round") == round && $0.system == "magpie-redis" && string($0, "caller") == caller
                }),
                let benchmark = matching.first(where: { int($0, "round") == round && $0.system == "redis-benchmark" })
            else { return nil }
            return (round, magpie, benchmark)
        }
    }
    var bars = Table(
        "redis: bars (ratio = magpie-redis / redis-benchmark; verdict on the median over the rounds)",
        ["bar", "round", "magpie-redis", "redis-benchmark", "ratio", "target", "verdict"])
    /// A ratio per round, then the median's verdict (`atLeast`: the ratio must be ≥ the bar, else ≤).
    func addRatio(
        _ title: String, _ scenario: String, _ mode: String, bar: Double?, atLeast: Bool,
        _ measure: (BenchResult) -> Double, _ show: (Double) -> String
    ) {
        for caller in ["task", "event-loop"] {
        let rounds = pairs(scenario, mode, caller)
        guard !rounds.isEmpty else { continue }
        let title = "\(title) (\(caller) callers)"
        var ratios: [Double] = []
        for pair in rounds {
            let ratio = measure(pair.magpie) / measure(pair.benchmark)
            ratios.append(ratio)
            bars.append([
                title, String(pair.round), show(measure(pair.magpie)), show(measure(pair.benchmark)),
                String(format: "%.2f", ratio), "", "",
            ])
        }
        let middle = median(ratios)
        let target = bar.map { (atLeast ? "≥ " : "≤ ") + String(format: "%.2f", $0) } ?? "(no bar)"
        let verdict = bar.map { bar in (atLeast ? middle >= bar : middle <= bar) ? "met" : "not met" } ?? "-"
        bars.append([title, "median", "", "", String(format: "%.2f", middle), target, verdict])
        }
    }
    let rate: (BenchResult) -> Double = { $0.ops_per_sec }
    let p50: (BenchResult) -> Double = { Double($0.latency_ns.p50) }
    addRatio("pipelined GET ops/s", "redis-get", "pipelined", bar: 0.8, atLeast: true, rate, formatRate)
    addRatio("single GET p50", "redis-get", "single", bar: 1.2, atLeast: false, p50) { micros(UInt64($0)) + " µs" }
    addRatio("pipelined SET ops/s", "redis-set", "pipelined", bar: nil, atLeast: true, rate, formatRate)
    addRatio("single SET p50", "redis-set", "single", bar: nil, atLeast: false, p50) { micros(UInt64($0)) + " µs" }
    let cpu: (BenchResult) -> Double = { $0.extra["client_cpu_ns_per_command"]?.numberValue ?? .nan }
    addRatio("single GET client CPU/cmd", "redis-get", "single", bar: nil, atLeast: false, cpu) {
        String(format: "%.2f µs", $0 / 1e3)
    }
    addRatio("pipelined GET client CPU/cmd", "redis-get", "pipelined", bar: nil, atLeast: false, cpu) {
        String(format: "%.2f µs", $0 / 1e3)
    }
    if let breaker = results.first(where: { $0.scenario == "redis-breaker" }) {
        let p99 = breaker.latency_ns.p99
        let clean = int(breaker, "non_circuit_open_outcomes") == 0
        let probes = int(breaker, "connect_failures_during") ?? 0
        let withinProbe = probes <= (int(breaker, "background_probe_bound") ?? 0)
        let met = p99 <= 10_000 && clean && withinProbe
        bars.append([
            "breaker open: fail-fast p99", "-", String(format: "%.2f µs", Double(p99) / 1e3), "", "",
            "≤ 10 µs", met ? "met" : "not met",
        ])
        bars.append([
            "  (p50 / p99.9 / max)", "-",
            String(
                format: "%.2f / %.2f / %.1f µs", Double(breaker.latency_ns.p50) / 1e3,
                Double(breaker.latency_ns.p999) / 1e3, Double(breaker.latency_ns.max) / 1e3), "", "", "", "",
        ])
        if let prebuilt = Percentiles(breaker.extra["prebuilt_command_latency_ns"]) {
            bars.append([
                "  send(prebuilt command) p50 / p99", "-",
                String(format: "%.2f / %.2f µs", Double(prebuilt.p50) / 1e3, Double(prebuilt.p99) / 1e3), "", "", "", "",
            ])
        }
        bars.append([
            "  other outcomes, connects during", "-",
            "\(int(breaker, "non_circuit_open_outcomes") ?? -1), \(probes)", "", "",
            "0, ≤ \(int(breaker, "background_probe_bound") ?? 0)", clean && withinProbe ? "met" : "not met",
        ])
    }
    return (table.isEmpty ? nil : table, bars)
}
