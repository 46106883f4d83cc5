import Logging
import Synchronization

// What every part of a `Cache` shares while it runs: the clock, the I/O threads, whether it is open,
// its own counters (the tiers count their own), the logs of failures that repeat, and the timers that
// write the disk buffers and report metrics. The compositions (Tiers/), the load coordinator
// (Loading/) and `Cache` itself hold the same one; nothing in it knows which tiers there are.

/// A counter of the cache's own. `CacheStatistics` and the metrics read every one through
/// ``CacheCounter/table``: a counter is added in one place.
enum CacheCounter: Int, CaseIterable {
    case promotions, loaderRuns, loaderCoalesced, loaderFailures, freshHits, staleHits, negativeHits
    case backgroundRefreshes, failSafeActivations, softTimeouts, hardTimeouts, loadsSuperseded
    case diskErrors, subscriptFailures, inlineDiskReads, inlineDiskStores

    /// Each counter's field in ``CacheStatistics`` and its metric name (`<prefix>_<name>`).
    static var table: [(counter: CacheCounter, field: WritableKeyPath<CacheStatistics, UInt64>, metric: String)] {
        [
        (.promotions, \.promotions, "promotions"), (.loaderRuns, \.loaderRuns, "loader_runs"),
        (.loaderCoalesced, \.loaderCoalesced, "loader_coalesced"), (.loaderFailures, \.loaderFailures, "loader_failures"),
        (.freshHits, \.freshHits, "loader_fresh_hits"), (.staleHits, \.staleHits, "loader_stale_hits"),
        (.negativeHits, \.negativeHits, "loader_negative_hits"),
        (.backgroundRefreshes, \.backgroundRefreshes, "loader_background_refreshes"),
        (.failSafeActivations, \.failSafeActivations, "loader_fail_safe_activations"),
        (.softTimeouts, \.softTimeouts, "loader_soft_timeouts"), (.hardTimeouts, \.hardTimeouts, "loader_hard_timeouts"),
        (.loadsSuperseded, \.loadsSuperseded, "loader_superseded"), (.diskErrors, \.diskErrors, "disk_errors"),
        (.subscriptFailures, \.subscriptFailures, "subscript_failures"), (.inlineDiskReads, \.inlineDiskReads, "inline_disk_reads"),
        (.inlineDiskStores, \.inlineDiskStores, "inline_disk_stores"),
        ]
    }
}

@usableFromInline
final class Runtime: Sendable {
    let clock: CacheClock
    /// The threads that run disk I/O for the async API (one for a memory-only cache, which never uses it).
    let pool: IOThreadPool
    let logger: Logger
    /// Failures that repeat, each kind logged at most twice per interval.
    let logs: CacheLogs
    /// ``Cache/Configuration/inlineResidentDiskReads`` and ``Cache/Configuration/inlineDiskStores``.
    let inlineReads: Bool
    let inlineStores: Bool
    @usableFromInline let closed = Atomic<Bool>(false)
    private let counters: InlineArray<16, Atomic<UInt64>>
    private let timers = Locked<[Task<Void, Never>]>([])

    init(_ configuration: Cache.Configuration, ioThreads: Int) {
        clock = configuration.clock
        pool = IOThreadPool(threadCount: ioThreads, name: "magpie-io")
        logger = configuration.logger
        logs = CacheLogs(configuration.logger, interval: configuration.logInterval)
        inlineReads = configuration.inlineResidentDiskReads
        inlineStores = configuration.inlineDiskStores
        counters = InlineArray { _ in Atomic(0) }
    }

    @inline(__always)
    func count(_ counter: CacheCounter, _ amount: UInt64 = 1) {
        counters[counter.rawValue].wrappingAdd(amount, ordering: .relaxed)
    }

    func value(of counter: CacheCounter) -> UInt64 { counters[counter.rawValue].load(ordering: .relaxed) }

    @usableFromInline
    func checkOpen() throws(MagpieError) {
        if closed.load(ordering: .relaxed) { throw MagpieError(.closed, "the cache is closed") }
    }

