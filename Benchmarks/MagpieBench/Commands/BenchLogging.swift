import Foundation
import Logging
import Synchronization

// A benchmark run prints tables, not logs: the library's log lines (a failing origin in the loader
// scenario, Redis killed in the fleet's fault phase) go to a file under bench-results/logs/, created on
// the first line, and the run ends by saying how many lines went there. MAGPIE_BENCH_LOG=stderr sends
// them to the terminal instead.

enum BenchLogging {
    /// The file every log line of this process goes to, created on the first line.
    static let path: String = {
        let formatter = DateFormatter()
        formatter.dateFormat = "yyyyMMdd-HHmmss"
        formatter.timeZone = TimeZone(identifier: "UTC")
        return "bench-results/logs/magpie-bench-\(formatter.string(from: Date()))-\(getpid()).log"
    }()

    static let file = Mutex<FileHandle?>(nil)
    static let lines = Atomic<Int>(0)

    /// Sends every logger of the process to the file (or to standard error when asked).
    static func bootstrap() {
        if ProcessInfo.processInfo.environment["MAGPIE_BENCH_LOG"] == "stderr" {
            LoggingSystem.bootstrap(StreamLogHandler.standardError)
            return
        }
        LoggingSystem.bootstrap { label in FileLogHandler(label: label) }
    }

    static func write(_ line: String) {
        lines.add(1, ordering: .relaxed)
        file.withLock { handle in
            if handle == nil {
                try? FileManager.default.createDirectory(atPath: "bench-results/logs", withIntermediateDirectories: true)
                _ = FileManager.default.createFile(atPath: path, contents: nil)
                handle = FileHandle(forWritingAtPath: path)
                _ = try? handle?.seekToEnd()
            }
            try? handle?.write(contentsOf: Data(line.utf8))
        }
    }

    /// "library log: N lines in <path>" when anything was logged.
    static func summary() -> String? {
        let count = lines.load(ordering: .relaxed)
        return count == 0 ? nil : "library log: \(count) line\(count == 1 ? "" : "s") in \(path)"
    }
}

/// One line per event, as swift-log's stream handler writes it, to ``BenchLogging/path``.
struct FileLogHandler: LogHandler {
    let label: String
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .info

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        let fields = merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let stamp = ISO8601DateFormatter().string(from: Date())
        BenchLogging.write("\(stamp) \(event.level) \(label): \(fields.isEmpty ? "" : fields + " ")\(event.message)\n")
    }
}
