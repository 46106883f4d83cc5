import ArgumentParser
import Foundation
import Histogram
import Magpie

/// The disk scenario alone.
struct Disk: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Disk tier vs RocksDB, LMDB, SQLite, one-file-per-key and URLCache: floors, set, page-cache-hot get, reopen, eviction-heavy, mixed sizes.")

    @OptionGroup var options: DiskOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() throws {
        let results = try DiskScenario(options: options).run(progress: progressLine)
        print()
        printTable(results)
        printDiskSummary(results)
        printTrickleSummary(results)
        if let json = outputOptions.json {
            var config = options.config
            config["system_configurations"] = diskConfigurations(results)
            let report = Report(date: timestamp(), machine: .current(), config: ["disk": .object(config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
