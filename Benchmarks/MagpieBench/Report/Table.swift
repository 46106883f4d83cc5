import Foundation

/// A table of the benchmark's output: a title, columns (a header and an alignment each) and rows of cells,
/// printed one way (`print()`: aligned, under a rule) and written as Markdown for BENCHMARKS.md.
struct Table {
    enum Alignment { case left, right }

    /// The line above the table (after a blank line) when printed; nil: none.
    var title: String?
    var headers: [String]
    var alignments: [Alignment]
    var rows: [[String]] = []
    /// Lines printed under the rows.
    var notes: [String] = []

    /// The first `left` columns left-aligned (names), the rest right-aligned (figures).
    init(_ title: String? = nil, _ headers: [String] = [], left: Int = 2, rows: [[String]] = [], notes: [String] = []) {
        (self.title, self.headers, self.rows, self.notes) = (title, headers, rows, notes)
        alignments = headers.indices.map { $0 < left ? .left : .right }
    }

    var isEmpty: Bool { rows.isEmpty }

    mutating func append(_ row: [String]) { rows.append(row) }

    /// The title (after a blank line), the header, a rule as wide as it, the rows, then the notes; a table
    /// without columns is its title and notes.
    func print() {
        if let title { Swift.print("\n" + title) }
        defer { notes.forEach { Swift.print($0) } }
        guard !headers.isEmpty else { return }
        let all = [headers] + rows
        let widths = headers.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
        for (n, row) in all.enumerated() {
            let line = row.enumerated().map { column, cell in
                alignments[column] == .left ? cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[column] - cell.count) + cell
            }.joined(separator: "  ")
            Swift.print(line)
            if n == 0 { Swift.print(String(repeating: "-", count: line.count)) }
        }
    }

    /// The table in GitHub-flavoured Markdown, without its title. A `|` in a cell is escaped; columns after
    /// the first two are right-aligned when every body cell but "-" is a figure (starts with a digit or a
    /// sign, holds no code).
    var markdown: String {
        let alignments = headers.indices.map { column -> String in
            let cells = rows.map { column < $0.count ? $0[column] : "" }.filter { $0 != "-" && !$0.isEmpty }
            let numeric =
                column >= 2 && !cells.isEmpty
                && cells.allSatisfy { cell in
                    !cell.contains("`") && (cell.first.map { $0.isNumber || "+−-*".contains($0) } ?? false)
                }
            return numeric ? "---:" : "---"
        }
        func line(_ cells: [String]) -> String {
            let padded = headers.indices.map { $0 < cells.count ? cells[$0] : "" }
            return "| " + padded.map { $0.replacingOccurrences(of: "|", with: "\\|") }.joined(separator: " | ") + " |"
        }
        return ([line(headers), "|" + alignments.joined(separator: "|") + "|"] + rows.map(line)).joined(separator: "\n") + "\n"
    }
}
