import ArgumentParser
import Foundation
import Histogram
import Magpie

/// The disk scenario alone.
struct Disk: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Disk tier vs one-file-per-key and URLCache: set, page-cache-hot get, and reopen.")

    @OptionGroup var options: DiskOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() throws {
        let results = try DiskScenario(options: options).run(progress: progressLine)
        print()
        printTable(results)
        if let json = outputOptions.json {
            let report = Report(
                date: timestamp(), machine: .current(), config: ["disk": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
