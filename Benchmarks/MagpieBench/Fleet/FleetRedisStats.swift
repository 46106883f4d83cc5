import Foundation
import MagpieRedis
import NIOCore

// What Redis spent on a system's measured window: `INFO cpu commandstats` before and after it, on the
// bench's own connection.
//
// `commandstats` gives each command's calls and the microseconds Redis spent executing them. A command a
// script runs (`redis.call`) is counted under its own name too, and its time is inside the script's
// (`evalsha`): so a system's store figure sums the commands *its stores send* (`storeCommands`), never a
// script's and its inner commands both. What neither counts — reading the request, writing replies and
// the messages a `PUBLISH` fans out to subscribers — is in the process's CPU time (`used_cpu_user` +
// `used_cpu_sys`), reported beside them as the total.

/// One `INFO cpu commandstats` sample.
struct FleetRedisStats: Sendable, Equatable {
    struct Command: Sendable, Equatable {
        var calls: Int
        var usec: Int
    }

    var commands: [String: Command] = [:]
    /// The server process's CPU time (user + system), seconds.
    var cpuSeconds: Double = 0

    /// Parses the text of `INFO cpu commandstats` (`cmdstat_set:calls=…,usec=…,…`, `used_cpu_user:…`).
    init(info text: String) {
        for line in text.split(whereSeparator: \.isNewline) {
            if line.hasPrefix("cmdstat_"), let colon = line.firstIndex(of: ":") {
                let name = String(line[line.index(line.startIndex, offsetBy: 8)..<colon])
                var calls = 0
                var usec = 0
                for field in line[line.index(after: colon)...].split(separator: ",") {
                    let pair = field.split(separator: "=", maxSplits: 1)
                    guard pair.count == 2 else { continue }
                    if pair[0] == "calls" { calls = Int(pair[1]) ?? 0 }
                    if pair[0] == "usec" { usec = Int(pair[1]) ?? 0 }
                }
                commands[name] = Command(calls: calls, usec: usec)
            } else if line.hasPrefix("used_cpu_user:") || line.hasPrefix("used_cpu_sys:") {
                cpuSeconds += Double(line.split(separator: ":", maxSplits: 1).last ?? "") ?? 0
            }
        }
    }

    init() {}

    /// `later − earlier`, per command (a counter that went down was reset: the server restarted).
    static func - (later: FleetRedisStats, earlier: FleetRedisStats) -> FleetRedisStats {
        var delta = FleetRedisStats()
        for (name, after) in later.commands {
            let before = earlier.commands[name] ?? Command(calls: 0, usec: 0)
            delta.commands[name] = Command(
                calls: max(0, after.calls - before.calls), usec: max(0, after.usec - before.usec))
        }
        delta.cpuSeconds = max(0, later.cpuSeconds - earlier.cpuSeconds)
        return delta
    }

    static func + (a: FleetRedisStats, b: FleetRedisStats) -> FleetRedisStats {
        var sum = a
        for (name, command) in b.commands {
            let mine = sum.commands[name] ?? Command(calls: 0, usec: 0)
            sum.commands[name] = Command(calls: mine.calls + command.calls, usec: mine.usec + command.usec)
        }
        sum.cpuSeconds += b.cpuSeconds
        return sum
    }

    /// The commands a system's stores (sets, removals, fills) send at the top level: what its store
    /// figure sums. Magpie's stores are scripts (`evalsha`, `eval` when the server lacks the script),
    /// whose time includes every command they run; its lease `SET NX` is a load's (shown per command).
    static func storeCommands(of system: String) -> [String] {
        switch system {
        case "magpie-fleet": return ["evalsha", "eval"]
        case "redis-cache-aside": return ["set", "del"]
        case "local-pubsub": return ["set", "del", "publish"]
        default: return []
        }
    }

    /// The commands whose `usec_per_call` the report shows flat (`redis_usec_per_call_<command>`).
    static let shownCommands = ["evalsha", "eval", "set", "publish", "spublish", "del", "get"]

    /// The figures of a window (this is its delta) in which the system made `stores` writes to Redis
    /// and served `operations` operations.
    func extra(system: String, stores: Int, operations: Int) -> [String: JSONValue] {
        var extra: [String: JSONValue] = [:]
        var table: [String: JSONValue] = [:]
        for (name, command) in commands where command.calls > 0 {
            table[name] = .object([
                "calls": .int(command.calls), "usec": .int(command.usec),
                "usec_per_call": .double(Double(command.usec) / Double(command.calls)),
            ])
        }
        extra["redis_commands"] = .object(table)
        for name in Self.shownCommands {
            if let command = commands[name], command.calls > 0 {
                extra["redis_usec_per_call_\(name)"] = .double(Double(command.usec) / Double(command.calls))
            }
        }
        let storeCommands = Self.storeCommands(of: system)
        let storeUsec = storeCommands.reduce(0) { $0 + (commands[$1]?.usec ?? 0) }
        extra["redis_store_commands"] = .array(storeCommands.map { .string($0) })
        extra["redis_store_usec"] = .int(storeUsec)
        extra["redis_stores"] = .int(stores)
        if stores > 0 { extra["redis_store_usec_per_store"] = .double(Double(storeUsec) / Double(stores)) }
        extra["redis_cpu_seconds"] = .double(cpuSeconds)
        if operations > 0 { extra["redis_cpu_us_per_op"] = .double(cpuSeconds * 1e6 / Double(operations)) }
        extra["redis_gets"] = .int(commands["get"]?.calls ?? 0)
        return extra
    }
}

/// Samples a server's `INFO cpu commandstats` on a connection of its own.
final class FleetRedisSampler: Sendable {
    let client: RedisClient

    init(url: String) throws {
        var configuration = try RedisConfiguration(url: url)
        configuration.commandTimeout = .seconds(2)
        configuration.connectTimeout = .milliseconds(500)
        configuration.reconnect.maximum = .milliseconds(250)
        client = try RedisClient(configuration)
    }

    /// The server's counters now; nil when it does not answer (down, paused past the timeout).
    func sample() async -> FleetRedisStats? {
        guard let reply = try? await client.send(RedisCommand("INFO", ["cpu", "commandstats"])) else { return nil }
        switch reply {
        case .bulkString(let buffer), .verbatimString(_, let buffer):
            return FleetRedisStats(info: String(decoding: buffer.readableBytesView, as: UTF8.self))
        default:
            return nil
        }
    }

    /// The counters at `instant` (monotonic ns; now if it has passed).
    func sample(at instant: Int64) async -> FleetRedisStats? {
        let remaining = instant - monotonicNanoseconds()
        if remaining > 0 { try? await Task.sleep(for: .nanoseconds(remaining)) }
        return await sample()
    }

    func close() async { await client.shutdown() }
}
