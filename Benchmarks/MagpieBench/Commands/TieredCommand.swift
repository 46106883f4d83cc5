import ArgumentParser
import Foundation
import Histogram
import Magpie

/// The tiered scenario alone.
struct Tiered: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Both tiers: a Zipf working set 10x the memory budget; per-tier hits, promoted-hit latency, vs URLCache.")

    @OptionGroup var options: TieredOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() throws {
        let results = try TieredScenario(options: options).run(progress: progressLine)
        print()
        printTable(results)
        printTieredSummary(results)
        if let json = outputOptions.json {
            let report = Report(
                date: timestamp(), machine: .current(), config: ["tiered": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
