import ArgumentParser
import Foundation
import Magpie
import MagpieRedis

/// One instance of the fleet benchmark: a process of its own, started by `magpie-bench fleet`.
struct FleetWorker: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet-worker", abstract: "One instance of `magpie-bench fleet` (started by it).", shouldDisplay: false)

    @Option var system: String
    @Option var url: String
    @Option var shared: String
    @Option var index: Int
    @Option var workers: Int
    @Option var keys: Int
    @Option var probes: Int
    @Option var threads: Int
    @Option var valueSize: Int
    @Option var zipf: Double
    @Option var setShare: Double
    @Option var removeShare: Double
    @Option var boundMs: Int
    @Option var originUs: Int
    @Option var probeIntervalUs: Int
    @Option var namespace: String
    @Option var singleFlightCallers: Int = 0
    /// Async caller tasks (FleetWorker+Tasks.swift); 0: `threads` caller threads.
    @Option var tasks: Int = 0

    func run() throws {
        let table = try FleetShared(path: shared, keys: keys, probes: probes, workers: workers, create: false)
        let instance = try FleetInstance(self, table: table)
        defer { instance.close() }
        if singleFlightCallers > 0 {
            try instance.singleFlight(callers: singleFlightCallers)
            return
        }
        let tally = FleetTally()
        _ = table.add(table.readyWord, 1)
        try Self.awaitWarmup(table)
        let start = table.load(table.startWord)
        let end = table.load(table.endWord)
        var callers: [Thread] = []
        let done = DispatchGroup()
        if tasks > 0 {
            // The callers are tasks on the global executor; this thread (not one of the pool's) waits.
            done.enter()
            let count = tasks
            Task {
                await instance.driveTasks(count, from: start, until: end, tally: tally)
                done.leave()
            }
        }
        for thread in 0..<(tasks > 0 ? 0 : threads) {
            done.enter()
            let caller = Thread {
                instance.drive(thread: thread, from: start, until: end, tally: tally)
                done.leave()
            }
            caller.stackSize = 1 << 20
            callers.append(caller)
            caller.start()
        }
        if instance.coherent {
            done.enter()
            Thread {
                instance.probe(from: start, until: end)
                done.leave()
            }.start()
        }
        // The feed's health, for the parent's recovery time.
        while monotonicNanoseconds() < end {
            // Coherent again: the feed confirmed (a heartbeat every 100 ms), and every instance's owed
            // writes landed (the fleet's watermark runs 100-250 ms behind while all is well: each
            // instance publishes its own with its heartbeat).
            if let remote = instance.cache?.statistics.remote, remote.unconfirmedMilliseconds < 200,
                remote.undeliveredMilliseconds < 350
            {
                table.store(table.statusWord(worker: index), monotonicNanoseconds())
            }
            usleep(10_000)
        }
        done.wait()
        instance.report(tally)
    }
}

extension FleetWorker {
    /// Waits (this thread) until the parent starts the warm-up, at most 120 s (a parent that died).
    static func awaitWarmup(_ table: FleetShared) throws {
        let deadline = monotonicNanoseconds() + 120_000_000_000
        while table.load(table.warmupWord) == 0 {
            guard monotonicNanoseconds() < deadline else { throw BenchError("the parent did not start the run in 120 s") }
            usleep(1_000)
        }
    }
}

/// What one worker's callers saw.
final class FleetTally: @unchecked Sendable {
    // @unchecked Sendable invariant: every field is read and written with `lock` held.
    let lock = NSLock()
    var reads = 0, writes = 0, removes = 0
    var memoryHits = 0, diskHits = 0, remoteHits = 0, originCalls = 0
    var callerErrors = 0, staleBeyondBound = 0, resurrected = 0, wrongValues = 0
    /// Of the stale reads, those a remote fetch answered (the rest were local copies).
    var staleFromRemote = 0
    var readLatency = LogHistogram()
    var allLatency = LogHistogram()
    /// Memory hits and stores that overlapped the SIGSTOP window (the fault run), and those while Redis
    /// ran (neither paused nor killed).
    var hitLatencyRunning = LogHistogram()
    var hitLatencyPaused = LogHistogram()
    var storeLatencyRunning = LogHistogram()
    var storeLatencyPaused = LogHistogram()
    /// When each stale (or resurrected) read started, and when each caller error was seen (at most
    /// `instantsKept` each per caller): the parent tells the outage windows from the rest.
    var staleAt: [Int64] = []
    var resurrectedAt: [Int64] = []
    var callerErrorAt: [Int64] = []
    static let instantsKept = 20_000

