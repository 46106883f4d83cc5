import CoreMetrics
import NIOCore
import Synchronization

/// swift-metrics instruments of one node (dimension `node` = `host:port`):
/// `magpie_redis_commands_total`, `magpie_redis_errors_total` (dimension `code`),
/// `magpie_redis_command_duration_seconds` (a timer: the latency histogram in the backend),
/// `magpie_redis_reconnects_total`, `magpie_redis_connections` and `magpie_redis_breaker_open`
/// (1 while the node's breaker is open); with ``RedisConfiguration/recordsStages``, the timer
/// `magpie_redis_stage_seconds` (dimension `stage`: `queued`, `server`, `resumed`), recorded once per
/// round trip in the task that awaited it.
struct RedisNodeMetrics: Sendable {
    let commands: Counter
    let timeouts: Counter
    let serverErrors: Counter
    let connectionErrors: Counter
    let breakerRejections: Counter
    let duration: Timer
    let reconnects: Counter
    let connections: Gauge
    let breakerOpen: Gauge
    let queued: Timer
    let server: Timer
    let resumed: Timer

    init(endpoint: RedisEndpoint) {
        let node = [("node", endpoint.description)]
        commands = Counter(label: "magpie_redis_commands_total", dimensions: node)
        timeouts = Counter(label: "magpie_redis_errors_total", dimensions: node + [("code", "timedOut")])
        serverErrors = Counter(label: "magpie_redis_errors_total", dimensions: node + [("code", "server")])
        connectionErrors = Counter(label: "magpie_redis_errors_total", dimensions: node + [("code", "connection")])
        breakerRejections = Counter(label: "magpie_redis_errors_total", dimensions: node + [("code", "circuitOpen")])
        duration = Timer(label: "magpie_redis_command_duration_seconds", dimensions: node, preferredDisplayUnit: .microseconds)
        reconnects = Counter(label: "magpie_redis_reconnects_total", dimensions: node)
        connections = Gauge(label: "magpie_redis_connections", dimensions: node)
        breakerOpen = Gauge(label: "magpie_redis_breaker_open", dimensions: node)
        func stage(_ name: String) -> Timer {
            Timer(label: "magpie_redis_stage_seconds", dimensions: node + [("stage", name)], preferredDisplayUnit: .microseconds)
        }
        (queued, server, resumed) = (stage("queued"), stage("server"), stage("resumed"))
    }

    /// Records where a round trip that began at `start` and resumed its caller at `now` spent its time,
    /// from the instants its connection's loop took (nothing when it took none: the call failed before
    /// it was written, or before its reply).
    func record(_ stages: CommandStages, start: NIODeadline, now: NIODeadline) {
        let (written, replied) = (stages.written.load(ordering: .relaxed), stages.replied.load(ordering: .relaxed))
        let (started, ended) = (start.uptimeNanoseconds, now.uptimeNanoseconds)
        guard written >= started, replied >= written, ended >= replied else { return }
        queued.recordNanoseconds(Int64(written - started))
        server.recordNanoseconds(Int64(replied - written))
        resumed.recordNanoseconds(Int64(ended - replied))
    }

    func record(error: RedisError) {
        switch error.code {
        case .timedOut: timeouts.increment()
        case .server: serverErrors.increment()
        case .circuitOpen: breakerRejections.increment()
        default: connectionErrors.increment()
        }
    }
}

/// The instants a connection's event loop took for one round trip (``RedisConfiguration/recordsStages``):
/// when it handed the command to the channel, and when it decoded the reply that resumes the caller (a
/// batch's last). Stored on the loop, read by the caller after the reply resumed it (the resumption
/// orders them; relaxed atomics keep the type `Sendable` without a lock). 0: not taken.
final class CommandStages: Sendable {
    let written = Atomic<UInt64>(0)
    let replied = Atomic<UInt64>(0)

    func noteWritten() { written.store(NIODeadline.now().uptimeNanoseconds, ordering: .relaxed) }
    func noteReplied() { replied.store(NIODeadline.now().uptimeNanoseconds, ordering: .relaxed) }
}

/// Counts a client keeps for its callers and tests (all nodes together).
public struct RedisClientStatistics: Sendable, Hashable {
    /// Commands sent (a batch counts each command).
    public var commands: UInt64 = 0
    /// Calls that failed because a command's deadline passed.
    public var timeouts: UInt64 = 0
    /// Calls failed at once by an open breaker.
    public var breakerRejections: UInt64 = 0
    /// Calls failed at once with `LOADING` while the server said it was loading its data set
    /// (``RedisConfiguration/Breaker/loadingHold``).
    public var loadingRejections: UInt64 = 0
    /// Connections opened after the first (reconnections).
    public var reconnects: UInt64 = 0
    /// Connection attempts that failed (refused, timed out, handshake failed).
    public var connectFailures: UInt64 = 0
    /// Times a breaker opened.
    public var breakerOpenings: UInt64 = 0
    /// MOVED replies followed (cluster).
    public var movedRedirections: UInt64 = 0
    /// ASK replies followed (cluster).
    public var askRedirections: UInt64 = 0
    /// TRYAGAIN / CLUSTERDOWN / LOADING retries (cluster).
    public var retries: UInt64 = 0
    /// Slot-map refreshes (cluster).
    public var topologyRefreshes: UInt64 = 0
}

/// The atomic counters behind ``RedisClientStatistics``, shared by a client's pools.
final class RedisCounters: Sendable {
    let commands = Atomic<UInt64>(0)
    let timeouts = Atomic<UInt64>(0)
    let breakerRejections = Atomic<UInt64>(0)
    let loadingRejections = Atomic<UInt64>(0)
    let reconnects = Atomic<UInt64>(0)
    let connectFailures = Atomic<UInt64>(0)
    let breakerOpenings = Atomic<UInt64>(0)
    let movedRedirections = Atomic<UInt64>(0)
    let askRedirections = Atomic<UInt64>(0)
    let retries = Atomic<UInt64>(0)
    let topologyRefreshes = Atomic<UInt64>(0)

    var snapshot: RedisClientStatistics {
        var s = RedisClientStatistics()
        s.commands = commands.load(ordering: .relaxed)
        s.timeouts = timeouts.load(ordering: .relaxed)
        s.breakerRejections = breakerRejections.load(ordering: .relaxed)
        s.loadingRejections = loadingRejections.load(ordering: .relaxed)
        s.reconnects = reconnects.load(ordering: .relaxed)
        s.connectFailures = connectFailures.load(ordering: .relaxed)
        s.breakerOpenings = breakerOpenings.load(ordering: .relaxed)
        s.movedRedirections = movedRedirections.load(ordering: .relaxed)
        s.askRedirections = askRedirections.load(ordering: .relaxed)
        s.retries = retries.load(ordering: .relaxed)
        s.topologyRefreshes = topologyRefreshes.load(ordering: .relaxed)
        return s
    }
}
