import ArgumentParser
import Foundation

/// report.html: one self-contained page (inline SVG, no scripts, no external files) with the summary
/// table and the charts a tuner looks at. The page is well-formed XML (XHTML), so it can be checked by
/// any XML parser.
enum HTMLReport {
    static func render(_ report: Report) -> String {
        var body = "<h1>magpie-bench report</h1>\n"
        body += "<p>\(escape(report.date)) · \(report.machine.cores) cores · \(escape(report.machine.cpu)) · "
        body += "\(report.machine.memory_bytes >> 20) MiB · \(escape(report.machine.os)) · magpie-bench \(escape(report.version))</p>\n"
        body += summaryTable(report.results)
        body += latencyCharts(report.results)
        body += hitRatioChart(report.results)
        body += missRatioCharts(report.results)
        body += throughputCharts(report.results)
        return """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE html>
            <html xmlns="http://www.w3.org/1999/xhtml" lang="en">
            <head><meta charset="UTF-8"/><title>magpie-bench \(escape(report.date))</title>
            <style>
            body { font-family: sans-serif; margin: 2em; color: #222; }
            table { border-collapse: collapse; font-size: 13px; }
            td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
            td:nth-child(-n+2), th { text-align: left; }
            svg { display: block; margin: 1.5em 0; }
            .note { color: #777; }
            </style></head>
            <body>
            \(body)</body>
            </html>

            """
    }

    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    static func summaryTable(_ results: [BenchResult]) -> String {
        var html = "<h2>Summary (the sweep's points are in the charts)</h2>\n<table><tr><th>scenario</th><th>system</th><th>threads</th><th>ops/s</th>"
        html += "<th>p50 ns</th><th>p99 ns</th><th>hit ratio</th></tr>\n"
        for r in results where r.extra["sweep_parameter"] == nil {
            html += "<tr><td>\(escape(r.scenario))</td><td>\(escape(r.labeledSystem))</td><td>\(r.threads)</td>"
            html += "<td>\(formatRate(r.ops_per_sec))</td><td>\(r.latency_ns.p50)</td><td>\(r.latency_ns.p99)</td>"
            html += "<td>\(String(format: "%.4f", r.hit_ratio))</td></tr>\n"
        }
        return html + "</table>\n"
    }

    /// Rows that are not points of a sweep.
    static func plain(_ results: [BenchResult]) -> [BenchResult] {
        results.filter { $0.extra["sweep_parameter"] == nil && !$0.scenario.hasPrefix("replay") && $0.latency_ns.p50 > 0 }
    }

    /// Per scenario, p50/p90/p99/p99.9 per system (one thread where a scenario has several).
    static func latencyCharts(_ results: [BenchResult]) -> String {
        var html = "<h2>Latency percentiles per system</h2>\n"
        let rows = plain(results)
        var scenarios: [String] = []
        for r in rows where !scenarios.contains(r.scenario) { scenarios.append(r.scenario) }
        if scenarios.isEmpty { return html + "<p class=\"note\">No latency rows in this report.</p>\n" }
        for scenario in scenarios {
            let minimum = rows.filter { $0.scenario == scenario }.map(\.threads).min() ?? 1
            let chosen = rows.filter { $0.scenario == scenario && $0.threads == minimum }
            let series = [("p50", \Percentiles.p50), ("p90", \Percentiles.p90), ("p99", \Percentiles.p99), ("p99.9", \Percentiles.p999)]
            html += SVGChart.bars(
                title: "\(scenario), \(minimum) thread\(minimum == 1 ? "" : "s"): latency (ns, log scale)",
                groups: chosen.map(\.labeledSystem), series: series.map { name, path in (name, chosen.map { Double($0.latency_ns[keyPath: path]) }) },
                logScale: true)
        }
        return html
    }