    func merge(_ local: FleetTally) {
        lock.lock()
        defer { lock.unlock() }
        reads += local.reads; writes += local.writes; removes += local.removes
        memoryHits += local.memoryHits; diskHits += local.diskHits; remoteHits += local.remoteHits
        originCalls += local.originCalls; callerErrors += local.callerErrors
        staleBeyondBound += local.staleBeyondBound; staleFromRemote += local.staleFromRemote; resurrected += local.resurrected; wrongValues += local.wrongValues
        readLatency.merge(local.readLatency.counts)
        staleAt += local.staleAt
        resurrectedAt += local.resurrectedAt
        callerErrorAt += local.callerErrorAt
        allLatency.merge(local.allLatency.counts)
        hitLatencyRunning.merge(local.hitLatencyRunning.counts)
        hitLatencyPaused.merge(local.hitLatencyPaused.counts)
        storeLatencyRunning.merge(local.storeLatencyRunning.counts)
        storeLatencyPaused.merge(local.storeLatencyPaused.counts)
    }

    /// A memory hit (`store` false) or a store that ran from `began` to `finished`: tallied as paused if
    /// it overlapped the SIGSTOP window, as running if it overlapped no outage, and not at all if it
    /// overlapped the kill (a caller's own tally: no lock).
    func recordPhase(store: Bool, began: Int64, finished: Int64, table: FleetShared) {
        let took = finished - began
        if table.overlapsPause(began, finished) {
            if store { storeLatencyPaused.record(took) } else { hitLatencyPaused.record(took) }
        } else if !table.overlapsDown(began, finished) {
            if store { storeLatencyRunning.record(took) } else { hitLatencyRunning.record(took) }
        }
    }

    /// A caller error, and when it was seen (a caller's own tally: no lock).
    func recordCallerError() {
        callerErrors += 1
        if callerErrorAt.count < Self.instantsKept { callerErrorAt.append(monotonicNanoseconds()) }
    }
}

/// A worker's cache, as the system under test uses it.
final class FleetInstance: @unchecked Sendable {
    // @unchecked Sendable invariant: every stored property is set in `init` and never changes; the
    // cache and the store are thread safe.
    let options: FleetWorker
    let table: FleetShared
    let cache: Cache?
    let store: RedisRemoteStore?
    /// The cache-aside baseline's plain client (the async callers').
    let client: RedisClient?
    /// The async callers' turns at each key (FleetWorker+Tasks.swift).
    let keyLocks = FleetKeyLocks()
    let coherent: Bool
    let workload: ZipfWorkload
    let boundNs: Int64

    init(_ options: FleetWorker, table: FleetShared) throws {
        self.options = options
        self.table = table
        workload = ZipfWorkload(keyCount: options.keys, alpha: options.zipf)
        boundNs = Int64(options.boundMs) * 1_000_000
        var redis = try RedisConfiguration(url: options.url)
        redis.commandTimeout = .milliseconds(250)
        redis.connectTimeout = .milliseconds(250)
        redis.reconnect.maximum = .milliseconds(250)
        switch options.system {
        case "magpie-fleet":
            let store = try RedisRemoteStore(.init(redis: redis, namespace: options.namespace))
            var configuration = Cache.Configuration(memoryBudget: 64 << 20)
            configuration.metrics = nil
            let worker = options.index
            let probes = options.probes
            let table = table
            var remote = RemoteTierOptions(store: store, maxDisconnectedStaleness: .milliseconds(options.boundMs))
            remote.onInvalidation = { key in
                    // "probe:<n>": the lag probe n was dropped here.
                    guard key.count > 6, key.starts(with: Array("probe:".utf8)),
                        let n = Int(String(decoding: key.dropFirst(6), as: UTF8.self)), n >= 0, n < probes
                    else { return }
                    let word = table.probeWord(n, 1 + worker)
                if table.load(word) == 0 { table.store(word, monotonicNanoseconds()) }
            }
            configuration.remote = remote
            cache = try Cache(configuration)
            self.store = store
            client = nil
            coherent = true
        case "redis-cache-aside":
            // Task callers: a plain RedisClient (FleetWorker+Tasks.swift); thread callers: the store's
            // GET/SET/DEL through the blocking bridge.
            store = options.tasks > 0 ? nil : try RedisRemoteStore(.init(redis: redis, namespace: options.namespace))
            cache = nil
            coherent = false
            client = options.tasks > 0 ? try RedisClient(redis) : nil
        case "local-uncoherent":
            var configuration = Cache.Configuration(memoryBudget: 64 << 20)
            configuration.metrics = nil
            cache = try Cache(configuration)
            store = nil
            coherent = false
            client = nil
        default:
            throw BenchError("unknown system \(options.system)")
        }
    }

