import Glibc
import Logging

// A failure that repeats (every load of a failing origin, every read of a failing disk, every corrupt
// record of a damaged file) must not log a line per call: a service with a failing origin would bury
// its own logs, and pay for formatting each line. Counters and metrics keep every event; the log says
// that it happens, how often, on how many keys, and the last error.

/// Logs one kind of event at most once per interval: the first of an interval at once, in full; the
/// others of that interval counted (with the distinct keys they concerned and the last error) and
/// summarised in one line when the interval ends. So an event that repeats all the time costs two
/// lines per interval, and an isolated one a line, as soon as it happens.
///
/// The summary is written by a task that sleeps until the interval's end, started by the first event
/// the interval holds back; ``flush()`` writes it at once (a cache's `close()` calls it).
package final class RepeatedLog: Sendable {
    /// The distinct keys remembered per interval (past it, the summary says "at least").
    static let keyLimit = 4096

    private struct Window {
        /// Monotonic ns when the interval started; nil: no interval under way (the next event is logged).
        var start: UInt64? = nil
        var heldBack = 0
        var keys = Set<UInt64>()
        var lastError: String? = nil
        /// A task waits to write the summary.
        var summaryDue = false
    }

    private let logger: Logger?
    private let level: Logger.Level
    private let message: String
    private let interval: Duration
    private let intervalNanoseconds: UInt64
    private let window = Locked(Window())

    /// A log of `message` events at `level` (nil `logger`: only counted by the caller, never logged).
    package init(_ logger: Logger?, level: Logger.Level, _ message: String, interval: Duration) {
        self.logger = logger
        self.level = level
        self.message = message
        self.interval = max(interval, .milliseconds(1))
        intervalNanoseconds = UInt64(max(1, self.interval.wholeMilliseconds)) * 1_000_000
    }

    /// Notes an event: logged now with `metadata` (and `error`) if it is the first of its interval,
    /// else counted for the interval's summary. `key` is the key's hash, when the event concerns one.
    package func record(key: UInt64? = nil, error: String? = nil, metadata: @autoclosure () -> Logger.Metadata = [:]) {
        guard let logger, logger.logLevel <= level else { return }
        let now = Self.monotonicNanoseconds()
        enum Outcome { case log, heldBack, heldBackFirst, summarizeThenLog(Window) }
        let outcome = window.withLock { window -> Outcome in
            if let start = window.start, now &- start < intervalNanoseconds {
                window.heldBack += 1
                if let key, window.keys.count < Self.keyLimit { window.keys.insert(key) }
                if let error { window.lastError = error }
                if window.summaryDue { return .heldBack }
                window.summaryDue = true
                return .heldBackFirst
            }
            // A new interval: what the old one held back (its summary task has not run yet) goes first.
            let old = window
            window = Window(start: now)
            return old.heldBack > 0 ? .summarizeThenLog(old) : .log
        }
        switch outcome {
        case .heldBack:
            return
        case .heldBackFirst:
            Task.detached { [self, interval] in
                try? await Task.sleep(for: interval)
                flushIfDue()
            }
        case .summarizeThenLog(let old):
            summarize(old, now: now)
            fallthrough
        case .log:
            var full = metadata()
            if let error { full["error"] = "\(error)" }
            logger.log(level: level, "\(message)", metadata: full)
        }
    }

    /// Writes the summary of what the current interval held back, now (nothing if it held none back).
    package func flush() {
        let now = Self.monotonicNanoseconds()
        let held = window.withLock { window -> Window? in
            guard window.heldBack > 0 else { return nil }
            var held = window
            held.start = held.start ?? now
            window.start = now  // what follows is summarised from here
            window.heldBack = 0
            window.keys = []
            window.lastError = nil
            window.summaryDue = false
            return held
        }
        if let held { summarize(held, now: now) }
    }

    /// The summary task: writes the summary once the interval is over, and ends the interval.
    private func flushIfDue() {
        let now = Self.monotonicNanoseconds()
        let held = window.withLock { window -> Window? in
            guard window.summaryDue else { return nil }
            if let start = window.start, now &- start < intervalNanoseconds {
                return nil  // cannot happen (the task slept the whole interval) but for a clock oddity
            }
            let held = window
            window = Window()
            return held.heldBack > 0 ? held : nil
        }
        if let held { summarize(held, now: now) }
    }

    /// Logs what `held` counted, over the time from its start to `now` ("in the last 10 s", "0.4 s").
    private func summarize(_ held: Window, now: UInt64) {
        guard let logger else { return }
        let seconds = Double(now &- (held.start ?? now)) / 1e9
        let span = seconds >= 9.95 ? "\(Int(seconds.rounded())) s" : "\((seconds * 10).rounded() / 10) s"
        var metadata: Logger.Metadata = ["count": "\(held.heldBack)", "seconds": "\(span.dropLast(2))"]
        var text = "\(message): \(held.heldBack) more in the last \(span)"
        if !held.keys.isEmpty {
            let keys = held.keys.count >= Self.keyLimit ? "at least \(held.keys.count)" : "\(held.keys.count)"
            text += ", \(keys) key\(held.keys.count == 1 ? "" : "s")"
            metadata["keys"] = "\(keys)"
        }
        if let error = held.lastError { metadata["last_error"] = "\(error)" }
        logger.log(level: level, "\(text)", metadata: metadata)
    }

    private static func monotonicNanoseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) &* 1_000_000_000 &+ UInt64(now.tv_nsec)
    }
}

