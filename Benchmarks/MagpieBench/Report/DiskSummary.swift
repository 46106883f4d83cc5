import Foundation

/// The disk scenario's tables, computed from the rows of this run alone: the bars (`DiskBars`: one row
/// per bar with the figures and "met" or "NOT met"), the notes, then each system's configuration.
func diskTables(_ results: [BenchResult]) -> [Table] {
    let summary = DiskBars(results)
    var tables = summary.tables
    if !summary.notes.isEmpty {
        if tables.isEmpty { tables.append(Table()) }
        tables[tables.count - 1].notes = summary.notes
    }
    let disk = results.filter { $0.scenario.hasPrefix("disk-") && $0.extra["sweep_parameter"] == nil }
    guard disk.contains(where: { $0.system == "magpie" }) else { return tables }
    let systems = distinct(disk.filter { !$0.scenario.hasSuffix("-floor") }.map(\.system))
    let configured = systems.compactMap { system in
        disk.first { !$0.scenario.hasSuffix("-floor") && $0.system == system }?.extra["configuration"]?.stringValue.map { "  \(system): \($0)" }
    }
    return tables + [Table("Disk systems as configured:", notes: configured)]
}

/// The disk bars of one run as tables (each with its title, a header row first) and one-line notes: the
/// issue #20 bars, the issue #29 bars, and the gets sampled in turns when the paired workload ran.
struct DiskBars {
    var tables: [Table] = []
    var notes: [String] = []

