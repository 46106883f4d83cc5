import ArgumentParser
import Foundation
import MagpieRedis
import MagpieTestSupport

/// Options of `magpie-bench fleet`.
struct FleetOptions: ParsableArguments {
    @Option(help: "Worker processes (cache instances).") var workers = 4
    @Option(help: "Caller threads per worker (with --tasks 0).") var threads = 2
    @Option(parsing: .upToNextOption, help: "Async caller tasks per worker, a row per value and system (0: the --threads caller threads).")
    var tasks = [1, 16, 256]
    @Option(name: .customLong("seconds"), help: "Seconds per system, measured (default 10; 20 with --fault, which takes 15 at least).")
    var secondsOption: Int?
    /// `--seconds`, else 10, or 20 with `--fault`: its timeline takes 15 at least, and at hundreds of
    /// tasks per worker a slow recovery delays the faults after it (each waits for the one before to
    /// recover), which 15 s then does not hold.
    var seconds: Int { secondsOption ?? (fault ? 20 : 10) }
    @Option(help: "Seconds of the same workload before the measurement (not counted), after every worker read each key once (the caches filled).")
    var warmupSeconds = 3.0
    @Option(help: "Distinct keys (Zipf ranks).") var keys = 20_000
    @Option(help: "Zipf exponent of the reads.") var zipf = 0.99
    @Option(help: "Value size in bytes.") var valueSize = 256
    @Option(help: "Share of operations that are sets (a new version, written through).") var setShare = 0.02
    @Option(help: "Share of operations that are removals (a new version in the origin, the cached value removed).")
    var removeShare = 0.01
    @Option(
        parsing: .upToNextOption,
        help: """
            Operation mixes, a row per mix, tasks value and system: default (--set-share sets, --remove-share \
            removals), none (no changes), removals (removals only, --set-share + --remove-share of the operations). \
            Default: all three; with --fault, default only.
            """)
    var mixes: [FleetMix] = []
    @Option(parsing: .upToNextOption, help: "Systems the mixes other than default run (default: every one of --systems).")
    var mixSystems: [String] = []
    @Option(help: "Simulated origin work per miss, µs.") var originUs = 100
    @Option(help: "Magpie's maxDisconnectedStaleness, ms: the documented bound stale reads are judged against.")
    var boundMs = 1000
    @Option(help: "One invalidation-lag probe (a set) every this many µs, across the fleet.") var probeIntervalUs = 2000
    @Option(help: "Concurrent callers per worker in the single-flight phase (0: skip it).") var singleFlightCallers = 100
    @Option(help: "A Redis URL to use instead of a private redis-server (not with --fault).") var url: String?
    @Flag(
        help: """
            Faults in each system's run: every subscriber connection killed (CLIENT KILL TYPE pubsub) at 6 %, Redis \
            killed at 20 % (2 s down, then restarted), paused at 50 % (1.5 s, SIGSTOP), evicting at 75 % (a maxmemory \
            small enough to evict, allkeys-lru, 1.5 s), and --drop-messages (default 0.01 here) of the change \
            messages dropped throughout; stale reads per fault window. FLEET_TRACE=1 keeps the workers' logs, with each one's state every 50 ms and every stale read.
            """)
    var fault = false
    @Option(parsing: .upToNextOption, help: "With --fault, the faults run (default: all four; each keeps its place in the timeline).")
    var faults: [FleetFault] = FleetFault.allCases
    @Option(
        help: """
            Fraction (0…1) of received change messages each instance discards, the whole run (local-pubsub: its \
            subscriber; magpie-fleet: the store's test hook). Default 0, or 0.01 with --fault.
            """)
    var dropMessages: Double?
    @Flag(help: "local-pubsub: the writer drops its own write on its own message (no origin tag: the naive pattern).")
    var pubsubEcho = false
    @Option(help: "One own-write probe per worker every this many ms (a set, then whether it is read locally); 0: none.")
    var ownWriteProbeMs = 20
    @Option(parsing: .upToNextOption, help: "Systems to run (magpie-fleet, redis-cache-aside, local-pubsub, local-uncoherent).")
    var systems = ["magpie-fleet", "redis-cache-aside", "local-pubsub", "local-uncoherent"]

