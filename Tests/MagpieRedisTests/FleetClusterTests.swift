import Glibc
import Magpie
import MagpieTestSupport
import Synchronization
import Testing

@testable import MagpieRedis

/// A fleet cache on a Redis Cluster: one tracking connection and heartbeat per master.
func fleetClusterCache(_ cluster: RedisClusterProcess) throws -> Cache {
    var redis = RedisConfiguration(endpoints: cluster.nodes.map { RedisEndpoint(host: $0.host, port: $0.port) })
    redis.connectTimeout = .seconds(2)
    redis.commandTimeout = .seconds(2)
    let store = try RedisRemoteStore(.init(redis: redis, namespace: "fleet:", cluster: true, heartbeatInterval: .milliseconds(20)))
    var configuration = Cache.Configuration(memoryBudget: 8 << 20)
    configuration.metrics = nil
    configuration.remote = RemoteTierOptions(store: store)
    return try Cache(configuration)
}

@Suite("Fleet on a 3-master cluster", .serialized, .timeLimit(.minutes(2)))
struct FleetClusterTests {
    @Test("coherent across masters; a live reshard under writes loses nothing")
    func clusterCoherenceAndReshard() async throws {
        try await withRedisCluster(masters: 3) { cluster in
            let a = try fleetClusterCache(cluster)
            let b = try fleetClusterCache(cluster)
            defer { try? a.close(); try? b.close() }
            try await offloaded {
                try waitConfirmed(a)
                try waitConfirmed(b)
                // Keys on every master: each change reaches the other instance.
                for i in 0..<30 { try a.set(Array("v1-\(i)".utf8), forKey: "key:\(i)") }
                for i in 0..<30 { #expect(text(try b.value(forKey: "key:\(i)")) == "v1-\(i)") }
                for i in 0..<30 { try a.set(Array("v2-\(i)".utf8), forKey: "key:\(i)") }
                #expect(try pollUntil { try (0..<30).allSatisfy { text(try b.value(forKey: "key:\($0)")) == "v2-\($0)" } } != nil)
            }
            // A reshard moves a third of the slots (and their keys) while a keeps writing and b reading.
            let source = cluster.nodes[0]
            let destination = cluster.nodes[1]
            let reshard = try await offloaded { try cluster.startReshard(from: source, to: destination, slots: 300, pipeline: 20) }
            let last = try await offloaded { () -> [Int: Int] in
                var last: [Int: Int] = [:]
                var version = 3
                let start = ContinuousClock.now
                while reshard.isRunning || ContinuousClock.now - start < .seconds(1) {
                    for i in 0..<30 {
                        try a.set(Array("v\(version)-\(i)".utf8), forKey: "key:\(i)")
                        last[i] = version
                        if let seen = text(try b.value(forKey: "key:\(i)")) {
                            #expect(seen.hasSuffix("-\(i)"), "a value of another key: \(seen)")
                        }
                    }
                    version += 1
                    if ContinuousClock.now - start > .seconds(60) { break }
                }
                return last
            }
            try await reshard.finished()
            try await offloaded {
                let converged = try pollUntil {
                    try (0..<30).allSatisfy { text(try b.value(forKey: "key:\($0)")) == "v\(last[$0]!)-\($0)" }
                }
                #expect(converged != nil)
                #expect(a.statistics.remote?.errors == 0)
                #expect(a.statistics.remote?.owedRemovals == 0)
            }
        }
    }
}
