import ArgumentParser
import Foundation

/// `magpie-bench report results.json`: renders report.html from a report (the suite does it itself).
struct RenderReport: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report", abstract: "Render report.html (inline SVG charts) from a results.json.")

    @Argument(help: "A results.json written by magpie-bench.") var input: String
    @Option(help: "Where to write the page; default: report.html beside the input.") var output: String?

    func run() throws {
        let report = try Compare.load(input)
        let path = output ?? URL(fileURLWithPath: input).deletingLastPathComponent().appendingPathComponent("report.html").path
        try HTMLReport.render(report).write(toFile: path, atomically: true, encoding: .utf8)
        print("wrote \(path)")
    }
}