/// The disk tier's logs of damage and failures, each at most twice per interval (``RepeatedLog``).
package struct DiskLogs: Sendable {
    let corruptRecord: RepeatedLog
    let healFailed: RepeatedLog
    let sealFailed: RepeatedLog
    let undecompressible: RepeatedLog
    let bucketRecreated: RepeatedLog
    let bucketRecovered: RepeatedLog
    let bucketLoadFailed: RepeatedLog

    init(_ logger: Logger?, interval: Duration) {
        corruptRecord = RepeatedLog(logger, level: .warning, "magpie: corrupt record dropped from the index", interval: interval)
        healFailed = RepeatedLog(
            logger, level: .warning, "magpie: could not move a damaged region's entries out (the damage stays skipped)",
            interval: interval)
        sealFailed = RepeatedLog(
            logger, level: .error, "magpie: writing a memtable failed; the stores it held are lost (misses)", interval: interval)
        undecompressible = RepeatedLog(logger, level: .warning, "magpie: a stored zstd frame did not decompress", interval: interval)
        bucketRecreated = RepeatedLog(
            logger, level: .warning, "magpie: a bucket file was missing or not a regular file; recreated empty", interval: interval)
        bucketRecovered = RepeatedLog(
            logger, level: .warning, "magpie: recovered a damaged bucket file: corrupt records skipped, torn tail cut",
            interval: interval)
        bucketLoadFailed = RepeatedLog(
            logger, level: .error, "magpie: a bucket's index could not be loaded (its operations fail until it loads)",
            interval: interval)
    }

    func flush() {
        for log in [corruptRecord, healFailed, sealFailed, undecompressible, bucketRecreated, bucketRecovered, bucketLoadFailed] {
            log.flush()
        }
    }
}

/// A cache's logs of failures that repeat, each kind at most twice per interval (``RepeatedLog``).
struct CacheLogs: Sendable {
    let loadFailed: RepeatedLog
    let loadNotCached: RepeatedLog
    let subscriptRead: RepeatedLog
    let subscriptWrite: RepeatedLog
    let diskFailed: RepeatedLog

    init(_ logger: Logger, interval: Duration) {
        loadFailed = RepeatedLog(logger, level: .warning, "magpie: a load failed", interval: interval)
        loadNotCached = RepeatedLog(logger, level: .warning, "magpie: a loaded value could not be cached", interval: interval)
        subscriptRead = RepeatedLog(logger, level: .warning, "magpie: subscript read failed", interval: interval)
        subscriptWrite = RepeatedLog(logger, level: .warning, "magpie: subscript store failed", interval: interval)
        diskFailed = RepeatedLog(logger, level: .error, "magpie: a disk operation failed", interval: interval)
    }

    func flush() {
        for log in [loadFailed, loadNotCached, subscriptRead, subscriptWrite, diskFailed] { log.flush() }
    }
}