    init(_ results: [BenchResult]) {
    let disk = results.filter { $0.scenario.hasPrefix("disk-") && $0.extra["sweep_parameter"] == nil }
    guard disk.contains(where: { $0.system == "magpie" }) else { return }
    func row(_ scenario: String, _ system: String) -> BenchResult? {
        disk.first { $0.scenario == scenario && $0.system == system }
    }
    func peers(_ scenario: String) -> [BenchResult] { disk.filter { $0.scenario == scenario && $0.system != "magpie" } }
    func number(_ r: BenchResult?, _ key: String) -> Double? { r?.extra[key]?.numberValue }
    func p50(_ r: BenchResult?, _ key: String) -> Double? { r?.p50(key) }
    let ns = formatNanoseconds
    var table = Table("Disk: the issue #20 bars, from this run alone (gets: hits only)", ["bar", "magpie", "target (this run)", "result"])
    func bar(_ name: String, _ value: Double?, _ target: Double?, _ show: (Double) -> String, lowerIsBetter: Bool, _ note: String) {
        guard let value, let target else { return }
        let met = lowerIsBetter ? value <= target : value >= target
        table.append([name, show(value), "\(lowerIsBetter ? "≤" : "≥") \(show(target)) \(note)", met ? "met" : "NOT met"])
    }
    let rate = { (v: Double) in formatRate(v) }

    // Sets: plain and eviction-heavy.
    if let fastest = peers("disk-set").max(by: { $0.ops_per_sec < $1.ops_per_sec }) {
        bar("set ops/s", row("disk-set", "magpie")?.ops_per_sec, fastest.ops_per_sec, rate, lowerIsBetter: false, "(\(fastest.system))")
    }
    let evictPeers = peers("disk-evict")
    if let fastest = evictPeers.max(by: { (number($0, "set_ops_per_sec") ?? 0) < (number($1, "set_ops_per_sec") ?? 0) }) {
        bar(
            "eviction-heavy set ops/s", number(row("disk-evict", "magpie"), "set_ops_per_sec"), number(fastest, "set_ops_per_sec"),
            rate, lowerIsBetter: false, "(\(fastest.system))")
    }
    if let fastest = evictPeers.max(by: { $0.ops_per_sec < $1.ops_per_sec }) {
        bar("eviction-heavy ops/s (get + set on miss)", row("disk-evict", "magpie")?.ops_per_sec, fastest.ops_per_sec, rate, lowerIsBetter: false, "(\(fastest.system))")
    }

    // Gets, page-cache hot (hits only), against the fastest peer and the floors.
    let get = row("disk-get", "magpie")
    let raw = p50(get, "get_random_hit_latency_ns")
    let text = p50(get, "get_text_hit_latency_ns")
    let peerRaw = peers("disk-get").compactMap { r in p50(r, "get_random_hit_latency_ns").map { (r.system, $0) } }.min { $0.1 < $1.1 }
    if let peerRaw { bar("raw get p50", raw, peerRaw.1, ns, lowerIsBetter: true, "(\(peerRaw.0))") }
    let copyFloor = row("disk-floor", "mmap-copy-4k")?.latency_ns.p50
    if let copyFloor { bar("raw get p50", raw, Double(copyFloor) + 600, ns, lowerIsBetter: true, "(mmap-copy floor \(copyFloor) ns + 0.6 µs)") }
    let zstdFloor = row("disk-floor", "zstd-decompress-4k")?.latency_ns.p50
    if let zstdFloor { bar("compressed get p50", text, Double(zstdFloor) + 800, ns, lowerIsBetter: true, "(ZSTD_decompress floor \(zstdFloor) ns + 0.8 µs)") }
    let peerText = peers("disk-get").compactMap { r in p50(r, "get_text_hit_latency_ns").map { (r.system, $0) } }.min { $0.1 < $1.1 }
    if let peerText { bar("compressible (JSON) get p50", text, peerText.1, ns, lowerIsBetter: true, "(\(peerText.0), informative)") }

    // Eviction-heavy: budget, write amplification, hit ratio.
    if let evict = row("disk-evict", "magpie"), let budget = number(evict, "budget_bytes"), let slack = number(evict, "slack_bytes") {
        bar("eviction-heavy bytes on disk (max)", number(evict, "du_bytes"), budget + slack, { String(format: "%.1f MB", $0 / 1e6) }, lowerIsBetter: true, "(budget + \(Int(slack)) B)")
        if let lowest = evictPeers.min(by: { (number($0, "write_amplification") ?? .infinity) < (number($1, "write_amplification") ?? .infinity) }) {
            bar("write amplification", number(evict, "write_amplification"), number(lowest, "write_amplification"), { String(format: "%.2f", $0) }, lowerIsBetter: true, "(\(lowest.system))")
        }
        if let best = evictPeers.max(by: { $0.hit_ratio < $1.hit_ratio }) {
            bar("eviction-heavy hit ratio", evict.hit_ratio, best.hit_ratio, { String(format: "%.4f", $0) }, lowerIsBetter: false, "(\(best.system))")
        }
    }

    // Reopen: open + first get.
    if let fastest = peers("disk-reopen").min(by: { $0.seconds < $1.seconds }), let keys = number(row("disk-reopen", "magpie"), "entries_stored") {
        bar("reopen + first get (\(Int(keys)) entries)", row("disk-reopen", "magpie")?.seconds, fastest.seconds, { String(format: "%.2f ms", $0 * 1e3) }, lowerIsBetter: true, "(\(fastest.system))")
    }

    if !table.isEmpty { tables.append(table) }
    if let raw, let copyFloor, let text, let zstdFloor {
        notes.append(String(format: "magpie raw get p50 = mapped-copy floor %d ns + %.0f ns; compressed get p50 = ZSTD_decompress floor %d ns + %.0f ns",
            copyFloor, raw - Double(copyFloor), zstdFloor, text - Double(zstdFloor)))
    }
    // DRAM per on-disk entry: the index's bytes (16 per slot, 3/4 full at most) over the entries it
    // holds, after the plain (set + get) and the eviction-heavy workloads (informative: the peers' own
    // index memory is theirs to report).
    let dram = disk.filter { $0.system == "magpie" && ($0.scenario.hasSuffix("-get") || $0.scenario == "disk-evict") }.compactMap { r -> String? in
        guard let perEntry = number(r, "index_bytes_per_entry"), perEntry > 0, let entries = number(r, "entries") else { return nil }
        return String(format: "%@ %.1f B (%d entries)", r.scenario, perEntry, Int(entries))
    }
    if !dram.isEmpty { notes.append("magpie index DRAM per on-disk entry: " + dram.joined(separator: ", ")) }
    // How much of each system's mapped files the kernel maps by 2 MiB pages (a random read's TLB misses;
    // Magpie's `hugePageFiles`, LMDB's file as the kernel caches it), after the plain gets and the paired
    // turns (informative).
    let huge = disk.filter { $0.scenario == "disk-get" || $0.scenario == "disk-paired-get" }.compactMap { r -> String? in
        guard let resident = number(r, "mapped_resident_bytes"), resident > 0, let pmd = number(r, "huge_page_mapped_bytes") else { return nil }
        return String(format: "%@ %@ %.0f %% (%.0f of %.0f MB)", r.scenario, r.system, 100 * pmd / resident, pmd / 1e6, resident / 1e6)
    }
    if !huge.isEmpty { notes.append("mapped file bytes on 2 MiB pages: " + huge.joined(separator: ", ")) }

    // The issue #29 bars where they differ from #20's: against RocksDB (FIFO) and LMDB by name, the store
    // tail, and write amplification counted two ways (the device's writes, which the page cache absorbs
    // when a region is overwritten before writeback, and the tier's own bytes written).
    table = Table("Disk: the issue #29 bars, from this run alone", ["bar (#29)", "magpie", "target (this run)", "result"])
    let rocksdbEvict = evictPeers.first { $0.system == "rocksdb" }
    if let evict = row("disk-evict", "magpie") {
        func storeTail(_ r: BenchResult) -> Double? { Percentiles(r.extra["set_latency_ns"]).map { Double($0.p999) } }
        if let tail = storeTail(evict) {
            // The peers' own store tails of the same run beside the bar (informative: the bar is absolute).
            let peerTails = evictPeers.compactMap { r in storeTail(r).map { "\(r.system) \(ns($0))" } }
            let note = (["no stall on the caller"] + peerTails).joined(separator: "; ")
            bar("eviction-heavy store p99.9", tail, 100_000, ns, lowerIsBetter: true, "(\(note))")
        }
        if let rocksdbEvict {
            bar("write amplification (device)", number(evict, "write_amplification"), number(rocksdbEvict, "write_amplification"),
                { String(format: "%.2f", $0) }, lowerIsBetter: true, "(rocksdb)")
            if let written = number(evict, "tier_bytes_written"), let stored = number(evict, "stored_bytes"), stored > 0 {
                bar("write amplification (tier's bytes)", written / stored, number(rocksdbEvict, "write_amplification"),
                    { String(format: "%.2f", $0) }, lowerIsBetter: true, "(rocksdb, device)")
            }
            bar("eviction-heavy hit ratio", evict.hit_ratio, rocksdbEvict.hit_ratio + 0.02, { String(format: "%.4f", $0) },
                lowerIsBetter: false, "(rocksdb + 2 points)")
        }
    }
    if let lmdb = row("disk-reopen", "lmdb"), let keys = number(row("disk-reopen", "magpie"), "entries_stored") {
        bar("reopen + first get (\(Int(keys)) entries)", row("disk-reopen", "magpie")?.seconds, 3 * lmdb.seconds,
            { String(format: "%.2f ms", $0 * 1e3) }, lowerIsBetter: true, "(3 × lmdb)")
    }
    if !table.isEmpty { tables.append(table) }
    let paired = pairedGetBars(disk)
    if paired.count > 1 {
        var heading = "Disk: the #29 get bars with every system and the floors sampled in turns"
        if let magpie = row("disk-paired-get", "magpie"), let count = magpie.extra["rounds"]?.intValue, let block = magpie.extra["block"]?.intValue {
            heading += " (\(count) rounds of \(block) operations each, hits only; a round met: its own p50s)"
        }
        tables.append(Table(heading, paired[0], rows: Array(paired.dropFirst())))
    }
    }
}

