import ArgumentParser
import Glibc
import Magpie

/// For the file-mode test: opens disk tiers under umask 002, in a process of its own. The umask is the
/// process's: set in the test process, it made directories that tests running beside it created
/// group-writable, and a tier opened on one of those refused it (`directoryUnsafe`).
/// Makes `<directory>/cache` with the default modes and `<directory>/shared` with file mode 0640 and
/// directory mode 0750, each with a store and a close; exit status 0 when both opened.
struct UmaskChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "umask-child", abstract: "Open disk tiers under umask 002 (used by a test).", shouldDisplay: true)

    @Option(help: "A scratch directory.") var directory: String

    func run() throws {
        umask(0o002)
        let tier = try DiskTier(DiskTier.Configuration(directory: directory + "/cache", budget: 1 << 20, bucketCount: 2))
        try tier.set(Array("v".utf8), forKey: "k")
        _ = tier.statistics  // both buckets loaded, so that the close snapshots both
        try tier.close()
        var configuration = DiskTier.Configuration(directory: directory + "/shared", budget: 1 << 20, bucketCount: 2)
        configuration.fileMode = 0o640
        configuration.directoryMode = 0o750
        try DiskTier(configuration).close()
    }
}
