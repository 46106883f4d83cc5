import Foundation
import MagpieTestSupport
import Testing

@testable import MagpieBench

/// The disk peers of `magpie-bench disk` (RocksDB, LMDB, SQLite, and Magpie through the same adapter
/// protocol): each round-trips values across a reopen and holds its budget, within the slack it states,
/// while far more than the budget is stored; the floors are measured, not constants; the command writes
/// the rows the report contract names.
@Suite("magpie-bench disk peers")
struct BenchDiskPeerTests {
    static let systems = ["magpie", "rocksdb", "lmdb", "sqlite"]

    /// The rows of a JSON report `magpie-bench` wrote.
    private static func results(_ path: String) throws -> [[String: Any]] {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        return try #require(report["results"] as? [[String: Any]])
    }

    private func open(_ name: String, _ directory: String, budget: Int) throws -> any DiskSystem {
        let options = try DiskOptions.parse(["--systems", name])
        return try DiskScenario(options: options).open(name, directory, budget: budget)
    }

    @Test("round-trips values of 0 B to 256 KiB, and keeps them across a close and reopen", arguments: systems)
    func roundTrip(system: String) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let values = DiskValues(size: 1, maxSize: 256 << 10, seed: 7)
        let path = directory.child(system)
        var store = try open(system, path, budget: 64 << 20)
        for i in 0..<200 { #expect(store.set(values.value(i), key: values.key(i)), "set \(i)") }
        #expect(store.set([], key: "empty"))
        #expect(store.set(Array("replaced".utf8), key: values.key(3)))
        for i in 0..<200 where i != 3 { #expect(store.get(values.key(i)) == values.value(i), "get \(i)") }
        #expect(store.get(values.key(3)) == Array("replaced".utf8))
        #expect(store.get("missing") == nil)
        store.close()
        store = try open(system, path, budget: 64 << 20)
        defer { store.close() }
        for i in stride(from: 0, to: 200, by: 7) where i != 3 {
            #expect(store.get(values.key(i)) == values.value(i), "get \(i) after reopen")
        }
        #expect(store.get(values.key(3)) == Array("replaced".utf8))
        #expect(store.get("empty") == [])
    }

    @Test("holds its budget (+ its stated slack) while 5 × the budget is stored, and serves only exact values", arguments: systems)
    func budget(system: String) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 4 << 20
        let values = DiskValues(size: 4096, seed: 11)
        let path = directory.child(system)
        let store = try open(system, path, budget: budget)
        var largest = 0
        let count = 5 * budget / 4096
        for i in 0..<count {
            #expect(store.set(values.value(i), key: values.key(i)), "set \(i)")
            if i % 128 == 127 { largest = max(largest, MagpieTestSupport.directoryBytes(path)) }
        }
        largest = max(largest, MagpieTestSupport.directoryBytes(path))
        #expect(largest <= budget + store.slackBytes, "\(system): \(largest) B on disk, budget \(budget) + slack \(store.slackBytes)")
        // Something was evicted, what is left is exact, and the newest entries are mostly there.
        var hits = 0
        var newest = 0
        for i in 0..<count {
            guard let got = store.get(values.key(i)) else { continue }
            #expect(got == values.value(i), "key \(i)")
            hits += 1
            if i >= count - 100 { newest += 1 }
        }
        #expect(hits < count, "\(system) evicted nothing")
        #expect(newest >= 50, "\(system): \(newest) of the 100 newest entries kept")
        store.close()
        #expect(MagpieTestSupport.directoryBytes(path) <= budget + store.slackBytes, "\(system) after close")
    }

    @Test("the floors are measured: a 256 KiB block costs more than a 4 KiB one to read, copy, decompress and hash")
    func floors() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        func p50s(_ blockSize: Int) throws -> [String: UInt64] {
            let floors = DiskFloors(directory: directory.path, samples: 3000, seed: 3, blockSize: blockSize, blocks: 64)
            let rows = try floors.measure(values: DiskValues(size: blockSize, seed: 3))
            #expect(rows.allSatisfy { $0.scenario == "disk-floor" && $0.operations == 3000 && $0.latency_ns.p50 > 0 })
            return Dictionary(uniqueKeysWithValues: rows.map { (String($0.system.prefix { $0 != "-" }), $0.latency_ns.p50) })
        }
        let small = try p50s(4096)
        let large = try p50s(256 << 10)
        #expect(Set(small.keys) == ["pread", "mmap", "zstd", "xxh3"])
        for (name, p50) in small { #expect((large[name] ?? 0) > p50, "\(name): 4 KiB \(p50) ns, 256 KiB \(large[name] ?? 0) ns") }
    }

