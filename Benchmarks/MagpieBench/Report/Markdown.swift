import Foundation

/// GitHub-flavoured Markdown for `report --markdown`: paragraphs, a run's provenance, and the block of
/// README.md the report rewrites (tables: `Table.markdown`).
enum Markdown {
    /// A paragraph broken into lines of at most `width` characters (a longer word stands alone).
    static func wrap(_ paragraph: String, width: Int = 110) -> String {
        var lines: [String] = []
        var line = ""
        for word in paragraph.split(separator: " ", omittingEmptySubsequences: true) {
            if !line.isEmpty && line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        if !line.isEmpty { lines.append(line) }
        return lines.joined(separator: "\n")
    }

    /// A list item: "- " and the text wrapped, its further lines indented by two spaces, and a newline.
    static func bullet(_ text: String) -> String {
        "- " + wrap(text, width: 108).replacingOccurrences(of: "\n", with: "\n  ") + "\n"
    }

    /// "2026-12-06 02:35 UTC" from a report's date stamp ("20261206T023512Z"); the stamp itself when it
    /// has another form.
    static func date(_ stamp: String) -> String {
        let digits = Array(stamp)
        guard digits.count == 16, digits[8] == "T", digits[15] == "Z" else { return stamp }
        let s = { (range: Range<Int>) in String(digits[range]) }
        return "\(s(0..<4))-\(s(4..<6))-\(s(6..<8)) \(s(9..<11)):\(s(11..<13)) UTC"
    }

    /// The day of a report's date stamp ("2026-12-06").
    static func day(_ stamp: String) -> String { String(date(stamp).prefix(10)) }

    /// One line naming a machine: cores, CPU, memory, OS, Swift.
    static func machine(_ m: Machine) -> String {
        let gib = Double(m.memory_bytes) / 1_073_741_824
        return "\(m.cores) cores, \(m.cpu), \(String(format: "%.0f", gib)) GiB, \(m.os), Swift \(m.swift)"
    }

    /// Whether two reports ran on machines of one kind: cores, CPU, memory and OS (the Swift version aside).
    static func sameMachine(_ a: Machine, _ b: Machine) -> Bool {
        a.cores == b.cores && a.cpu == b.cpu && a.os == b.os && a.memory_bytes >> 30 == b.memory_bytes >> 30
    }

    /// The line under a table's heading: the command that reproduces it, the commit and the date.
    static func provenance(_ report: Report, command: String?) -> String {
        let commit = report.commit.map { "commit `\($0)`" } ?? "commit not recorded"
        let what = command.map { "`\($0)`" } ?? "`make bench`"
        return "\(what) · \(commit) · \(date(report.date))\n"
    }

    static let glanceBegin = "<!-- glance:begin (magpie-bench report --markdown writes this table) -->"
    static let glanceEnd = "<!-- glance:end -->"

    struct MissingMarkers: Error, CustomStringConvertible {
        var path: String
        var description: String { "\(path) has no \(Markdown.glanceBegin) … \(Markdown.glanceEnd) block to rewrite" }
    }

    /// `text` with what lies between the glance markers (each on a line of its own) replaced by `block`.
    static func replaceGlance(in text: String, with block: String, path: String) throws -> String {
        guard let begin = text.range(of: glanceBegin),
            let end = text.range(of: glanceEnd, range: begin.upperBound..<text.endIndex)
        else { throw MissingMarkers(path: path) }
        return String(text[..<begin.upperBound]) + "\n" + block + String(text[end.lowerBound...])
    }
}