    /// Hit ratio vs memory budget: the budget sweep's points (trace replays are in `missRatioCharts`).
    static func hitRatioChart(_ results: [BenchResult]) -> String {
        var series: [String: [(Double, Double)]] = [:]
        for r in results {
            if case .string("budget_percent") = r.extra["sweep_parameter"], let x = r.extra["sweep_value"]?.numberValue {
                series["\(r.system) (Zipf)", default: []].append((x, r.hit_ratio))
            }
        }
        let html = "<h2>Hit ratio vs memory budget</h2>\n"
        if series.isEmpty { return html + "<p class=\"note\">No budget points: run `magpie-bench sweep`.</p>\n" }
        return html
            + SVGChart.lines(
                title: "hit ratio vs budget (% of the working set, log scale)", xLabel: "budget %", yLabel: "hit ratio",
                series: series.sorted { $0.key < $1.key }.map { ($0.key, $0.value.sorted { $0.0 < $1.0 }) }, logX: true)
    }

    /// Miss ratio vs budget, one chart per trace: every replay at % budgets (`replay --json`, the sweep's
    /// policy curve), Magpie's tiers beside the reference policies, and any baseline rows `report
    /// --baseline` added (dashed). The y axis spans the points, not 0–1: the policies differ by points.
    static func missRatioCharts(_ results: [BenchResult]) -> String {
        var traces: [String] = []
        var series: [String: [String: [(Double, Double)]]] = [:]
        var order: [String: [String]] = [:]
        for r in results where r.scenario.hasPrefix("replay ") && r.scenario.hasSuffix("%") {
            guard let x = Double(r.scenario.dropFirst("replay ".count).dropLast()) else { continue }
            let trace = r.extra["trace"]?.stringValue ?? "trace"
            if !traces.contains(trace) { traces.append(trace) }
            if series[trace, default: [:]][r.system] == nil { order[trace, default: []].append(r.system) }
            guard !(series[trace]?[r.system]?.contains { $0.0 == x } ?? false) else { continue }  // a point once
            series[trace, default: [:]][r.system, default: []].append((x, r.extra["miss_ratio"]?.numberValue ?? 1 - r.hit_ratio))
        }
        let html = "<h2>Miss ratio vs budget on traces</h2>\n"
        if traces.isEmpty {
            return html + "<p class=\"note\">No trace replays: run `magpie-bench sweep --curves policy` or `replay --json`.</p>\n"
        }
        return html
            + traces.map { trace in
                let lines = order[trace, default: []].map { system in (system, series[trace]![system]!.sorted { $0.0 < $1.0 }) }
                return SVGChart.lines(
                    title: "\(trace): miss ratio vs budget (% of the working set, log scale)", xLabel: "budget %",
                    yLabel: "miss ratio", series: lines, logX: true, fitY: true)
            }.joined()
    }

    /// Throughput vs threads (the plain memory rows) and vs shards (the shard sweep).
    static func throughputCharts(_ results: [BenchResult]) -> String {
        var html = "<h2>Throughput vs threads and shards</h2>\n"
        var byThreads: [String: [(Double, Double)]] = [:]
        for r in plain(results) where r.scenario == "memory" {
            byThreads[r.system, default: []].append((Double(r.threads), r.ops_per_sec / 1e6))
        }
        var byShards: [String: [(Double, Double)]] = [:]
        for r in results {
            if case .string("shards") = r.extra["sweep_parameter"], let x = r.extra["sweep_value"]?.numberValue {
                byShards["\(r.system), \(r.threads) thread\(r.threads == 1 ? "" : "s")", default: []].append((x, r.ops_per_sec / 1e6))
            }
        }
        if byThreads.isEmpty && byShards.isEmpty {
            return html + "<p class=\"note\">No memory-scenario rows or shard sweep in this report.</p>\n"
        }
        if !byThreads.isEmpty {
            html += SVGChart.lines(
                title: "memory scenario: M ops/s vs threads", xLabel: "threads", yLabel: "M ops/s",
                series: byThreads.sorted { $0.key < $1.key }.map { ($0.key, $0.value.sorted { $0.0 < $1.0 }) }, logX: false)
        }
        if !byShards.isEmpty {
            html += SVGChart.lines(
                title: "M ops/s vs shard count (log scale)", xLabel: "shards", yLabel: "M ops/s",
                series: byShards.sorted { $0.key < $1.key }.map { ($0.key, $0.value.sorted { $0.0 < $1.0 }) }, logX: true)
        }
        return html
    }
}