    @Test("`magpie-bench disk` writes the floor, set, get, reopen and evict rows of every peer, with their figures")
    func command() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "disk", "--keys", "400", "--gets", "800", "--evict-budget", "1000000", "--evict-ops", "3000", "--mixed-keys", "40",
            "--floor-samples", "500", "--systems", "magpie", "rocksdb", "lmdb", "sqlite", "--work-directory", directory.path,
            "--json", directory.child("disk.json"),
        ])
        #expect(status == 0)
        let rows = try Self.results(directory.child("disk.json"))
        func row(_ scenario: String, _ system: String) -> [String: Any]? {
            rows.first { $0["scenario"] as? String == scenario && $0["system"] as? String == system }
        }
        for floor in ["pread-4k", "mmap-copy-4k", "zstd-decompress-4k", "xxh3-4k"] {
            #expect(row("disk-floor", floor) != nil, "\(floor)")
        }
        for system in Self.systems {
            for scenario in ["disk-set", "disk-get", "disk-reopen", "disk-evict", "disk-mixed-set", "disk-mixed-get"] {
                #expect(row(scenario, system) != nil, "\(scenario) \(system)")
            }
            let get = (row("disk-get", system)?["extra"] as? [String: Any]) ?? [:]
            #expect(get["get_random_latency_ns"] != nil && get["get_text_latency_ns"] != nil, "\(system)")
            #expect(get["wrong_values"] as? Int == 0, "\(system)")
            #expect((get["configuration"] as? String)?.isEmpty == false, "\(system)")
            let evict = (row("disk-evict", system)?["extra"] as? [String: Any]) ?? [:]
            for key in ["write_amplification", "du_bytes", "budget_bytes"] { #expect(evict[key] != nil, "\(system) \(key)") }
            #expect(evict["wrong_values"] as? Int == 0, "\(system)")
            #expect(evict["within_budget_and_slack"] as? Bool == true, "\(system)")
        }
        #expect(!rows.contains { ($0["scenario"] as? String)?.hasPrefix("disk-trickle") == true }, "trickle ran by default")
    }

    @Test("`--workloads trickle`: each system and the loop alone, at each rate, stores on schedule, CPU counted")
    func trickle() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "disk", "--workloads", "trickle", "--trickle-rates", "0", "400", "--trickle-seconds", "0.25",
            "--systems", "magpie", "lmdb", "--work-directory", directory.path, "--json", directory.child("trickle.json"),
        ])
        #expect(status == 0)
        let rows = try Self.results(directory.child("trickle.json"))
        #expect(rows.count == 6, "\(rows.map { "\($0["scenario"] ?? "") \($0["system"] ?? "")" })")
        for system in ["none", "magpie", "lmdb"] {
            for rate in [0, 400] {
                let row = try #require(rows.first { $0["scenario"] as? String == "disk-trickle-\(rate)/s" && $0["system"] as? String == system })
                let extra = try #require(row["extra"] as? [String: Any])
                let cpu = try #require(extra["cpu_ms_per_second"] as? Double)
                #expect(cpu > 0 && cpu < 2_000, "\(system) at \(rate)/s: \(cpu) ms of CPU per second")
                #expect(extra["failed_stores"] as? Int == 0)
                // 400 per second for 0.25 s: 100 stores (the last due before the end), none for the loop alone.
                let operations = try #require(row["operations"] as? Int)
                #expect(operations == (rate == 0 || system == "none" ? 0 : 100), "\(system) at \(rate)/s: \(operations) stores")
                let seconds = try #require(row["seconds"] as? Double)
                #expect(seconds >= 0.25 && seconds < 2, "\(system) at \(rate)/s took \(seconds) s")
            }
        }
    }

    @Test("`--workloads paired`: every system and both floors take a turn in every round, and the rounds are tallied")
    func paired() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let status = try runBench([
            "disk", "--workloads", "paired", "--keys", "400", "--paired-rounds", "6", "--paired-block", "200",
            "--systems", "magpie", "lmdb", "--work-directory", directory.path, "--json", directory.child("paired.json"),
        ])
        #expect(status == 0)
        let rows = try Self.results(directory.child("paired.json"))
        #expect(rows.count == 4, "\(rows.map { "\($0["scenario"] ?? "") \($0["system"] ?? "")" })")
        func extra(_ scenario: String, _ system: String) throws -> [String: Any] {
            let row = try #require(rows.first { $0["scenario"] as? String == scenario && $0["system"] as? String == system })
            #expect(row["operations"] as? Int == 1200, "\(system): 6 rounds of 200")
            // Every key was stored, and the default budget holds them all in Magpie: each of its reads and
            // every floor sample is a hit (LMDB keeps about half: two pages per value).
            let hitRatio = row["hit_ratio"] as? Double ?? 0
            #expect(system == "lmdb" ? hitRatio > 0.3 : hitRatio == 1, "\(system): \(hitRatio)")
            return try #require(row["extra"] as? [String: Any])
        }
        for (floor, frames) in [("zstd-decompress-4k", "hot in the CPU's caches"), ("zstd-decompress-4k-cold", "read from memory")] {
            let figures = try extra("disk-paired-floor", floor)
            #expect((figures["round_p50_ns"] as? [Int])?.count == 6, "\(floor): a p50 per round")
            #expect((figures["what"] as? String)?.contains(frames) == true, "\(floor)")
        }
        for system in ["magpie", "lmdb"] {
            let figures = try extra("disk-paired-get", system)
            #expect(figures["wrong_values"] as? Int == 0, "\(system)")
            #expect(figures["rounds"] as? Int == 6 && figures["block"] as? Int == 200)
            // 200 reads over 400 keys: raw (odd) and compressible (even) ones in every round.
            for key in ["round_raw_p50_ns", "round_text_p50_ns"] {
                let p50s = (figures[key] as? [Int]) ?? []
                #expect(p50s.count == 6 && p50s.allSatisfy { $0 > 0 }, "\(system) \(key): \(p50s)")
            }
        }
        let magpie = try extra("disk-paired-get", "magpie")
        #expect(magpie["raw_p50_at_most_magpie"] == nil)
        for key in ["raw_p50_at_most_lmdb", "text_p50_at_most_floor_plus_800ns", "text_p50_at_most_cold_floor_plus_800ns"] {
            let tally = try #require(magpie[key] as? [String: Int], "\(key)")
            let (met, of) = (tally["rounds"] ?? -1, tally["of"] ?? -1)
            #expect(of == 6 && met >= 0 && met <= of, "\(key): \(met) of \(of)")
        }
    }

    @Test("the paired bars: the fastest peer's is the bar, a system without hits of a kind is left out, each floor its own line")
    func pairedBars() {
        func row(_ scenario: String, _ system: String, p50: UInt64 = 0, raw: Int? = nil, text: Int? = nil, extra: [String: JSONValue] = [:]) -> BenchResult {
            var extra = extra
            if let raw { extra["get_random_hit_latency_ns"] = .object(["p50": .int(raw)]) }
            if let text { extra["get_text_hit_latency_ns"] = .object(["p50": .int(text)]) }
            return BenchResult(
                scenario: scenario, system: system, threads: 1, operations: 1, seconds: 1, ops_per_sec: 1,
                latency_ns: Percentiles(p50: p50, p90: p50, p99: p50, p999: p50, max: p50), hit_ratio: 1, extra: extra)
        }
        let tally: JSONValue = .object(["rounds": .int(2), "of": .int(5)])
        let magpie = row(
            "disk-paired-get", "magpie", raw: 1000, text: 5000,
            extra: ["raw_p50_at_most_lmdb": tally, "text_p50_at_most_floor_plus_800ns": tally])
        let rows = [
            magpie, row("disk-paired-get", "rocksdb", raw: 0, text: 0),  // no hits: no p50
            row("disk-paired-get", "sqlite", raw: 3000), row("disk-paired-get", "lmdb", raw: 900),
            row("disk-paired-floor", "zstd-decompress-4k", p50: 4000), row("disk-paired-floor", "zstd-decompress-4k-cold", p50: 4500),
        ]
        let table = pairedGetBars(rows)
        #expect(table.count == 5, "\(table)")
        #expect(table.dropFirst().map { $0[3] } == ["NOT met", "met", "NOT met", "met"], "\(table)")
        #expect(table[1][2].contains("900 ns (lmdb)") && table[1][4] == "2 of 5")
        #expect(table[2][2].contains("sqlite, informative") && table[2][4] == "-")
        #expect(table[3][2].contains("4800 ns") && table[4][2].contains("5300 ns") && table[4][2].contains("informative"))
        #expect(!table.contains { $0[2].contains("rocksdb") })
        // Magpie without raw hits: no raw bar at all (not "0 ns, met").
        let noRaw = pairedGetBars([row("disk-paired-get", "magpie", raw: 0, text: 5000)] + rows.dropFirst())
        #expect(noRaw.count == 3 && !noRaw.contains { $0[0] == "raw get p50" }, "\(noRaw)")
    }

    @Test("the paired workload's tally: a round counts when both have samples and the first p50 is at most the second's plus the margin")
    func pairedTally() {
        var a = PairedSamples()
        var b = PairedSamples()
        a.add(round: [5, 1, 3])  // p50 3
        b.add(round: [4, 2, 6, 8])  // the lower median of an even count: 4
        a.add(round: [10])
        b.add(round: [7])
        a.add(round: [])  // no sample: the round is left out
        b.add(round: [1])
        a.add(round: [9, 9])
        b.add(round: [2, 2])
        #expect(a.roundP50s == [3, 10, 9])
        #expect(b.roundP50s == [4, 7, 1, 2])
        #expect(PairedSamples.comparable(a, b) == 3)
        #expect(PairedSamples.rounds(a, atMost: b, plus: 0) == 1)
        #expect(PairedSamples.rounds(a, atMost: b, plus: 3) == 2)
        #expect(PairedSamples.rounds(a, atMost: b, plus: 7) == 3)
        #expect(a.percentiles.max == 10)
    }
}
