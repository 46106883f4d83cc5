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
//
// The same backend sums the timer `magpie_redis_stage_seconds` (every worker's clients run with
// `RedisConfiguration.recordsStages`, every system alike) by cause: where each round trip's time went,
// queued (the call until its connection's event loop handed it to the socket), server (until the loop
// decoded its reply) and resumed (until the awaiting task ran again). Recorded in that task after it
// resumed, so a store's stages are the store's.

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
        /// Nanoseconds by `Stage.rawValue`, and the round trips they were recorded for.
        var stages = [Int](repeating: 0, count: Stage.allCases.count)
        var staged = 0
    }

    /// The stages of `magpie_redis_stage_seconds`.
    enum Stage: Int, CaseIterable, Sendable {
        case queued, server, resumed
    }

    /// The one counter of this process (installed by `bootstrap`).
    static let shared = FleetRoundTrips()

    private final class Counts: Sendable {
        let operations = Atomic<Int>(0)
        let roundTrips = Atomic<Int>(0)
        let commands = Atomic<Int>(0)
        let queued = Atomic<Int>(0)
        let server = Atomic<Int>(0)
        let resumed = Atomic<Int>(0)
        let staged = Atomic<Int>(0)

        func stage(_ stage: Stage) -> Int {
            switch stage {
            case .queued: queued.load(ordering: .relaxed)
            case .server: server.load(ordering: .relaxed)
            case .resumed: resumed.load(ordering: .relaxed)
            }
        }
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

    func record(_ stage: Stage, nanoseconds: Int64) {
        let counts = counts[Self.cause.rawValue]
        switch stage {
        case .queued:
            counts.queued.add(Int(nanoseconds), ordering: .relaxed)
            counts.staged.add(1, ordering: .relaxed)
        case .server: counts.server.add(Int(nanoseconds), ordering: .relaxed)
        case .resumed: counts.resumed.add(Int(nanoseconds), ordering: .relaxed)
        }
    }

    /// The counts now, per cause.
    func snapshot() -> Snapshot {
        var snapshot: Snapshot = [:]
        for cause in Cause.allCases {
            let counts = counts[cause.rawValue]
            snapshot[cause] = Counted(
                operations: counts.operations.load(ordering: .relaxed), roundTrips: counts.roundTrips.load(ordering: .relaxed),
                commands: counts.commands.load(ordering: .relaxed), stages: Stage.allCases.map(counts.stage),
                staged: counts.staged.load(ordering: .relaxed))
        }
        return snapshot
    }

    /// The worker's report of the counts from `start` to `end` (two snapshots): `redis_operations_<cause>`,
    /// `redis_round_trips_<cause>` and `redis_commands_<cause>`, and the stages' sums
    /// (`redis_stage_<stage>_ns_<cause>`, over `redis_staged_<cause>` round trips) (the warm-up's left out).
    static func report(from start: Snapshot, to end: Snapshot) -> [String: JSONValue] {
        var line: [String: JSONValue] = [:]
        for cause in Cause.allCases where cause != .warmup {
            let (before, after) = (start[cause] ?? Counted(), end[cause] ?? Counted())
            line["redis_operations_\(cause)"] = .int(after.operations - before.operations)
            line["redis_round_trips_\(cause)"] = .int(after.roundTrips - before.roundTrips)
            line["redis_commands_\(cause)"] = .int(after.commands - before.commands)
            line["redis_staged_\(cause)"] = .int(after.staged - before.staged)
            for stage in Stage.allCases {
                line["redis_stage_\(stage)_ns_\(cause)"] = .int(after.stages[stage.rawValue] - before.stages[stage.rawValue])
            }
        }
        return line
    }
}

/// Counts `magpie_redis_commands_total` and sums `magpie_redis_stage_seconds` into
/// `FleetRoundTrips.shared`; every other metric is dropped.
private struct FleetCommandsFactory: MetricsFactory {
    private final class Commands: CounterHandler, Sendable {
        func increment(by amount: Int64) { FleetRoundTrips.shared.count(commands: amount) }
        func reset() {}
    }

    private final class Stages: TimerHandler, Sendable {
        let stage: FleetRoundTrips.Stage
        init(_ stage: FleetRoundTrips.Stage) { self.stage = stage }
        func recordNanoseconds(_ duration: Int64) { FleetRoundTrips.shared.record(stage, nanoseconds: duration) }
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        label == "magpie_redis_commands_total" ? Commands() : NOOPMetricsHandler.instance
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        NOOPMetricsHandler.instance
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        guard label == "magpie_redis_stage_seconds", let name = dimensions.first(where: { $0.0 == "stage" })?.1,
            let stage = FleetRoundTrips.Stage.allCases.first(where: { "\($0)" == name })
        else { return NOOPMetricsHandler.instance }
        return Stages(stage)
    }

    func destroyCounter(_ handler: any CounterHandler) {}
    func destroyRecorder(_ handler: any RecorderHandler) {}
    func destroyTimer(_ handler: any TimerHandler) {}
}
