import CoreMetrics
import Synchronization

// Redis round trips per operation kind, counted in the worker's own clients.
//
// Every MagpieRedis client (Magpie's `RedisRemoteStore`, the cache-aside's and the hand-built pattern's
// `RedisClient`) increments the swift-metrics counter `magpie_redis_commands_total` once per round
// trip on its connection pool, by the number of commands the round trip carried, from the task that
// awaited the reply. The worker bootstraps a metrics backend that counts those increments by the
// task-local `FleetRoundTrips.cause` the callers bind around each measured read, set and removal
// (`run`), which also counts the operations themselves, failed ones included: a command is the
// operation's when its task, or a task it started (`Task {}` inherits task-locals), sent it, whenever
// it returns, so round trips per operation are exact for the measured operations, in a mixed
// concurrent run. (Redis's `INFO commandstats`, FleetRedisStats.swift, sees the whole fleet's commands
// by name only: Magpie's sets and removals are both `evalsha`.) Commands from the systems' long-lived
// tasks (Magpie's heartbeats and owed removals, a subscriber's reconnects) count as background; the
// subscriber connections' own commands (SUBSCRIBE) are not sent through a pool and are not counted.

/// Round trips and commands per cause, counted since the worker started.
final class FleetRoundTrips: Sendable {
    /// What a round trip was sent for: the caller's operation whose task sent it, else background.
    enum Cause: Int, CaseIterable, Sendable {
        case background, read, set, removal, probe
        /// The callers' operations during the warm-up (not measured).
        case warmup
    }

    /// The operation the current task runs (`.background` outside the callers' operations).
    @TaskLocal static var cause = Cause.background

    typealias Snapshot = [Cause: Counted]

    struct Counted {
        var operations = 0
        var roundTrips = 0
        var commands = 0
    }

    /// The one counter of this process (installed by `bootstrap`).
    static let shared = FleetRoundTrips()

    private final class Counts: Sendable {
        let operations = Atomic<Int>(0)
        let roundTrips = Atomic<Int>(0)
        let commands = Atomic<Int>(0)
    }

    /// By `Cause.rawValue`.
    private let counts = Cause.allCases.map { _ in Counts() }

    /// Installs the counting backend for this process (a worker, once, before any client is made).
    static func bootstrap() { MetricsSystem.bootstrap(FleetCommandsFactory()) }

    /// Runs a caller's operation of kind `cause` (read, set, removal), counted with its round trips when
    /// `measured` (else as the warm-up's).
    static func run<R>(_ cause: Cause, measured: Bool, _ operation: () async throws -> R) async rethrows -> R {
        let cause = measured ? cause : .warmup
        shared.counts[cause.rawValue].operations.add(1, ordering: .relaxed)
        return try await $cause.withValue(cause) { try await operation() }
    }

    /// `run` for the thread callers: a task the operation starts (`FleetInstance.blocking`) inherits the
    /// cause bound on the thread.
    static func runBlocking<R>(_ cause: Cause, measured: Bool, _ operation: () throws -> R) rethrows -> R {
        let cause = measured ? cause : .warmup
        shared.counts[cause.rawValue].operations.add(1, ordering: .relaxed)
        return try $cause.withValue(cause) { try operation() }
    }

    func count(commands count: Int64) {
        let counts = counts[Self.cause.rawValue]
        counts.roundTrips.add(1, ordering: .relaxed)
        counts.commands.add(Int(count), ordering: .relaxed)
    }

    /// The counts now, per cause.
    func snapshot() -> Snapshot {
        var snapshot: Snapshot = [:]
        for cause in Cause.allCases {
            let counts = counts[cause.rawValue]
            snapshot[cause] = Counted(
                operations: counts.operations.load(ordering: .relaxed), roundTrips: counts.roundTrips.load(ordering: .relaxed),
                commands: counts.commands.load(ordering: .relaxed))
        }
        return snapshot
    }

    /// The worker's report of the counts from `start` to `end` (two snapshots): `redis_operations_<cause>`,
    /// `redis_round_trips_<cause>` and `redis_commands_<cause>` (the warm-up's left out).
    static func report(from start: Snapshot, to end: Snapshot) -> [String: JSONValue] {
        var line: [String: JSONValue] = [:]
        for cause in Cause.allCases where cause != .warmup {
            let (before, after) = (start[cause] ?? Counted(), end[cause] ?? Counted())
            line["redis_operations_\(cause)"] = .int(after.operations - before.operations)
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
