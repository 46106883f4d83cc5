import MagpieTestSupport
import NIOCore
import Testing

@testable import MagpieRedis

/// The connection's submission queue (SubmissionQueue.swift): many callers on other threads, and callers
/// on the connection's own event loop, sharing one connection.
@Suite("One connection's submission queue against a real redis-server", .timeLimit(.minutes(1)))
struct RedisSubmissionTests {
    /// Runs `body` with the one connection of a one-connection client of a fresh server.
    private func withOneConnection(_ body: (RedisConnection) async throws -> Void) async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port) { $0.pool.maximumConnections = 1 })
            defer { Task { await redis.shutdown() } }
            try await body(try await redis.connection())
        }
    }

    @Test("256 tasks on the global executor and 16 on the event loop, one connection: every reply is the caller's own")
    func manyCallersOneConnection() async throws {
        try await withOneConnection { connection in
            let executor = RedisEventLoopExecutor(connection.eventLoop)
            let rounds = 30
            try await withThrowingTaskGroup(of: Void.self) { group in
                for task in 0..<272 {
                    // The last 16 run on the loop: their commands are written inline, after whatever the
                    // other tasks queued before them.
                    let preference: (any TaskExecutor)? = task >= 256 ? executor : nil
                    group.addTask(executorPreference: preference) {
                        for round in 0..<rounds {
                            let key = "s:\(task)"
                            let value = "\(key):\(round)"
                            if round % 3 == 2 {
                                // A batch: its replies come back together, in order.
                                let replies = try await connection.send(
                                    batch: [.set(key, Array(value.utf8)), .get(key), RedisCommand("INCR", [.string("n:\(task)")], keyIndices: [0])],
                                    timeout: .seconds(10))
                                #expect(replies.count == 3)
                                #expect(replies.first == .simpleString("OK"))
                                #expect(replies.dropFirst().first?.string == value)
                                #expect(replies.last == .integer(Int64(round + 1)))
                            } else {
                                _ = try await connection.send(.set(key, Array(value.utf8)), timeout: .seconds(10))
                                #expect(try await connection.send(.get(key), timeout: .seconds(10)).string == value)
                                let count = try await connection.send(RedisCommand("INCR", [.string("n:\(task)")], keyIndices: [0]), timeout: .seconds(10))
                                #expect(count == .integer(Int64(round + 1)))
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            // Nothing is left counted in flight, and every command went over this one connection.
            #expect(connection.inFlight == 0)
            #expect(connection.counters.sent.load(ordering: .relaxed) >= UInt64(272 * rounds * 3))
        }
    }

    @Test("a connection closed while hundreds of tasks submit: each gets a reply or an error, none waits forever")
    func closeWhileSubmitting() async throws {
        try await withOneConnection { connection in
            // Each task sends until a call fails (at most 10,000 times: far more than the 20 ms before the
            // close lets through), so every task sees the close.
            let outcomes = try await withThrowingTaskGroup(of: (replies: Int, errors: Int).self) { group in
                for task in 0..<256 {
                    group.addTask {
                        var replies = 0
                        for round in 0..<10_000 {
                            do {
                                _ = try await connection.send(.set("c:\(task)", Array("\(round)".utf8)), timeout: .seconds(30))
                                replies += 1
                            } catch let error as RedisError {
                                #expect([.shutDown, .connectionClosed].contains(error.code), "\(error)")
                                return (replies, 1)
                            }
                        }
                        return (replies, 0)
                    }
                }
                group.addTask {
                    try await Task.sleep(for: .milliseconds(20))
                    connection.close(reason: "closed by the test")
                    return (0, 0)
                }
                var total = (replies: 0, errors: 0)
                for try await outcome in group {
                    total.replies += outcome.replies
                    total.errors += outcome.errors
                }
                return total
            }
            // Every call ended (the time limit would catch one that waits forever): each task's last with
            // the close's error, after its replies.
            #expect(outcomes.errors == 256)
            #expect(connection.inFlight == 0)
        }
    }

    @Test("a round trip's stage instants (RedisConfiguration.recordsStages): written, then replied, within the call; a batch's at its last reply")
    func stageInstants() async throws {
        try await withOneConnection { connection in
            // BLPOP on an absent list holds the reply 50 ms at the server: the time must land in the server
            // stage (written → replied). (The queue and the resumption are not bounded here: under the full
            // suite's load on 2 cores a resumption took over 45 ms.)
            for batch in [false, true] {
                let stages = CommandStages()
                let before = NIODeadline.now().uptimeNanoseconds
                let blpop = RedisCommand("BLPOP", [.string("absent:\(batch)"), .string("0.05")], keyIndices: [0])
                if batch {
                    let replies = try await connection.sendRaw(
                        batch: [RedisCommand.set("s", Array("v".utf8)).encoded, blpop.encoded], timeout: .seconds(5), stages: stages)
                    #expect(replies.count == 2)
                } else {
                    _ = try await connection.sendRaw(blpop.encoded, timeout: .seconds(5), stages: stages)
                }
                let after = NIODeadline.now().uptimeNanoseconds
                let (written, replied) = (stages.written.load(ordering: .relaxed), stages.replied.load(ordering: .relaxed))
                #expect(before <= written && written <= replied && replied <= after, "\(before) \(written) \(replied) \(after)")
                #expect(replied - written >= 45_000_000, "the server held the reply 50 ms: \(replied - written) ns")
            }
            // Without stages nothing is taken, and the call is the same.
            #expect(try await connection.send(.get("s"), timeout: .seconds(5)).string == "v")
        }
    }
}
