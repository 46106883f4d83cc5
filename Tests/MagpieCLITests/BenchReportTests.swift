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
        // Latency: memory and disk-get (2 charts); hit ratio vs budget (1); threads and shards (2).
        #expect(counter.elements["svg"] == 5)
        // Lines: the budget curve (1), ops/s vs threads per system (magpie, NSCache: 2), vs shards (1).
        #expect(counter.elements["polyline"] == 4)
        #expect(counter.text.contains("NSCache <&> \"quoted\""))  // escaped in the page, intact once parsed
        #expect(counter.text.contains("hit ratio vs budget"))
        #expect(counter.text.contains("M ops/s vs shard count"))
        #expect(counter.elements["tr"] == 1 + 4)  // header + the four rows that are not sweep points
    }
}
