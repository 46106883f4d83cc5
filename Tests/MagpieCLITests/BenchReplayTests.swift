import Foundation
import MagpieTestSupport
import Testing

/// `magpie-bench replay` on tiny traces whose miss counts are worked out by hand.
@Suite("magpie-bench replay")
struct BenchReplayTests {
    /// Runs the replay with --json and returns each system's (miss ratio, byte miss ratio).
    func replay(_ trace: String, name: String, _ arguments: [String]) throws -> [String: (Double, Double)] {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        try trace.write(toFile: directory.child(name), atomically: true, encoding: .utf8)
        #expect(try runBench(["replay", directory.child(name), "--json", directory.child("out.json")] + arguments) == 0)
        let data = try Data(contentsOf: URL(fileURLWithPath: directory.child("out.json")))
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        var out: [String: (Double, Double)] = [:]
        for case let row as [String: Any] in report["results"] as? [Any] ?? [] {
            let extra = row["extra"] as? [String: Any] ?? [:]
            out[row["system"] as? String ?? ""] = (extra["miss_ratio"] as? Double ?? -1, extra["byte_miss_ratio"] as? Double ?? -1)
        }
        return out
    }

    /// The text of a trace `magpie-bench trace-gen` writes with `arguments`.
    func generateTrace(_ arguments: [String]) throws -> String {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let path = directory.child("trace.csv")
        #expect(try runBench(["trace-gen"] + arguments + ["-o", path]) == 0)
        return try String(contentsOfFile: path, encoding: .utf8)
    }

    @Test("LRU, FIFO and Belady give the hand-computed misses on a 7-request trace (capacity 3 objects)")
    func referencePolicies() throws {
        // a b c a d a b, every object 1,000 B, capacity 3,000 B.
        // LRU: a b c miss, a hit, d miss (evicts b), a hit, b miss: 5 misses.
        // FIFO: a b c miss, a hit, d miss (evicts a), a miss (evicts b), b miss: 6.
        // Belady: a b c miss, a hit, d miss (evicts c or d, never used again), a hit, b hit: 4.
        let trace = ["a", "b", "c", "a", "d", "a", "b"].map { "\($0),1000" }.joined(separator: "\n")
        let result = try replay(trace, name: "tiny.csv", ["--budget", "3000"])
        #expect(result["LRU"]?.0 == 5.0 / 7)
        #expect(result["FIFO"]?.0 == 6.0 / 7)
        #expect(result["Belady"]?.0 == 4.0 / 7)
        let magpie = try #require(result["magpie-memory"])
        #expect(magpie.0 >= 4.0 / 7 && magpie.0 <= 1)  // never better than the optimum
    }

