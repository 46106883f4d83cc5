import ArgumentParser
import Foundation
import Magpie

/// For the SIGBUS-guard test: a SIGBUS that is not the disk tier's own must still reach the handler the
/// process had before the tier installed its guard. Installs a handler that exits with status 42, opens
/// a disk tier (which installs the guard, chained to it), then faults outside any guarded copy by reading
/// a mapping of a file truncated to nothing. Exit status 42: the fault was handed on. Anything else (the
/// guard swallowed it, or the process died of the signal): the chaining is broken.
struct SigbusChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sigbus-child", abstract: "Check that the disk tier's SIGBUS guard chains (used by a test).",
        shouldDisplay: true)

    @Option(help: "A scratch directory.") var directory: String

    func run() throws {
        var action = sigaction()
        action.__sigaction_handler.sa_sigaction = { _, _, _ in _exit(42) }
        action.sa_flags = SA_SIGINFO
        sigemptyset(&action.sa_mask)
        guard sigaction(SIGBUS, &action, nil) == 0 else { throw ExitCode(2) }

        let tier = try DiskTier(.init(directory: directory + "/cache", budget: 1 << 20, bucketCount: 2))
        try tier.set([1, 2, 3], forKey: "k")
        guard try tier.value(forKey: "k") == [1, 2, 3] else { throw ExitCode(3) }

        let path = directory + "/victim"
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0, ftruncate(fd, 8192) == 0,
            let mapping = mmap(nil, 8192, PROT_READ, MAP_SHARED, fd, 0), mapping != MAP_FAILED,
            ftruncate(fd, 0) == 0
        else { throw ExitCode(4) }
        let byte = mapping.load(fromByteOffset: 4096, as: UInt8.self)  // SIGBUS: the page is gone
        print("no fault: read \(byte)")
        throw ExitCode(5)
    }
}
