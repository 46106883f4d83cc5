import Foundation
import Logging
import MagpieTestSupport
import Synchronization
import Testing

@testable import Magpie

/// A log handler that keeps every line it is given.
final class CapturedLog: Sendable {
    struct Line: Sendable {
        let level: Logger.Level
        let message: String
        let metadata: [String: String]
    }

    private let storage = Mutex<[Line]>([])

    var lines: [Line] { storage.withLock { $0 } }

    func logger(level: Logger.Level = .info) -> Logger {
        var logger = Logger(label: "magpie.test") { _ in Handler(log: self) }
        logger.logLevel = level
        return logger
    }

    fileprivate func append(_ line: Line) { storage.withLock { $0.append(line) } }

    private struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { $1 }
            log.append(Line(level: event.level, message: "\(event.message)", metadata: merged.mapValues { "\($0)" }))
        }
    }
}

private struct OriginDown: Error, CustomStringConvertible {
    var description: String { "the origin is down" }
}

@Suite("Logs: a failure that repeats is logged twice per interval, counted every time")
struct RepeatedLogTests {
    @Test("the first of an interval at once, the rest summarised when it ends; a later one starts a new interval", .timeLimit(.minutes(2)))
    func summarised() async throws {
        let captured = CapturedLog()
        let log = RepeatedLog(captured.logger(), level: .warning, "magpie: a load failed", interval: .milliseconds(300))
        for round in 0..<1000 {
            log.record(key: UInt64(round % 5), error: "failure \(round)", metadata: ["key_bytes": "3"])
        }
        #expect(captured.lines.count == 1)
        #expect(captured.lines.first?.message == "magpie: a load failed")
        #expect(captured.lines.first?.metadata["error"] == "failure 0")
        #expect(captured.lines.first?.metadata["key_bytes"] == "3")
        // The summary comes when the interval ends, with nothing else happening (its task may start late
        // on a pool the other suites keep busy: this waits long).
        let deadline = ContinuousClock.now + .seconds(60)
        while captured.lines.count < 2 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        let lines = captured.lines
        try #require(lines.count == 2)
        #expect(lines[1].message.hasPrefix("magpie: a load failed: 999 more in the last ") && lines[1].message.hasSuffix(" s, 5 keys"))
        #expect(lines[1].metadata["count"] == "999")
        #expect(lines[1].metadata["last_error"] == "failure 999")
        #expect(lines[1].level == .warning)
        // Quiet since: the next one is logged at once, in full.
        log.record(key: 1, error: "again")
        #expect(captured.lines.count == 3)
        #expect(captured.lines[2].metadata["error"] == "again")
        // Nothing held back: no summary follows.
        try await Task.sleep(for: .milliseconds(600))
        #expect(captured.lines.count == 3)
    }

    @Test("flush writes what is held back at once; a level the logger drops logs nothing")
    func flushAndLevel() {
        let captured = CapturedLog()
        let log = RepeatedLog(captured.logger(), level: .warning, "magpie: subscript read failed", interval: .seconds(60))
        for _ in 0..<3 { log.record(error: "closed") }
        log.flush()
        #expect(captured.lines.map(\.message) == ["magpie: subscript read failed", "magpie: subscript read failed: 2 more in the last 0.0 s"])
        log.flush()  // nothing more held back
        #expect(captured.lines.count == 2)
        let quiet = RepeatedLog(captured.logger(level: .error), level: .warning, "dropped", interval: .seconds(60))
        for _ in 0..<10 { quiet.record(error: "x") }
        quiet.flush()
        #expect(captured.lines.count == 2)
    }

    @Test("an origin failing 500 loads of 20 keys: two lines, every failure counted")
    func failingOrigin() async throws {
        let captured = CapturedLog()
        var configuration = Cache.Configuration(memoryBudget: 4 << 20)
        configuration.metrics = nil
        configuration.logger = captured.logger()
        configuration.logInterval = .seconds(3600)  // the 500 loads may take long on a busy machine
        let cache = try Cache(configuration)
        for call in 0..<500 {
            _ = try? await cache.value(forKey: "key \(call % 20)") { () async throws -> [UInt8] in throw OriginDown() }
        }
        #expect(cache.statistics.loaderFailures == 500)
        #expect(captured.lines.count == 1)
        try cache.close()  // writes the summary held back
        let messages = captured.lines.map(\.message)
        #expect(messages.count == 2 && messages.first == "magpie: a load failed")
        #expect(messages.last?.hasPrefix("magpie: a load failed: 499 more in the last ") == true && messages.last?.hasSuffix(" s, 20 keys") == true)
        #expect(captured.lines.last?.metadata["last_error"] == "the origin is down")
    }

    @Test("64 damaged bucket files read: each kind of damage logged at most twice, all of it counted")
    func corruptRecords() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let captured = CapturedLog()
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 64 << 20)
        configuration.bucketCount = 64
        configuration.writeBufferSize = 0
        configuration.compressionLevel = nil
        configuration.logger = captured.logger()
        do {
            let tier = try DiskTier(configuration)
            for key in 0..<2000 { try tier.set(Array(repeating: UInt8(key % 251), count: 100), forKey: "key \(key)") }
            try tier.close()
        }
        // Damage every record's value in every bucket file (the values are runs of one byte).
        let buckets = directory.path + "/buckets"
        let files = try FileManager.default.contentsOfDirectory(atPath: buckets).filter { !$0.contains(".") && $0 != "SIZES" }
        #expect(files.count == 64)
        var damaged = 0
        for name in files {
            let url = URL(fileURLWithPath: buckets + "/" + name)
            var bytes = try Array(Data(contentsOf: url))
            var position = 0
            while position + 100 <= bytes.count {
                let run = bytes[position..<(position + 100)]
                if let first = run.first, run.allSatisfy({ $0 == first }) {
                    bytes[position + 50] ^= 0xFF
                    damaged += 1
                    position += 100
                } else {
                    position += 1
                }
            }
            try Data(bytes).write(to: url)
        }
        #expect(damaged >= 1500)
        let tier = try DiskTier(configuration)
        let linesAtOpen = captured.lines.count
        for key in 0..<2000 { _ = try tier.value(forKey: "key \(key)") }
        #expect(tier.statistics.corruptRecords >= 64)
        // Each kind (a corrupt record met by a read, the healing compaction that leaves the others out)
        // once so far, whatever the number of files...
        let duringReads = captured.lines.dropFirst(linesAtOpen).map(\.message)
        #expect(Set(duringReads).count == duringReads.count, "\(duringReads)")
        #expect(duringReads.contains("magpie: corrupt record dropped from the index"))
        try tier.close()
        // ...and its summary at close.
        let all = captured.lines.dropFirst(linesAtOpen).map(\.message)
        #expect(all.count <= 2 * Set(duringReads).count, "\(all)")
        #expect(all.contains { $0.hasPrefix("magpie: corrupt record dropped from the index: 63 more in the last ") }, "\(all)")
    }
}
