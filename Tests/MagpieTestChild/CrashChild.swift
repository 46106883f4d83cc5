import ArgumentParser
import Foundation
import Magpie
import MagpieTestSupport

/// The writer the crash tests kill: opens a disk tier and writes, removes, group-removes and flushes
/// in a loop until killed. Every value names its key, version and length, and its bytes follow from
/// those, so a reader can tell a value that was written for a key from any other bytes.
///
/// Before each operation it writes a journal line to standard output ("s key version length group",
/// "r key", "g group", "f"), so the parent knows every operation that completed (all lines but the last)
/// and the one that may have been cut short (the last), and can check the reopened tier against a model.
struct CrashChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-child", abstract: "Write to a disk tier until killed (used by the crash tests).",
        shouldDisplay: true)

    @Option(help: "The cache directory.") var directory: String
    @Option(help: "Seed of the operation sequence; also makes versions unique per run.") var seed: UInt64
    @Option(help: "Disk budget in bytes.") var budget = 256 * 1024
    @Option(help: "Bucket count.") var buckets = 4
    @Option(help: "Distinct keys.") var keys = 300

    func run() throws {
        let tier = try DiskTier(.init(directory: directory, budget: budget, bucketCount: buckets))
        journal("ready")
        var generator = SeededGenerator(seed: seed)
        var version = Int(seed % 100_000) * 10_000_000
        while true {
            let state = generator.next()
            let key = Int(state % UInt64(keys))
            version += 1
            switch (state >> 56) % 32 {
            case 0..<24:
                let length = Int((state >> 20) % 3000)
                journal("s \(key) \(version) \(length) \(key % 4)")
                try tier.set(crashValue(key: key, version: version, length: length), forKey: "k\(key)", group: "g\(key % 4)")
            case 24..<29:
                journal("r \(key)")
                try tier.removeValue(forKey: "k\(key)")
            case 29:
                journal("g \(key % 4)")
                try tier.removeAll(inGroup: "g\(key % 4)")
            default:
                journal("f")
                try tier.flush()
            }
        }
    }
}

/// One line to standard output, unbuffered (a write(2) each: a SIGKILL loses nothing written).
private func journal(_ line: String) {
    var bytes = Array((line + "\n").utf8)
    var done = 0
    while done < bytes.count {
        let written = bytes.withUnsafeMutableBytes { write(1, $0.baseAddress! + done, $0.count - done) }
        if written <= 0 { if errno == EINTR { continue } else { return } }
        done += written
    }
}
