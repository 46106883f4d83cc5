import Foundation
import MagpieTestSupport
import Testing

#if canImport(FoundationXML)
import FoundationXML
#endif

/// report.html, rendered by `magpie-bench report` from a results.json, parsed as XML.
@Suite("magpie-bench report.html")
struct BenchReportTests {
    static func row(_ scenario: String, _ system: String, threads: Int = 1, ops: Double, p50: Int, hit: Double, extra: String = "{}")
        -> String
    {
        """
        {"scenario": "\(scenario)", "system": "\(system)", "threads": \(threads), "operations": 1, "seconds": 1,
         "ops_per_sec": \(ops), "hit_ratio": \(hit), "extra": \(extra),
         "latency_ns": {"p50": \(p50), "p90": \(p50 * 2), "p99": \(p50 * 4), "p999": \(p50 * 8), "max": \(p50 * 16)}}
        """
    }

    final class Counter: NSObject, XMLParserDelegate {
        var elements: [String: Int] = [:]
        var text = ""
        func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?,
                    attributes: [String: String] = [:]) {
            elements[name, default: 0] += 1
        }
        func parser(_ parser: XMLParser, foundCharacters string: String) { text += string }
    }

    @Test("the page is well-formed XHTML with one latency chart per scenario, the budget curve and the throughput charts")
    func renders() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let rows = [
            Self.row("memory", "magpie", threads: 1, ops: 4e6, p50: 150, hit: 0.78),
            Self.row("memory", "magpie", threads: 2, ops: 7e6, p50: 160, hit: 0.78),
            Self.row("memory", #"NSCache <&> \"quoted\""#, threads: 1, ops: 1e5, p50: 9000, hit: 0.7),
            Self.row("disk-get", "magpie", ops: 1.5e5, p50: 5000, hit: 1),
            // A fleet system in two mixes: its rows and chart groups name the mix that is not the default.
            Self.row("fleet", "magpie-fleet", threads: 64, ops: 5e4, p50: 900, hit: 0.9, extra: #"{"tasks": 16, "mix": "default"}"#),
            Self.row(
                "fleet", "magpie-fleet", threads: 64, ops: 2e4, p50: 900, hit: 0.8,
                extra: #"{"tasks": 16, "mix": "removals", "set_share": 0, "remove_share": 0.03}"#),
            Self.row("memory", "magpie", ops: 3e6, p50: 140, hit: 0.52, extra: #"{"sweep_parameter": "budget_percent", "sweep_value": 1}"#),
            Self.row("memory", "magpie", ops: 3e6, p50: 140, hit: 0.80, extra: #"{"sweep_parameter": "budget_percent", "sweep_value": 10}"#),
            Self.row("memory", "magpie", ops: 2e6, p50: 140, hit: 0.78, extra: #"{"sweep_parameter": "shards", "sweep_value": 1}"#),
            Self.row("memory", "magpie", ops: 4e6, p50: 140, hit: 0.78, extra: #"{"sweep_parameter": "shards", "sweep_value": 16}"#),
        ]
        let json = """
            {"tool": "magpie-bench", "version": "0.1.0", "date": "2026-11-22T00:00:00Z",
             "machine": {"cores": 2, "os": "Linux", "cpu": "test cpu", "memory_bytes": 1073741824, "swift": "6.3+"},
             "config": {}, "results": [\(rows.joined(separator: ",\n"))]}
            """
        try json.write(toFile: directory.child("results.json"), atomically: true, encoding: .utf8)
        #expect(try runBench(["report", directory.child("results.json")]) == 0)
        let page = try Data(contentsOf: URL(fileURLWithPath: directory.child("report.html")))
        let parser = XMLParser(data: page)
        let counter = Counter()
        parser.delegate = counter
        #expect(parser.parse(), "report.html is not well-formed: \(String(describing: parser.parserError))")
        // Latency: memory, disk-get and fleet (3 charts); hit ratio vs budget (1); threads and shards (2).
        #expect(counter.elements["svg"] == 6)
        // Lines: the budget curve (1), ops/s vs threads per system (magpie, NSCache: 2), vs shards (1).
        #expect(counter.elements["polyline"] == 4)
        #expect(counter.text.contains("NSCache <&> \"quoted\""))  // escaped in the page, intact once parsed
        #expect(counter.text.contains("hit ratio vs budget"))
        #expect(counter.text.contains("M ops/s vs shard count"))
        #expect(counter.elements["tr"] == 1 + 6)  // header + the six rows that are not sweep points
        #expect(counter.text.contains("magpie-fleet, removals only (3 %)"))
        #expect(!counter.text.contains("magpie-fleet, default"))
    }

    final class DashCounter: NSObject, XMLParserDelegate {
        var dashed = 0
        var polylines = 0
        func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?,
                    attributes: [String: String] = [:]) {
            if name == "polyline" { polylines += 1 }
            if name == "polyline" && attributes["stroke-dasharray"] != nil { dashed += 1 }
        }
    }

    @Test("trace replays give a miss-ratio chart per trace; --baseline draws another build's Magpie curves dashed beside them")
    func missRatioCharts() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        func replay(_ percent: Int, _ system: String, miss: Double, trace: String?) -> String {
            let traceField = trace.map { #", "trace": "\#($0)""# } ?? ""
            return Self.row("replay \(percent)%", system, ops: 0, p50: 0, hit: 1 - miss, extra: #"{"miss_ratio": \#(miss)\#(traceField)}"#)
        }
        func report(_ rows: [String], config: String = "{}") -> String {
            """
            {"tool": "magpie-bench", "version": "0.1.0", "date": "2026-11-27T00:00:00Z",
             "machine": {"cores": 2, "os": "Linux", "cpu": "test cpu", "memory_bytes": 1073741824, "swift": "6.3+"},
             "config": \(config), "results": [\(rows.joined(separator: ",\n"))]}
            """
        }
        let current = [
            replay(1, "magpie-memory", miss: 0.81, trace: "a.bin"), replay(10, "magpie-memory", miss: 0.72, trace: "a.bin"),
            replay(1, "LRU", miss: 0.83, trace: "a.bin"), replay(10, "LRU", miss: 0.81, trace: "a.bin"),
            replay(1, "magpie-memory", miss: 0.45, trace: "b.csv"), replay(10, "magpie-memory", miss: 0.30, trace: "b.csv"),
        ]
        // An older build's rows name no trace; its configuration does.
        let older = [
            replay(1, "magpie-memory", miss: 0.82, trace: nil), replay(10, "magpie-memory", miss: 0.73, trace: nil),
            replay(1, "LRU", miss: 0.83, trace: nil),
        ]
        try report(current).write(toFile: directory.child("new.json"), atomically: true, encoding: .utf8)
        try report(older, config: #"{"replay": {"trace": "/somewhere/a.bin"}}"#)
            .write(toFile: directory.child("old.json"), atomically: true, encoding: .utf8)
        #expect(
            try runBench([
                "report", directory.child("new.json"), "--baseline", "before=" + directory.child("old.json"), "--baseline",
                "before=" + directory.child("old.json"),
            ]) == 0)
        let page = try String(contentsOfFile: directory.child("report.html"), encoding: .utf8)
        let parser = XMLParser(data: Data(page.utf8))
        let counter = DashCounter()
        parser.delegate = counter
        #expect(parser.parse(), "report.html is not well-formed: \(String(describing: parser.parserError))")
        // a.bin: magpie-memory, LRU and each baseline's magpie-memory (their LRU rows are left out; the
        // label given twice is numbered, so both draw); b.csv: one.
        #expect(counter.polylines == 5)
        #expect(counter.dashed == 2)
        #expect(page.contains("before (2): magpie-memory"))
        #expect(page.contains("a.bin: miss ratio vs budget") && page.contains("b.csv: miss ratio vs budget"))
        #expect(page.contains("before: magpie-memory"))
        #expect(!page.contains("before: LRU"))
    }
}