    /// Why a key was refused: too long, or the cache closed.
    @usableFromInline
    func refusal(keyLength: Int) -> MagpieError {
        guard keyLength <= HashedKey.maximumLength else {
            return MagpieError(.keyTooLong, "key of \(keyLength) bytes; the limit is \(HashedKey.maximumLength)")
        }
        return MagpieError(.closed, "the cache is closed")
    }

    // MARK: Disk failures

    /// Runs a disk operation; logs and counts an I/O failure before rethrowing it.
    func logged<R>(_ operation: String, _ body: () throws(MagpieError) -> R) throws(MagpieError) -> R {
        do {
            return try body()
        } catch {
            noteDiskFailure(operation, error)
            throw error
        }
    }

    /// Logs and counts a disk operation's I/O failure (other errors pass unnoted).
    func noteDiskFailure(_ operation: String, _ error: MagpieError) {
        guard error.code == .ioFailure || error.code == .noSpace else { return }
        count(.diskErrors)
        logs.diskFailed.record(
            error: "\(error)",
            metadata: ["operation": "\(operation)", "path": "\(error.path ?? "")", "errno": "\(error.errno.map(String.init) ?? "")"])
    }

    // MARK: Keys carried to another thread

    /// Runs `body` with `key` hashed as `hash` (computed by the caller's first probe), after the checks
    /// every keyed call makes: the key's length and that the cache is open.
    func withKey<R>(_ key: [UInt8], hash: UInt64, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try key.withUnsafeBytes { bytes in
            Result { () throws(MagpieError) -> R in
                guard bytes.count <= HashedKey.maximumLength, !closed.load(ordering: .relaxed) else {
                    throw refusal(keyLength: bytes.count)
                }
                return try body(HashedKey(bytes, hash: hash))
            }
        }.get()
    }

    // MARK: Hops

    /// Runs `work` on an I/O thread (disk I/O for the async API; never a round trip to the remote store).
    nonisolated(nonsending)
    func hop<R: Sendable>(_ work: @escaping @Sendable () throws(MagpieError) -> R) async throws -> R {
        try checkOpen()
        return try await pool.run(work)
    }

    /// An async caller's local read or store: tried here when it cannot wait (``Cache/Configuration/inlineResidentDiskReads``,
    /// and never for a cancelled task, whose hop throws `CancellationError`), else on an I/O thread,
    /// where it may wait. `inline`: whether this kind of work may run here at all.
    nonisolated(nonsending)
    func immediateOrHop<R: Sendable>(
        _ key: [UInt8], hash: UInt64, inline: Bool,
        _ work: @escaping @Sendable (HashedKey, ReadWait) throws(MagpieError) -> ImmediateRead<R>
    ) async throws -> R {
        if inline, !Task.isCancelled, case .done(let done) = try withKey(key, hash: hash, { key throws(MagpieError) in try work(key, .ifImmediate) }) {
            return done
        }
        return try await hop { [self] () throws(MagpieError) -> R in
            try withKey(key, hash: hash) { key throws(MagpieError) in try work(key, .block).waited() }
        }
    }

    // MARK: Timers

    /// Runs `tick` every `interval` until the cache closes or `tick` returns false.
    func repeating(every interval: Duration, _ tick: @escaping @Sendable () async -> Bool) {
        let task = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard !Task.isCancelled, await tick() else { return }
            }
        }
        timers.withLock { $0.append(task) }
    }

    /// Stops the timers and the I/O threads (the cache closes, or is dropped).
    func stop() {
        for timer in timers.withLock({ $0 }) { timer.cancel() }
        pool.shutdown()
    }
}

/// Whether a read or store may wait (a lock held by another thread, a disk read of a page not in memory,
/// a memtable with no room).
enum ReadWait {
    case block
    case ifImmediate
}

extension ImmediateRead {
    /// The result of work done with ``ReadWait/block``, which never answers `.wouldBlock`.
    func waited() throws(MagpieError) -> Value {
        guard case .done(let value) = self else { throw MagpieError(.ioFailure, "a read that may wait did not finish") }
        return value
    }
}
