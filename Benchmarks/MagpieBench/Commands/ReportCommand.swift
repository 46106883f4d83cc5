import ArgumentParser
import Foundation

/// `magpie-bench report results.json`: renders report.html from a report (the suite does it itself), or
/// with `--markdown` BENCHMARKS.md and README.md's table of headline comparisons.
struct RenderReport: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report", abstract: "Render report.html (inline SVG charts), or BENCHMARKS.md, from a results.json.",
        discussion: """
            With --markdown, writes the Markdown page of current results instead of report.html: the run's machine, \
            commit and date, how to read the numbers, the headline comparisons ("at a glance"), and a table per \
            scenario under the command that reproduces it. `make bench-md` runs it on the latest `make bench` \
            report: magpie-bench report bench-results/<stamp>/results.json --markdown BENCHMARKS.md \
            --service bench-results/service/results.json --readme README.md
            """)

    @Argument(help: "A results.json written by magpie-bench.") var input: String
    @Option(help: "Where to write the page; default: report.html beside the input.") var output: String?
    @Option(
        help: """
            Another report (LABEL=PATH, the label without "=", or PATH: labelled by its file name) whose \
            Magpie trace replays are drawn, dashed, beside this report's in the miss-ratio charts: say, the \
            same `replay` or `sweep --curves policy` run by an older build. Repeatable; a label given twice is \
            numbered.
            """)
    var baseline: [String] = []
    @Option(help: "Write the Markdown page of current results (BENCHMARKS.md) here instead of report.html.")
    var markdown: String?
    @Option(help: "With --markdown: the report of a `make bench-service` run (bench-results/service/results.json).")
    var service: String?
    @Option(help: "With --markdown: rewrite the headline table between README.md's glance markers in this file.")
    var readme: String?

    func validate() throws {
        if markdown == nil && (service != nil || readme != nil) { throw ValidationError("--service and --readme need --markdown") }
        if markdown != nil && !baseline.isEmpty { throw ValidationError("--baseline draws report.html's charts: not with --markdown") }
    }

    func run() throws {
        if let markdown {
            try writeMarkdown(to: markdown)
            return
        }
        var report = try Compare.load(input)
        var labels: Set<String> = []
        for entry in baseline {
            let (named, path) =
                if let equals = entry.firstIndex(of: "="), !FileManager.default.fileExists(atPath: entry) {
                    (String(entry[..<equals]), String(entry[entry.index(after: equals)...]))
                } else {
                    (URL(fileURLWithPath: entry).deletingPathExtension().lastPathComponent, entry)
                }
            // Two baselines of one name would draw as one curve: the later ones are numbered.
            var label = named
            if labels.contains(label) {
                var n = 2
                while labels.contains("\(label) (\(n))") { n += 1 }
                label = "\(label) (\(n))"
            }
            labels.insert(label)
            let other = try Compare.load(path)
            // Rows of builds before 2026-11-27 do not name their trace: the report's configuration does.
            var trace: JSONValue?
            if case .object(let replay) = other.config["replay"], case .string(let path) = replay["trace"] {
                trace = .string(URL(fileURLWithPath: path).lastPathComponent)
            }
            for var r in other.results where r.scenario.hasPrefix("replay ") && r.system.hasPrefix("magpie") {
                r.system = "\(label): \(r.system)"
                if r.extra["trace"] == nil { r.extra["trace"] = trace }
                report.results.append(r)
            }
        }
        let path = output ?? URL(fileURLWithPath: input).deletingLastPathComponent().appendingPathComponent("report.html").path
        try HTMLReport.render(report).write(toFile: path, atomically: true, encoding: .utf8)
        print("wrote \(path)")
    }

    /// BENCHMARKS.md from the suite's report (and the service's), and README.md's glance block.
    func writeMarkdown(to path: String) throws {
        let suite = try Compare.load(input)
        let other = try service.map(Compare.load)
        let page = BenchmarksPage.render(suite, source: input, service: other, serviceSource: service)
        try page.write(toFile: path, atomically: true, encoding: .utf8)
        print("wrote \(path)")
        if let readme {
            let text = try String(contentsOfFile: readme, encoding: .utf8)
            let block = Glance.markdown(suite, service: other)
            try Markdown.replaceGlance(in: text, with: block, path: readme).write(toFile: readme, atomically: true, encoding: .utf8)
            print("wrote \(readme)")
        }
    }
}