    @Test("byte miss ratios weigh objects by size; percentages are of the working set; the binary format reads")
    func bytesAndBinary() throws {
        // Object x (9,000 B) requested twice, y (1,000 B) twice: working set 10,000 B.
        var records = Data()
        for (id, size) in [(1, 9000), (2, 1000), (1, 9000), (2, 1000)] as [(UInt64, UInt32)] {
            var time = UInt32(0).littleEndian, id = id.littleEndian, size = size.littleEndian, next = Int64(-1).littleEndian
            records.append(Data(bytes: &time, count: 4))
            records.append(Data(bytes: &id, count: 8))
            records.append(Data(bytes: &size, count: 4))
            records.append(Data(bytes: &next, count: 8))
        }
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // 100 % of the working set holds both: only the two first requests miss.
        let path = directory.child("t.oracleGeneral.bin")
        try records.write(to: URL(fileURLWithPath: path))
        #expect(try runBench(["replay", path, "--budget", "100%", "10%", "--json", directory.child("out.json")]) == 0)
        let report = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: directory.child("out.json")))) as? [String: Any])
        let rows = (report["results"] as? [[String: Any]]) ?? []
        func ratios(_ scenario: String, _ system: String) -> (Double, Double)? {
            guard let row = rows.first(where: { $0["scenario"] as? String == scenario && $0["system"] as? String == system }),
                let extra = row["extra"] as? [String: Any]
            else { return nil }
            return (extra["miss_ratio"] as? Double ?? -1, extra["byte_miss_ratio"] as? Double ?? -1)
        }
        #expect(ratios("replay 100%", "LRU").map { $0 == 0.5 && $1 == 0.5 } == true)
        #expect(ratios("replay 100%", "magpie-memory").map { $0 == 0.5 && $1 == 0.5 } == true)
        // 10 % = 1,000 B: only y fits, so x always misses and y misses once: 3 of 4 requests.
        #expect(ratios("replay 10%", "Belady").map { $0 == 0.75 && $1 == 19000.0 / 20000 } == true)
        #expect(ratios("replay 10%", "LRU").map { $0.0 == 0.75 } == true)
    }

    @Test("the disk tier and the two-tier Cache replay too: with room for everything only first requests miss")
    func diskAndBoth() throws {
        let trace = ["x,9000", "y,1000", "x,9000", "y,1000", "z,500", "z,500"].joined(separator: "\n")
        for tier in ["disk", "both"] {
            let result = try replay(trace, name: "t.csv", ["--budget", "400%", "--tier", tier, "--references", "LRU"])
            #expect(result["magpie-\(tier)"]?.0 == 0.5, "\(tier): \(String(describing: result["magpie-\(tier)"]))")
            #expect(result["LRU"]?.0 == 0.5)
        }
    }

    @Test("ARC keeps a twice-seen hot set through a scan that flushes LRU (hand-computed)")
    func arcResistsScans() throws {
        // a b a b a b, then x1…x5 once each, then a b; capacity 3 objects of 1,000 B.
        // LRU: a b miss, four hits, x1…x5 miss (the scan evicts a and b), a b miss: 9 misses.
        // ARC: a and b move to T2 on their second request; the scan cycles through T1 (and its ghost)
        // only, so a and b still hit afterwards: 7 misses.
        let names = ["a", "b", "a", "b", "a", "b", "x1", "x2", "x3", "x4", "x5", "a", "b"]
        let result = try replay(names.map { "\($0),1000" }.joined(separator: "\n"), name: "scan.csv",
            ["--budget", "3000", "--references", "ARC", "LRU"])
        #expect(abs((result["LRU"]?.0 ?? -1) - 9.0 / 13) < 1e-9)  // the JSON round trip may move the last bit
        #expect(abs((result["ARC"]?.0 ?? -1) - 7.0 / 13) < 1e-9)
    }

    @Test("S3-FIFO (libCacheSim's parameters) keeps a twice-read object through two scans (hand-computed)")
    func s3fifoReference() throws {
        // Capacity 2,000 B, objects 100 B: small 200 B, main 1,800 B, ghost 1,800 B; small may fill
        // the whole cache while main is empty. a a s1…s20 a a t1…t20 a (45 requests):
        // a misses, hits (frequency 1); s1…s19 fill the cache; s20 evicts from small: a has frequency
        // 1 < 2, so it goes to the ghost. a misses, is found in the ghost and enters main (s1 goes);
        // a hits. t1…t20 each evict from small (main, 100 B, is under its share); a still hits.
        // Misses: 1 + 20 + 1 + 20 = 42. LRU also loses a to t20: 43.
        let names = ["a", "a"] + (1...20).map { "s\($0)" } + ["a", "a"] + (1...20).map { "t\($0)" } + ["a"]
        let result = try replay(names.map { "\($0),100" }.joined(separator: "\n"), name: "s3.csv",
            ["--budget", "2000", "--references", "S3-FIFO", "LRU"])
        #expect(abs((result["S3-FIFO"]?.0 ?? -1) - 42.0 / 45) < 1e-9)
        #expect(abs((result["LRU"]?.0 ?? -1) - 43.0 / 45) < 1e-9)
    }

    @Test("placeholders and stored values give the memory tier identical miss ratios")
    func placeholdersMatchStoredValues() throws {
        let trace = try generateTrace([
            "--requests", "40000", "--objects", "3000", "--drift-every", "5000", "--drift-shift", "300",
            "--scan-every", "10000", "--scan-length", "1000",
        ])
        for (charge, budget) in [("object-size", "1%"), ("object-size", "10%"), ("full", "5%")] {
            let common = ["--budget", budget, "--references", "LRU", "--charge", charge, "--shards", "4"]
            let placeholder = try replay(trace, name: "t.csv", common)
            let stored = try replay(trace, name: "t.csv", common + ["--store-values"])
            let a = try #require(placeholder["magpie-memory"]), b = try #require(stored["magpie-memory"])
            #expect(a.0 == b.0 && a.1 == b.1, "\(charge) \(budget): placeholders \(a), stored values \(b)")
            #expect(a.0 > 0.05 && a.0 < 1)
        }
    }

    @Test("trace-gen writes the requested number of requests, with scans of never-repeated ids")
    func traceGen() throws {
        let lines = try generateTrace([
            "--requests", "10000", "--objects", "500", "--drift-every", "2000", "--drift-shift", "100",
            "--scan-every", "4000", "--scan-length", "300",
        ]).split(separator: "\n")
        #expect(lines.count == 10_000)
        let ids = lines.compactMap { UInt64($0.split(separator: ",")[0]) }
        let scanIDs = ids.filter { $0 >= 1 << 40 }
        #expect(scanIDs.count == 2 * 300)  // scans at requests 4,000 and 8,000
        #expect(Set(scanIDs).count == scanIDs.count)
        #expect(Set(ids.filter { $0 < 1 << 40 }).count <= 500)
    }
}
