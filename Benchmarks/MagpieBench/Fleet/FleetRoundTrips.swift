import CoreMetrics
import Synchronization

// Redis round trips per operation kind, counted in the worker's own clients.
//
// Every MagpieRedis client (Magpie's `RedisRemoteStore`, the cache-aside's and the hand-built pattern's
// `RedisClient`) increments the swift-metrics counter `magpie_redis_commands_total` once per round
// trip on its connection pool, by the number of commands the round trip carried, from the task that
// awaited the reply. The worker bootstraps a metrics backend that counts those increments by the
// task-local `FleetRoundTrips.cause` the caller sets around each read, set and removal: a command is
// the operation's when its task, or a task it started (`Task {}` inherits task-locals), sent it.
// Commands from the systems' long-lived tasks (Magpie's heartbeats and owed removals, a subscriber's
// reconnects) count as background; the subscriber connections' own commands (SUBSCRIBE) are not sent
// through a pool and are not counted. Unlike Redis's `INFO commandstats` (FleetRedisStats.swift),
// which sees the whole fleet's commands by name, this splits them by the operation that caused them
// in a mixed run, and never counts a script's inner commands.

/// Round trips and commands per cause, counted since the worker started.
final class FleetRoundTrips: Sendable {
    /// What a round trip was sent for: the caller's operation whose task sent it, else background.
    enum Cause: Int, CaseIterable, Sendable {
        case background, read, set, removal, probe
    }

    /// The operation the current task runs (`.background` outside the callers' operations).
    @TaskLocal static var cause = Cause.background

    typealias Snapshot = [Cause: (roundTrips: Int, commands: Int)]

    /// The one counter of this process (installed by `bootstrap`).
    static let shared = FleetRoundTrips()

    private final class Counts: Sendable {
        let roundTrips = Atomic<Int>(0)
        let commands = Atomic<Int>(0)
    }

    /// By `Cause.rawValue`.
    private let counts = Cause.allCases.map { _ in Counts() }

    /// Installs the counting backend for this process (a worker, once, before any client is made).
    static func bootstrap() { MetricsSystem.bootstrap(FleetCommandsFactory()) }

    func count(commands count: Int64) {
        let counts = counts[Self.cause.rawValue]
        counts.roundTrips.add(1, ordering: .relaxed)
        counts.commands.add(Int(count), ordering: .relaxed)
    }

    /// The counts now, per cause: (round trips, commands).
    func snapshot() -> Snapshot {
        var snapshot: Snapshot = [:]
        for cause in Cause.allCases {
            let counts = counts[cause.rawValue]
            snapshot[cause] = (counts.roundTrips.load(ordering: .relaxed), counts.commands.load(ordering: .relaxed))
        }
        return snapshot
    }

    /// The worker's report of the window from `start` to `end` (two snapshots):
    /// `redis_round_trips_<cause>` and `redis_commands_<cause>`.
    static func report(from start: Snapshot, to end: Snapshot) -> [String: JSONValue] {
        var line: [String: JSONValue] = [:]
        for cause in Cause.allCases {
            let (before, after) = (start[cause] ?? (0, 0), end[cause] ?? (0, 0))
            line["redis_round_trips_\(cause)"] = .int(after.roundTrips - before.roundTrips)
            line["redis_commands_\(cause)"] = .int(after.commands - before.commands)
        }
        return line
    }
}

/// Counts `magpie_redis_commands_total` into `FleetRoundTrips.shared`; every other metric is dropped.
private struct FleetCommandsFactory: MetricsFactory {
    private final class Commands: CounterHandler, Sendable {
        func increment(by amount: Int64) { FleetRoundTrips.shared.count(commands: amount) }
        func reset() {}
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        label == "magpie_redis_commands_total" ? Commands() : NOOPMetricsHandler.instance
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        NOOPMetricsHandler.instance
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler { NOOPMetricsHandler.instance }

    func destroyCounter(_ handler: any CounterHandler) {}
    func destroyRecorder(_ handler: any RecorderHandler) {}
    func destroyTimer(_ handler: any TimerHandler) {}
}