    func close() {
        try? cache?.close()
        if let store { _ = try? Self.blocking { await store.shutdown() } }
        if let client { _ = try? Self.blocking { await client.shutdown() } }
    }

    static func name(_ key: Int) -> String { "key:\(key)" }

    func value(_ key: Int, version: Int64) -> [UInt8] {
        var bytes = Array("\(key):\(version):".utf8)
        while bytes.count < options.valueSize { bytes.append(UInt8(ascii: "a") + UInt8(bytes.count % 26)) }
        return bytes
    }

    /// The key and version a value carries (nil: not one of this benchmark's values).
    static func parse(_ bytes: [UInt8]) -> (Int, Int64)? {
        let parts = bytes.prefix(40).split(separator: UInt8(ascii: ":"), maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, let key = Int(String(decoding: parts[0], as: UTF8.self)),
            let version = Int64(String(decoding: parts[1], as: UTF8.self))
        else { return nil }
        return (key, version)
    }

    // MARK: The system's operations

    enum Tier { case memory, disk, remote }

    func read(_ key: Int) throws -> ([UInt8], Tier)? {
        if let cache {
            guard let hit = try cache.lookup(Self.name(key)) else { return nil }
            switch hit.tier {
            case .memory: return (hit.value, .memory)
            case .disk: return (hit.value, .disk)
            case .remote: return (hit.value, .remote)
            }
        }
        guard let store else { return nil }
        let name = Array(Self.name(key).utf8)
        let found = try Self.blocking { try await store.values(forKeys: [name])[0] }
        return found.map { ($0, .remote) }
    }

    func write(_ key: Int, _ value: [UInt8]) throws {
        if let cache { return try cache.set(value, forKey: Self.name(key)) }
        guard let store else { return }
        let name = Array(Self.name(key).utf8)
        _ = try Self.blocking { try await store.store(value, forKey: name, expiresAt: 0, onlyIfAbsent: false) }
    }

    func remove(_ key: Int) throws {
        if let cache {
            try cache.removeValue(forKey: Self.name(key))
            return
        }
        guard let store else { return }
        let name = Array(Self.name(key).utf8)
        try Self.blocking { try await store.remove(keys: [name]) }
    }

    /// Runs `operation` as a task and blocks this thread (one of the benchmark's own, never a thread of
    /// Swift's cooperative pool) until it ends.
    static func blocking<R: Sendable>(_ operation: @escaping @Sendable () async throws -> R) throws -> R {
        let outcome = Outcome<R>()
        let done = DispatchSemaphore(value: 0)
        Task {
            let result: Result<R, any Error>
            do { result = .success(try await operation()) } catch { result = .failure(error) }
            outcome.set(result)
            done.signal()
        }
        done.wait()
        return try outcome.get()
    }

    final class Outcome<R: Sendable>: @unchecked Sendable {
        private let lock = NSLock()
        private var result: Result<R, any Error>? = nil
        func set(_ value: Result<R, any Error>) { lock.withLock { result = value } }
        func get() throws -> R {
            guard let result = lock.withLock({ result }) else { throw BenchError("the operation ended without a result") }
            return try result.get()
        }
    }
}