/// The paired workload's rows (DiskScenario+Paired.swift) as the #29 get bars, on figures of the same
/// minutes, over all rounds, and in how many rounds each held on that round's samples alone: a header row,
/// then one row per bar. A system without hits of a kind has no p50 of it (its histogram's 0 is no time),
/// and no bar is read against it.
func pairedGetBars(_ rows: [BenchResult]) -> [[String]] {
    var table = [["bar (#29), gets in alternation", "magpie", "target (same turns)", "result", "rounds met"]]
    guard let magpie = rows.first(where: { $0.scenario == "disk-paired-get" && $0.system == "magpie" }) else { return table }
    let peers = rows.filter { $0.scenario == "disk-paired-get" && $0.system != "magpie" }
    let floors = rows.filter { $0.scenario == "disk-paired-floor" }
    func p50(_ r: BenchResult, _ key: String) -> UInt64? { r.p50(key).map { UInt64($0) } }
    func rounds(_ key: String) -> String {
        let tally = magpie.extra[key]?.objectValue
        guard let met = tally?["rounds"]?.intValue, let of = tally?["of"]?.intValue else { return "-" }
        return "\(met) of \(of)"
    }
    func ns(_ v: UInt64) -> String { formatNanoseconds(Double(v)) }
    if let raw = p50(magpie, "get_random_hit_latency_ns") {
        // The fastest peer first (the bar's), then the others.
        let others = peers.compactMap { r in p50(r, "get_random_hit_latency_ns").map { (r.system, $0) } }.sorted { $0.1 < $1.1 }
        for (index, (system, other)) in others.enumerated() {
            table.append([
                "raw get p50", ns(raw), "≤ \(ns(other)) (\(system)\(index == 0 ? "" : ", informative"))", raw <= other ? "met" : "NOT met",
                rounds("raw_p50_at_most_\(system)"),
            ])
        }
    }
    if let text = p50(magpie, "get_text_hit_latency_ns") {
        for floor in floors where floor.latency_ns.p50 > 0 {
            let cold = floor.system.hasSuffix("-cold")
            let target = floor.latency_ns.p50 + 800
            let what = cold ? "the same floor, frames read from memory" : "ZSTD_decompressDCtx floor"
            table.append([
                "compressed get p50", ns(text), "≤ \(ns(target)) (\(what) \(ns(floor.latency_ns.p50)) + 0.8 µs\(cold ? "; informative" : ""))",
                text <= target ? "met" : "NOT met", rounds(cold ? "text_p50_at_most_cold_floor_plus_800ns" : "text_p50_at_most_floor_plus_800ns"),
            ])
        }
    }
    return table
}

