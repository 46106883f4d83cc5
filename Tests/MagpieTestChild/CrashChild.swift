import ArgumentParser
import Foundation
import Magpie
import MagpieTestSupport

/// The writer the crash tests kill: opens a disk tier and writes, reads, removes, group-removes and
/// flushes in a loop until killed. Every value names its key, version and length, and its bytes follow
/// from those, so a reader can tell a value that was written for a key from any other bytes.
///
/// Before each operation that changes the tier it writes a journal line to standard output ("s key
/// version length group", "r key", "g group", "f"), so the parent knows every operation that completed
/// (all lines but the last) and the one that may have been cut short (the last), and can check the
/// reopened tier against a model. Reads go to a tenth of the keys, so that their records earn read
/// credits and region reclaims copy them forward (reinsertion, with the threshold at 1 by default): the
/// kill can then fall inside a reinsertion too. Each read is checked against what this run wrote and
/// removed (a key it did not touch may hold any value that describes that key); a wrong one is
/// journaled as "x …" and the child exits with status 3. Every 64 operations it journals "n
/// reinsertions" (the tier's count since the open), so the parent can tell that reinsertion happened.
struct CrashChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-child", abstract: "Write to a disk tier until killed (used by the crash tests).",
        shouldDisplay: true)

    @Option(help: "The cache directory.") var directory: String
    @Option(help: "Seed of the operation sequence; also makes versions unique per run.") var seed: UInt64
    @Option(help: "Disk budget in bytes.") var budget = 256 * 1024
    @Option(help: "Bucket count.") var buckets = 4
    @Option(help: "Distinct keys.") var keys = 300
    @Option(help: "The tier's reinsertion threshold (DiskTier.Configuration).") var reinsertionThreshold = 1
    @Option(help: "Values are 0 to this many bytes long (less one).") var maxLength = 3000
    @Flag(help: "Bucket files grown in 2 MiB ranges held as huge pages (DiskTier.Configuration.hugePageFiles).")
    var hugePages = false

    func run() throws {
        var configuration = DiskTier.Configuration(directory: directory, budget: budget, bucketCount: buckets)
        configuration.reinsertionThreshold = reinsertionThreshold
        configuration.hugePageFiles = hugePages
        let tier = try DiskTier(configuration)
        journal("ready")
        var generator = SeededGenerator(seed: seed)
        var version = Int(seed % 100_000) * 10_000_000
        // What this run last did to each key it touched.
        var written: [Int: LastWrite] = [:]
        var operations = 0
        while true {
            let state = generator.next()
            let key = Int(state % UInt64(keys))
            version += 1
            operations += 1
            if operations % 64 == 0 { journal("n \(tier.statistics.reinsertions)") }
            switch (state >> 56) % 32 {
            case 0..<19:
                let length = Int((state >> 20) % UInt64(max(1, maxLength)))
                journal("s \(key) \(version) \(length) \(key % 4)")
                try tier.set(crashValue(key: key, version: version, length: length), forKey: "k\(key)", group: "g\(key % 4)")
                written[key] = .value(version: version, length: length)
            case 19..<25:
                let hot = key % max(1, keys / 10)
                if let problem = check(try tier.value(forKey: "k\(hot)"), key: hot, written: written[hot]) {
                    journal("x k\(hot): \(problem)")
                    throw ExitCode(3)
                }
            case 25..<29:
                journal("r \(key)")
                try tier.removeValue(forKey: "k\(key)")
                written[key] = .removed
            case 29:
                journal("g \(key % 4)")
                try tier.removeAll(inGroup: "g\(key % 4)")
                for other in 0..<keys where other % 4 == key % 4 { written[other] = .removed }
            default:
                journal("f")
                try tier.flush()
            }
        }
    }

    /// What this run last did to a key.
    private enum LastWrite {
        case value(version: Int, length: Int)
        case removed
    }

    /// What is wrong with `value`, read for `key`, given what this run last did to the key (nil: nothing);
    /// nil when nothing is. A missing value is never wrong: eviction may take any entry.
    private func check(_ value: [UInt8]?, key: Int, written: LastWrite?) -> String? {
        guard let value else { return nil }
        switch written {
        case .removed:
            return "a removed key read back (\(value.count) bytes)"
        case .value(let version, let length):
            return value == crashValue(key: key, version: version, length: length)
                ? nil : "not the latest value written (version \(version))"
        case nil:
            // Written by an earlier run: any version, but exactly the bytes of one written for this key.
            return isCrashValue(value, ofKey: key) ? nil : "bytes of no value written for this key"
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
