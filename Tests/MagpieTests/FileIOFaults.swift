@testable import Magpie

/// Installs (or clears) the disk tier's injected I/O failures. Tests match their own directory's
/// paths, so tests running in parallel do not see each other's faults.
enum FileIOFaults {
    static func set(_ inject: (@Sendable (String, String) -> Int32?)?) {
        FileIO.injectFailure.withLock { $0 = inject }
    }
}