/// Minimal SVG charts: grouped bars and lines, with axes, ticks and a legend.
enum SVGChart {
    static let palette = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
        "#ad494a",
    ]
    static let (width, height, left, right, top, bottom) = (720.0, 340.0, 70.0, 170.0, 30.0, 50.0)

    static func text(_ x: Double, _ y: Double, _ content: String, anchor: String = "middle", size: Int = 11) -> String {
        "<text x=\"\(f(x))\" y=\"\(f(y))\" text-anchor=\"\(anchor)\" font-size=\"\(size)\">\(HTMLReport.escape(content))</text>"
    }

    static func f(_ value: Double) -> String { String(format: "%.1f", value) }

    static func label(_ value: Double) -> String {
        value >= 1e6 ? String(format: "%.3gM", value / 1e6) : value >= 1e3 ? String(format: "%.3gk", value / 1e3) : String(format: "%.3g", value)
    }

    static func frame(_ title: String, _ content: String) -> String {
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" "
            + "viewBox=\"0 0 \(Int(width)) \(Int(height))\">\n" + text(width / 2 - right / 2, 18, title, size: 13) + "\n" + content
            + "</svg>\n"
    }

    /// Maps a value onto [0, 1] of the axis (log or linear).
    static func scale(_ lower: Double, _ upper: Double, log: Bool) -> (Double) -> Double {
        if log {
            let (a, b) = (Foundation.log10(max(lower, 1e-12)), Foundation.log10(max(upper, 1e-12)))
            return { b > a ? (Foundation.log10(max($0, 1e-12)) - a) / (b - a) : 0.5 }
        }
        return { upper > lower ? ($0 - lower) / (upper - lower) : 0.5 }
    }

    static func ticks(_ lower: Double, _ upper: Double, log: Bool) -> [Double] {
        if log {
            var values: [Double] = []
            var decade = pow(10, floor(Foundation.log10(max(lower, 1e-12))))
            while decade <= upper * 1.0001 {
                for m in [1.0, 2, 5] where decade * m >= lower * 0.9999 && decade * m <= upper * 1.0001 { values.append(decade * m) }
                decade *= 10
            }
            return values.isEmpty ? [lower, upper] : values
        }
        let step = niceStep(upper - lower)
        return Array(stride(from: lower, through: upper + step * 1e-9, by: step))
    }

    /// A round tick step (1, 2, 2.5 or 5 × a power of ten) giving about four intervals over `span`.
    static func niceStep(_ span: Double) -> Double {
        guard span > 0 else { return 1 }
        let raw = span / 4
        let magnitude = pow(10, floor(Foundation.log10(raw)))
        for m in [1.0, 2, 2.5, 5] where m * magnitude >= raw { return m * magnitude }
        return 10 * magnitude
    }

    /// An upper bound above `value` that falls on a round tick.
    static func niceUpper(_ value: Double) -> Double {
        let step = niceStep(value * 1.05)
        return max(step, (value * 1.05 / step).rounded(.up) * step)
    }

    static func yAxis(_ lower: Double, _ upper: Double, log: Bool) -> String {
        let plotHeight = height - top - bottom
        let y = scale(lower, upper, log: log)
        var svg = "<line x1=\"\(f(left))\" y1=\"\(f(top))\" x2=\"\(f(left))\" y2=\"\(f(height - bottom))\" stroke=\"#444\"/>\n"
        for tick in ticks(lower, upper, log: log) {
            let py = height - bottom - y(tick) * plotHeight
            svg += "<line x1=\"\(f(left))\" y1=\"\(f(py))\" x2=\"\(f(width - right))\" y2=\"\(f(py))\" stroke=\"#eee\"/>\n"
            svg += text(left - 6, py + 4, label(tick), anchor: "end") + "\n"
        }
        return svg
    }

    static func legend(_ names: [String]) -> String {
        names.enumerated().map { index, name in
            let y = top + 14 + Double(index) * 16
            return "<rect x=\"\(f(width - right + 12))\" y=\"\(f(y - 9))\" width=\"10\" height=\"10\" fill=\"\(palette[index % palette.count])\"/>"
                + text(width - right + 28, y, name, anchor: "start")
        }.joined(separator: "\n") + "\n"
    }

    static func bars(title: String, groups: [String], series: [(String, [Double])], logScale: Bool) -> String {
        let values = series.flatMap(\.1).filter { $0 > 0 }
        let lower = logScale ? max(1, (values.min() ?? 1) / 2) : 0
        let upper = logScale ? max(lower * 10, (values.max() ?? 1) * 1.5) : niceUpper(values.max() ?? 1)
        let y = scale(lower, upper, log: logScale)
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        let groupWidth = plotWidth / Double(max(1, groups.count))
        let barWidth = groupWidth * 0.8 / Double(max(1, series.count))
        var svg = yAxis(lower, upper, log: logScale)
        for (g, group) in groups.enumerated() {
            let x0 = left + Double(g) * groupWidth + groupWidth * 0.1
            for (s, (_, data)) in series.enumerated() where g < data.count {
                let h = max(0, min(1, y(max(data[g], lower)))) * plotHeight
                svg += "<rect x=\"\(f(x0 + Double(s) * barWidth))\" y=\"\(f(height - bottom - h))\" width=\"\(f(barWidth * 0.95))\" "
                svg += "height=\"\(f(h))\" fill=\"\(palette[s % palette.count])\"><title>\(HTMLReport.escape("\(group) \(series[s].0): \(label(data[g]))"))</title></rect>\n"
            }
            svg += text(x0 + groupWidth * 0.4, height - bottom + 16, group) + "\n"
        }
        return frame(title, svg + legend(series.map(\.0)))
    }

    /// A line per series. `fitY`: the y axis spans the points (rounded to a twentieth) instead of
    /// starting at 0. A series whose name has a colon (a baseline's, "label: system") is dashed.
    static func lines(
        title: String, xLabel: String, yLabel: String, series: [(String, [(Double, Double)])], logX: Bool, fitY: Bool = false
    ) -> String {
        let xs = series.flatMap { $0.1.map(\.0) }
        let ys = series.flatMap { $0.1.map(\.1) }
        let (xLower, xUpper) = (xs.min() ?? 0, xs.max() ?? 1)
        var (yLower, yUpper) = (0.0, niceUpper(max(1e-9, ys.max() ?? 1)))
        if fitY, let low = ys.min(), let high = ys.max() {
            yLower = max(0, (low * 20).rounded(.down) / 20)
            yUpper = max(yLower + 0.05, (high * 20).rounded(.up) / 20)
        }
        let x = scale(xLower, xUpper, log: logX)
        let y = scale(yLower, yUpper, log: false)
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        var svg = yAxis(yLower, yUpper, log: false)
        svg += "<line x1=\"\(f(left))\" y1=\"\(f(height - bottom))\" x2=\"\(f(width - right))\" y2=\"\(f(height - bottom))\" stroke=\"#444\"/>\n"
        for tick in Array(Set(xs)).sorted() {
            svg += text(left + x(tick) * plotWidth, height - bottom + 16, label(tick)) + "\n"
        }
        svg += text(left + plotWidth / 2, height - 12, xLabel) + "\n"
        svg += "<text x=\"16\" y=\"\(f(top + plotHeight / 2))\" font-size=\"11\" transform=\"rotate(-90 16 \(f(top + plotHeight / 2)))\" text-anchor=\"middle\">\(HTMLReport.escape(yLabel))</text>\n"
        for (s, (name, points)) in series.enumerated() {
            let color = palette[s % palette.count]
            let path = points.map { "\(f(left + x($0.0) * plotWidth)),\(f(height - bottom - y($0.1) * plotHeight))" }
            let dash = name.contains(":") ? " stroke-dasharray=\"6 4\"" : ""
            svg += "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"\(dash) points=\"\(path.joined(separator: " "))\"/>\n"
            for point in points {
                svg += "<circle cx=\"\(f(left + x(point.0) * plotWidth))\" cy=\"\(f(height - bottom - y(point.1) * plotHeight))\" r=\"3\" fill=\"\(color)\">"
                svg += "<title>\(HTMLReport.escape("\(name): \(label(point.0)) → \(String(format: "%.4g", point.1))"))</title></circle>\n"
            }
        }
        return frame(title, svg + legend(series.map(\.0)))
    }
}
