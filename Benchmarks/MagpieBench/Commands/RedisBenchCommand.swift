import ArgumentParser
import Foundation

/// The Redis client against redis-benchmark (`magpie-bench redis`). Named `RedisBench`: `RedisCommand` is
/// the library's command type.
struct RedisBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "redis",
        abstract:
            "GET/SET of 100-byte values with magpie-redis and redis-benchmark on the same server, in one run; and calls failed fast by an open breaker."
    )

    @OptionGroup var options: RedisBenchOptions
    @OptionGroup var outputOptions: OutputOptions

    func run() async throws {
        let results = try await RedisScenario(options: options).run(progress: progressLine)
        printRedisSummary(results)
        if let json = outputOptions.json {
            let report = Report(
                date: timestamp(), machine: .current(), config: ["redis": .object(options.config)], results: results)
            try report.write(to: json)
            print("\nwrote \(json)")
        }
    }
}
