import ArgumentParser
import Foundation
import Magpie
import MagpieRedis
import Synchronization

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
    /// The fraction of received change messages the instance discards (a fault).
    @Option var dropMessages: Double = 0
    /// `local-pubsub`: the writer drops its own message's key too (no origin tag).
    @Flag var pubsubEcho = false
    /// One own-write probe every this many ms (0: none).
    @Option var ownWriteProbeMs: Int = 20

    func run() throws {
        // Before any Redis client exists: their round trips are counted from here on (FleetRoundTrips.swift).
        FleetRoundTrips.bootstrap()
        let table = try FleetShared(path: shared, keys: keys, probes: probes, workers: workers, create: false)
        let instance = try FleetInstance(self, table: table)
        defer { instance.close() }
        if singleFlightCallers > 0 {
            try instance.singleFlight(callers: singleFlightCallers)
            return
        }
        let tally = FleetTally()
        try instance.fill()
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
            Task {
                await FleetRoundTrips.$cause.withValue(.probe) { await instance.probe(from: start, until: end) }
                done.leave()
            }
            if ownWriteProbeMs > 0 {
                done.enter()
                let interval = ownWriteProbeMs
                Task {
                    await FleetRoundTrips.$cause.withValue(.probe) {
                        await instance.probeOwnWrites(every: interval, from: start, until: end, tally: tally)
                    }
                    done.leave()
                }
            }
        }
        // The feed's health, for the parent's recovery time; the remote reads, this process's CPU time and
        // its Redis round trips at the measurement's start and end (this thread wakes for both: the
        // callers count the operations that start from then on, and stop at the end).
        var atStart: FleetWindowSample? = nil
        // FLEET_TRACE: the system's state every 50 ms in the worker's log (kept, FleetScenario.swift).
        let trace = FleetInstance.tracing
        var lastTrace: Int64 = 0
        while true {
            let now = monotonicNanoseconds()
            if atStart == nil, now >= start { atStart = FleetWindowSample(instance.system) }
            if now >= end { break }
            if trace, now - lastTrace >= 50_000_000, let line = instance.system.traceLine() {
                lastTrace = now
                FileHandle.standardError.write(Data("trace \((now - start) / 1_000_000) ms \(line)\n".utf8))
            }
            if let health = instance.system.feedHealth {
                let status = table.statusWord(worker: index)
                if health.healthy { table.store(status, now) }
                if health.confirmed { table.store(status + 1, now) }
                if health.delivered { table.store(status + 2, now) }
            }
            let next = atStart == nil ? start : end
            usleep(UInt32(max(0, min(10_000_000, next - now) / 1_000)))
        }
        let atEnd = FleetWindowSample(instance.system)
        done.wait()
        // The round trips once every caller has ended: the measured operations' are all in by then.
        let roundTrips = FleetRoundTrips.report(from: (atStart ?? atEnd).roundTrips, to: FleetRoundTrips.shared.snapshot())
        instance.report(tally, window: atEnd - (atStart ?? atEnd), roundTrips: roundTrips)
    }
}

/// What a worker counts at the measured window's start and end: the system's remote reads, the
/// process's CPU time (every thread: the callers, the system's clients and event loops, the driver's
/// own bookkeeping), and (at the start) its Redis round trips by cause.
struct FleetWindowSample {
    var remote: FleetRemoteReads
    /// CPU time, ns.
    var cpu: UInt64
    var roundTrips: FleetRoundTrips.Snapshot

    init(_ system: any FleetSystem) {
        remote = system.remoteReads()
        cpu = cpuNanoseconds(children: false)
        roundTrips = FleetRoundTrips.shared.snapshot()
    }