    func validate() throws {
        guard workers >= 2, threads >= 1, seconds >= 2, keys >= 1, valueSize >= 32 else {
            throw ValidationError("need --workers ≥ 2, --threads ≥ 1, --seconds ≥ 2, --keys ≥ 1, --value-size ≥ 32")
        }
        guard !tasks.isEmpty, tasks.allSatisfy({ $0 >= 0 && $0 <= 4096 }) else { throw ValidationError("--tasks: 0…4096 each") }
        guard setShare >= 0, removeShare >= 0, setShare + removeShare <= 1 else { throw ValidationError("bad shares") }
        if fault && url != nil { throw ValidationError("--fault needs the private redis-server (it kills and pauses it)") }
        // The fault timeline (FleetScenario+Faults.swift): the subscriber connections killed at 6 % of the
        // run, Redis killed at 20 % for 2 s, paused at 50 % for 1.5 s, evicting at 75 % for 1.5 s; from 15 s
        // on, each window's 2 s of grace ends before the next begins, and the run has the 2 s the recovery
        // bar allows after the last (the workers report their feeds only until its end: a shorter run
        // reports a slower recovery as none).
        if fault && seconds < 15 {
            throw ValidationError(
                "--fault needs --seconds ≥ 15 (subscribers killed at 6 %, Redis killed at 20 % for 2 s, paused at 50 % for 1.5 s, evicting at 75 % for 1.5 s, then 2 s)")
        }
        if let dropMessages, !(0...1).contains(dropMessages) { throw ValidationError("--drop-messages: a fraction, 0…1") }
        guard ownWriteProbeMs >= 0 else { throw ValidationError("--own-write-probe-ms: 0 or more") }
        let known = Set(["magpie-fleet", "redis-cache-aside", "local-pubsub", "local-uncoherent"])
        for s in systems where !known.contains(s) { throw ValidationError("unknown system \(s); known: \(known.sorted())") }
        guard Set(mixes).count == mixes.count else { throw ValidationError("--mixes: each once") }
        for s in mixSystems where !systems.contains(s) { throw ValidationError("--mix-systems: \(s) is not in --systems") }
    }

    /// The mixes run: `--mixes`, else all of them (the default mix alone with `--fault`: its timeline is
    /// about coherence through faults, which the default mix's sets and removals both exercise).
    var runMixes: [FleetMix] { !mixes.isEmpty ? mixes : fault ? [.standard] : FleetMix.allCases }

    /// The systems a mix runs: every one for the default mix, `--mix-systems` (if given) for the others.
    func systems(for mix: FleetMix) -> [String] {
        mix == .standard || mixSystems.isEmpty ? systems : systems.filter(mixSystems.contains)
    }

    /// The shares of sets and removals of a mix's operations.
    func shares(of mix: FleetMix) -> (set: Double, remove: Double) {
        switch mix {
        case .standard: (setShare, removeShare)
        case .noChanges: (0, 0)
        case .removalsOnly: (0, setShare + removeShare)
        }
    }

    var probes: Int { max(1, seconds * 1_000_000 / max(1, probeIntervalUs)) }

    /// The fraction of change messages dropped: `--drop-messages`, else 1 % with `--fault`.
    var droppedMessages: Double { dropMessages ?? (fault ? 0.01 : 0) }

    var config: [String: JSONValue] {
        [
            "scenario": .string(fault ? "fleet-fault" : "fleet"), "workers": .int(workers), "threads": .int(threads), "tasks": .array(tasks.map { .int($0) }),
            "seconds": .int(seconds), "warmup_seconds": .double(warmupSeconds), "keys": .int(keys), "zipf": .double(zipf), "value_size": .int(valueSize),
            "set_share": .double(setShare), "remove_share": .double(removeShare), "origin_us": .int(originUs),
            "bound_ms": .int(boundMs), "probe_interval_us": .int(probeIntervalUs),
            "single_flight_callers": .int(singleFlightCallers), "fault": .bool(fault),
            "server": .string(url.map(RedisBenchOptions.redacted) ?? (fault ? "private redis-server (appendonly yes, appendfsync always)" : "private redis-server (no persistence)")),
            "systems": .array(systems.map { .string($0) }), "drop_messages": .double(droppedMessages),
            "pubsub_echo": .bool(pubsubEcho), "own_write_probe_ms": .int(ownWriteProbeMs),
            "mixes": .array(runMixes.map { .string($0.rawValue) }), "mix_systems": .array(mixSystems.map { .string($0) }),
        ]
    }
}

/// An operation mix of `magpie-bench fleet` (`--mixes`): which share of the operations change a key.
/// Without changes, every system is as fast as its reads; with removals only, every change drops the
/// key in every instance (no new value to keep), the case a fleet cache pays the most for.
enum FleetMix: String, CaseIterable, ExpressibleByArgument, Sendable {
    /// `--set-share` sets and `--remove-share` removals.
    case standard = "default"
    case noChanges = "none"
    /// Removals only, as many as the default mix's changes.
    case removalsOnly = "removals"

    /// The mix of a result row (rows written before there were mixes are the default mix's).
    init(of row: BenchResult) {
        self = row.extra["mix"]?.stringValue.flatMap(FleetMix.init(rawValue:)) ?? .standard
    }

    /// Its label in tables: "default", "no changes", "removals only (3 %)".
    func label(removeShare: Double) -> String {
        switch self {
        case .standard: "default"
        case .noChanges: "no changes"
        case .removalsOnly: String(format: "removals only (%g %%)", 100 * removeShare)
        }
    }

    /// A row's label, from the shares it carries.
    static func label(of row: BenchResult) -> String {
        FleetMix(of: row).label(removeShare: row.extra["remove_share"]?.numberValue ?? 0)
    }
}

extension BenchResult {
    /// The system, and for a fleet row of another mix than the default its mix (report.html and
    /// `compare` name rows by it: the rows of one system and tasks value differ by their mix).
    var labeledSystem: String {
        guard extra["mix"] != nil, FleetMix(of: self) != .standard else { return system }
        return "\(system), \(FleetMix.label(of: self))"
    }
}

/// A fault of `--fault`'s timeline (`--faults`).
enum FleetFault: String, CaseIterable, ExpressibleByArgument {
    case pubsub, kill, pause, evict
}
