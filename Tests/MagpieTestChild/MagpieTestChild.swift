import ArgumentParser

/// Child processes the tests start and kill: not part of any product a user runs. (They lived in
/// magpie-bench before; a test-only program keeps the benchmark tool to benchmarks.)
@main
struct MagpieTestChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "magpie-test-child",
        abstract: "Child processes for Magpie's crash and signal tests.",
        subcommands: [CrashChild.self, SigbusChild.self, FleetOweChild.self, UmaskChild.self])
}
