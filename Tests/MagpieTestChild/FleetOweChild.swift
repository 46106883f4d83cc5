import ArgumentParser
import Foundation
import Magpie
import MagpieRedis

/// The fleet instance the journal test kills: opens a cache with a disk tier and a remote tier on a
/// Redis that is down, removes keys and a group (each owed, and journaled in the directory), prints
/// "owed <count>", then waits to be killed.
struct FleetOweChild: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet-owe-child", abstract: "Owe removals to an unreachable Redis, then wait to be killed.",
        shouldDisplay: true)

    @Option(help: "The cache directory.") var directory: String
    @Option(help: "The (stopped) Redis server's port.") var port: Int
    @Option(help: "The namespace.") var namespace = "fleet:"
    @Option(parsing: .upToNextOption, help: "Keys to remove.") var keys: [String] = []
    @Option(help: "A group to remove.") var group: String?

    func run() throws {
        var redis = RedisConfiguration(endpoints: [RedisEndpoint(host: "127.0.0.1", port: port)])
        redis.commandTimeout = .milliseconds(200)
        redis.connectTimeout = .milliseconds(200)
        let store = try RedisRemoteStore(.init(redis: redis, namespace: namespace))
        var configuration = Cache.Configuration(directory: directory, memoryBudget: 8 << 20, diskBudget: 64 << 20)
        configuration.metrics = nil
        configuration.remote = RemoteTierOptions(store: store)
        let cache = try Cache(configuration)
        for key in keys { try cache.removeValue(forKey: key) }
        if let group { try cache.removeAll(inGroup: group) }
        let line = Array("owed \(cache.statistics.remote?.owedRemovals ?? 0)\n".utf8)
        _ = line.withUnsafeBytes { write(1, $0.baseAddress!, $0.count) }  // unbuffered: the parent waits for it
        while true { sleep(60) }
    }
}
