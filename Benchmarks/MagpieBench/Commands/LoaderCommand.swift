import ArgumentParser
import Foundation

/// The loader scenario alone.
struct Loader: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Callers in front of a slow, failing origin: cache-aside, single flight, and stale-while-revalidate with fail-safe.")

    @OptionGroup var options: LoaderBenchOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() async throws {
        let results = try await LoaderScenario(options: options).run(progress: progressLine)
        print()
        printTable(results)
        printLoaderSummary(results)
        if let json = outputOptions.json {
            let report = Report(date: timestamp(), machine: .current(), config: ["loader": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
