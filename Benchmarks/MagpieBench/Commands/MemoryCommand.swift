import ArgumentParser
import Foundation

/// The memory scenario alone.
struct Memory: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Memory tier vs NSCache and a mutex-guarded Dictionary: cache-aside over a Zipf workload.")

    @OptionGroup var options: MemoryOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() throws {
        let results = try MemoryScenario(options: options).run(progress: progressLine)
        print()
        printTable(results)
        printMemorySummary(results)
        if let json = outputOptions.json {
            let report = Report(
                date: timestamp(), machine: .current(), config: ["memory": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