/// Each disk system's configuration as its rows report it (per workload: the budgets differ), for the
/// report's `config`.
func diskConfigurations(_ results: [BenchResult]) -> JSONValue {
    var configurations: [String: JSONValue] = [:]
    for r in results where r.scenario.hasPrefix("disk-") && !r.scenario.hasSuffix("-floor") {
        if let configuration = r.extra["configuration"]?.stringValue {
            let workload = r.scenario.hasPrefix("disk-mixed") ? "mixed" : r.scenario == "disk-evict" ? "evict" : r.scenario.hasPrefix("disk-paired") ? "paired" : "plain"
            configurations["\(r.system) (\(workload))"] = .string(configuration)
        }
    }
    return .object(configurations)
}

/// The trickle workload's rows as one table: CPU time and context switches per second of each system at
/// each rate, beside the pacing loop's own (`none`), and the stores' latency; nil without them.
func trickleTable(_ results: [BenchResult]) -> Table? {
    let rows = results.filter { $0.scenario.hasPrefix("disk-trickle-") }
    guard !rows.isEmpty else { return nil }
    func number(_ r: BenchResult, _ key: String) -> Double { r.extra[key]?.numberValue ?? 0 }
    var table = Table(
        "Disk: stores at a trickle (CPU and context switches of the whole process, per second of wall time)",
        ["stores/s", "system", "CPU ms per s", "above the loop", "switches per s", "store p50", "store p99.9"])
    for rate in Set(rows.map { Int(number($0, "rate_per_second")) }).sorted() {
        let atRate = rows.filter { Int(number($0, "rate_per_second")) == rate }
        let loop = atRate.first { $0.system == "none" }.map { number($0, "cpu_ms_per_second") }
        for r in atRate {
            let cpu = number(r, "cpu_ms_per_second")
            let stored = r.system != "none" && rate > 0
            table.append([
                "\(rate)", r.system, String(format: "%.2f", cpu),
                r.system == "none" ? "-" : loop.map { String(format: "%+.2f", cpu - $0) } ?? "-",
                String(format: "%.0f", number(r, "context_switches_per_second")),
                stored ? "\(r.latency_ns.p50) ns" : "-", stored ? "\(r.latency_ns.p999) ns" : "-",
            ])
        }
    }
    return table
}
