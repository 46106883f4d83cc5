import ArgumentParser
import Foundation

/// `magpie-bench report results.json`: renders report.html from a report (the suite does it itself).
struct RenderReport: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report", abstract: "Render report.html (inline SVG charts) from a results.json.")

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

    func run() throws {
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
}