    /// The window's remote reads and CPU time.
    static func - (end: FleetWindowSample, start: FleetWindowSample) -> (remote: FleetRemoteReads, cpu: UInt64) {
        (end.remote - start.remote, end.cpu - start.cpu)
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
    // @unchecked Sendable invariant: every field is read and written with `lock` held (`measured` never changes).
    let lock = NSLock()
    /// Whether it tallies the measured window's operations (not the warm-up's): their Redis round trips
    /// are counted by kind (FleetRoundTrips.swift).
    let measured: Bool

    init(measured: Bool = true) { self.measured = measured }

    var reads = 0, writes = 0, removes = 0
    var memoryHits = 0, diskHits = 0, remoteHits = 0, originCalls = 0
    var callerErrors = 0, staleBeyondBound = 0, resurrected = 0, wrongValues = 0
    /// Of the stale reads, those a remote fetch answered (the rest were local copies).
    var staleFromRemote = 0
    var readLatency = LogHistogram()
    var allLatency = LogHistogram()
    /// Sets' and removals' latency (from the caller).
    var storeLatency = LogHistogram()
    var removeLatency = LogHistogram()
    /// Reads (every one, whatever answered it) that overlapped the SIGSTOP window, and those while Redis
    /// ran (neither paused nor killed).
    var readLatencyRunning = LogHistogram()
    var readLatencyPaused = LogHistogram()
    /// Memory hits and stores that overlapped the SIGSTOP window (the fault run), and those while Redis
    /// ran (neither paused nor killed).
    var hitLatencyRunning = LogHistogram()
    var hitLatencyPaused = LogHistogram()
    var storeLatencyRunning = LogHistogram()
    var storeLatencyPaused = LogHistogram()
    /// Stale and resurrected reads and caller errors by the fault windows they fell in (`FleetWindowTally`).
    var windows = FleetWindowTally()
    /// Own-write probes (FleetWorker+Probes.swift), written by one task, read after it ended: read back
    /// after the writer's own write, and of those the ones the system could not answer locally;
    /// probes that overlapped a fault are left out (counted apart).
    var ownWriteProbes = 0, ownWriteNotLocal = 0, ownWriteProbesInFaults = 0

    func merge(_ local: FleetTally) {
        lock.lock()
        defer { lock.unlock() }
        reads += local.reads; writes += local.writes; removes += local.removes
        memoryHits += local.memoryHits; diskHits += local.diskHits; remoteHits += local.remoteHits
        originCalls += local.originCalls; callerErrors += local.callerErrors
        staleBeyondBound += local.staleBeyondBound; staleFromRemote += local.staleFromRemote; resurrected += local.resurrected; wrongValues += local.wrongValues
        windows.merge(local.windows)
        for (_, path) in Self.histograms { self[keyPath: path].merge(local[keyPath: path].counts) }
    }

    /// The latency histograms, by their names in the worker's report.
    static var histograms: [(name: String, path: ReferenceWritableKeyPath<FleetTally, LogHistogram>)] {
        [
            ("read_latency", \.readLatency), ("all_latency", \.allLatency), ("store_latency", \.storeLatency),
            ("remove_latency", \.removeLatency), ("hit_latency_running", \.hitLatencyRunning),
            ("hit_latency_paused", \.hitLatencyPaused), ("store_latency_running", \.storeLatencyRunning),
            ("store_latency_paused", \.storeLatencyPaused), ("read_latency_running", \.readLatencyRunning),
            ("read_latency_paused", \.readLatencyPaused),
        ]
    }

    /// A read (any) that ran from `began` to `finished`: tallied as paused if it overlapped the SIGSTOP
    /// window, as running if it overlapped no outage (a caller's own tally: no lock).
    func recordReadPhase(began: Int64, finished: Int64, table: FleetShared) {
        if table.overlapsPause(began, finished) {
            readLatencyPaused.record(finished - began)
        } else if !table.overlapsDown(began, finished) {
            readLatencyRunning.record(finished - began)
        }
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

    /// A caller error, tallied by the fault windows it was seen in (a caller's own tally: no lock).
    func recordCallerError(_ table: FleetShared) {
        callerErrors += 1
        windows.count(.errors, table.faultWindows(at: monotonicNanoseconds()))
    }
}

/// Counts by fault window: stale reads (by when they started), resurrected reads, caller errors.
struct FleetWindowTally {
    enum Kind: Int, CaseIterable { case stale, resurrected, errors }
    /// The JSON names of the slots: each fault's window, outside them all, and Redis killed or paused.
    static let slots = ["pubsub_killed", "redis_killed", "redis_paused", "outside", "outage", "redis_evicting"]
    /// counts[kind][slot]
    var counts = [[Int]](repeating: [Int](repeating: 0, count: slots.count), count: Kind.allCases.count)

    mutating func count(_ kind: Kind, _ windows: FaultWindows) {
        if windows.contains(.subscribersKilled) { counts[kind.rawValue][0] += 1 }
        if windows.contains(.redisKilled) { counts[kind.rawValue][1] += 1 }
        if windows.contains(.redisPaused) { counts[kind.rawValue][2] += 1 }
        if windows.isEmpty { counts[kind.rawValue][3] += 1 }
        if !windows.isDisjoint(with: .outage) { counts[kind.rawValue][4] += 1 }
        if windows.contains(.redisEvicting) { counts[kind.rawValue][5] += 1 }
    }

    mutating func merge(_ other: FleetWindowTally) {
        for kind in counts.indices { for slot in counts[kind].indices { counts[kind][slot] += other.counts[kind][slot] } }
    }

    /// `"<kind>_<slot>"` → count, for the worker's report (e.g. `stale_redis_paused`).
    var json: [String: JSONValue] {
        var line: [String: JSONValue] = [:]
        for kind in Kind.allCases {
            for (slot, name) in Self.slots.enumerated() { line["window_\(kind)_\(name)"] = .int(counts[kind.rawValue][slot]) }
        }
        return line
    }
}

/// A worker's system and what its callers share: the table, the origin, the key locks.
final class FleetInstance: @unchecked Sendable {
    /// `FLEET_TRACE` is set: the worker writes the system's state every 50 ms and each stale read it
    /// judged to its log (kept, FleetScenario.swift).
    static let tracing = ProcessInfo.processInfo.environment["FLEET_TRACE"] != nil

    // @unchecked Sendable invariant: every stored property is set in `init` and never changes; `options`
    // is a value read only, the others are thread safe.
    let options: FleetWorker
    let table: FleetShared
    let system: any FleetSystem
    let origin: FleetOrigin
    /// The callers' key locks (FleetKeyLocks.swift).
    let keyLocks: FleetKeyLocks
    /// The system is kept coherent (magpie-fleet, local-pubsub): lag and own-write probes.
    let coherent: Bool
    let workload: ZipfWorkload
    let boundNs: Int64
    /// The probes' writes (lag and own-write probes: all within the measured window), which reach Redis
    /// as the callers' stores do.
    let probeWrites = Atomic<Int>(0)

    /// Every system's memory: Magpie's memory budget, the hand-built pattern's local map's.
    static let memoryBudget = 64 << 20

    init(_ options: FleetWorker, table: FleetShared) throws {
        self.options = options
        self.table = table
        keyLocks = FleetKeyLocks(table: table)
        workload = ZipfWorkload(keyCount: options.keys, alpha: options.zipf)
        boundNs = Int64(options.boundMs) * 1_000_000
        let origin = FleetOrigin(table: table, originUs: options.originUs, valueSize: options.valueSize)
        self.origin = origin
        var configuration = try RedisConfiguration(url: options.url)
        configuration.commandTimeout = .milliseconds(250)
        configuration.connectTimeout = .milliseconds(250)
        configuration.reconnect.maximum = .milliseconds(250)
        configuration.recordsStages = true  // where a set's, a removal's and a read's round trips spend their time
        let redis = configuration
        // "probe:<n>": the lag probe n was dropped here.
        let worker = options.index
        let probes = options.probes
        let lagProbe: @Sendable ([UInt8]) -> Void = { key in
            guard key.count > 6, key.starts(with: Array("probe:".utf8)),
                let n = Int(String(decoding: key.dropFirst(6), as: UTF8.self)), n >= 0, n < probes
            else { return }
            let word = table.probeWord(n, 1 + worker)
            if table.load(word) == 0 { table.store(word, monotonicNanoseconds()) }
        }
        switch options.system {
        case "magpie-fleet":
            system = try FleetMagpieSystem(
                remote: (redis, options.namespace), boundMs: options.boundMs, dropMessages: options.dropMessages, origin: origin,
                onInvalidation: lagProbe)
            coherent = true
        case "redis-cache-aside":
            system = try FleetCacheAsideSystem(redis: redis, namespace: options.namespace, origin: origin)
            coherent = false
        case "local-pubsub":
            let (namespace, skips, drop, seed) = (options.namespace, !options.pubsubEcho, options.dropMessages, UInt64(options.index))
            system = try Self.blocking {
                try await FleetLocalPubSubSystem.start(
                    redis: redis, namespace: namespace, origin: origin, budget: Self.memoryBudget, instance: worker,
                    skipsOwnMessages: skips, dropMessages: drop, seed: seed, onInvalidation: lagProbe)
            }
            coherent = true
        case "local-uncoherent":
            system = try FleetMagpieSystem(
                remote: nil, boundMs: options.boundMs, dropMessages: 0, origin: origin, onInvalidation: nil)
            coherent = false
        default:
            throw BenchError("unknown system \(options.system)")
        }
    }

    /// The Magpie cache, for the systems that are one.
    var cache: Cache? { (system as? FleetMagpieSystem)?.cache }

    func close() {
        let system = system
        _ = try? Self.blocking { await system.close() }
    }

    static func name(_ key: Int) -> String { "key:\(key)" }

    /// Before the warm-up, with every worker doing the same: reads every key once through the system
    /// (16 tasks, the keys dealt out), so that each row measures caches that are full, as a service's are
    /// once it has run a while. Without it, a system whose first loads are slower was still filling
    /// (loading the Zipf tail from the origin, going to Redis for the keys the other workers loaded) in
    /// the measured window of a short run, and its tail latency reported its fill, not its hits. The reads
    /// are not tallied; their round trips count as the warm-up's.
    func fill() throws {
        let (system, keys) = (system, options.keys)
        let fillers = 16
        try Self.blocking {
            await withTaskGroup(of: Void.self) { group in
                for filler in 0..<fillers {
                    group.addTask {
                        for key in stride(from: filler, to: keys, by: fillers) {
                            _ = try? await FleetRoundTrips.run(.read, measured: false) { try await system.read(Self.name(key), key: key) }
                        }
                    }
                }
            }
        }
    }

    func value(_ key: Int, version: Int64) -> [UInt8] { FleetValue.make(key: key, version: version, size: options.valueSize) }

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
