import MagpieTestSupport
import NIOCore
import Testing

@testable import MagpieRedis

/// The next event of a stream, or nil after `timeout`.
func next<Event: Sendable>(_ iterator: inout AsyncStream<Event>.Iterator, timeout: Duration = .seconds(5)) async -> Event? {
    let box = IteratorBox(iterator)
    let event = await withTaskGroup(of: Event?.self) { group in
        group.addTask { await box.next() }
        group.addTask {
            try? await Task.sleep(for: timeout)
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
    iterator = box.iterator
    return event
}

/// Lets a task group iterate an AsyncStream's iterator (only one task touches it at a time).
private final class IteratorBox<Event: Sendable>: @unchecked Sendable {
    var iterator: AsyncStream<Event>.Iterator
    init(_ iterator: AsyncStream<Event>.Iterator) { self.iterator = iterator }
    func next() async -> Event? { await iterator.next() }
}

@Suite("Subscriptions and CLIENT TRACKING", .serialized, .timeLimit(.minutes(1)))
struct RedisSubscriberTests {
    @Test("SUBSCRIBE, PSUBSCRIBE and SSUBSCRIBE deliver messages")
    func pubSub() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            let subscriber = redis.makeSubscriber()
            var plain = try await subscriber.subscribe(to: ["news"]).makeAsyncIterator()
            var pattern = try await subscriber.subscribe(toPatterns: ["sport.*"]).makeAsyncIterator()
            var shard = try await subscriber.subscribe(toShardChannels: ["orders"]).makeAsyncIterator()
            #expect(try await redis.publish(Array("hello".utf8), to: "news") == 1)
            #expect(try await redis.publish(Array("goal".utf8), to: "sport.football") == 1)
            #expect(try await redis.spublish(Array("order-1".utf8), to: "orders") == 1)
            #expect(await next(&plain) == .message(RedisPubSubMessage(channel: "news", pattern: nil, payload: ByteBuffer(string: "hello"))))
            #expect(await next(&pattern) == .message(RedisPubSubMessage(channel: "sport.football", pattern: "sport.*", payload: ByteBuffer(string: "goal"))))
            #expect(await next(&shard) == .message(RedisPubSubMessage(channel: "orders", pattern: nil, payload: ByteBuffer(string: "order-1"))))
            await subscriber.close()
            #expect(await next(&plain) == nil)  // the stream ended
            await redis.shutdown()
        }
    }

    @Test("a refused SUBSCRIBE (ACL NOPERM) fails its caller only: a concurrent CLIENT TRACKING and the connection carry on")
    func refusedSubscription() async throws {
        try await withRedisServer { server in
            _ = try server.cli(["ACL", "SETUSER", "limited", "on", ">limited-pass", "~*", "resetchannels", "&allowed*", "+@all"])
            let redis = try RedisClient(testConfiguration(port: server.port) {
                $0.username = "limited"
                $0.password = "limited-pass"
            })
            let subscriber = redis.makeSubscriber()
            var allowed = try await subscriber.subscribe(to: ["allowed.news"]).makeAsyncIterator()
            let connectionID = try #require(subscriber.clientID)
            for _ in 0..<10 {
                // The refusal and the tracking reply arrive back to back: each must reach its own caller.
                async let refused: Void = { _ = try await subscriber.subscribe(to: ["forbidden"]) }()
                async let tracking = subscriber.track(RedisTrackingOptions(prefixes: ["app:"]))
                do {
                    try await refused
                    Issue.record("a forbidden channel was subscribed")
                } catch let error as RedisError {
                    #expect(error.serverError?.kind == .noPerm, "\(error)")
                }
                _ = try await tracking
            }
            #expect(subscriber.clientID == connectionID, "the connection was replaced")
            #expect(try await redis.publish(Array("still here".utf8), to: "allowed.news") == 1)
            #expect(await next(&allowed) == .message(RedisPubSubMessage(channel: "allowed.news", pattern: nil, payload: ByteBuffer(string: "still here"))))
            await subscriber.close()
            await redis.shutdown()
        }
    }

    @Test("a stream ended and a new one on the same channel at once: the new one still hears the channel")
    func unsubscribeThenSubscribe() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            let subscriber = redis.makeSubscriber()
            for round in 0..<20 {
                let old = try await subscriber.subscribe(to: ["race"])
                let consumer = Task { for await _ in old {} }
                consumer.cancel()  // ends the old stream: its UNSUBSCRIBE races the next SUBSCRIBE
                var fresh = try await subscriber.subscribe(to: ["race"]).makeAsyncIterator()
                _ = await consumer.value
                #expect(try await redis.publish(Array("round \(round)".utf8), to: "race") >= 1)
                #expect(await next(&fresh) == .message(RedisPubSubMessage(channel: "race", pattern: nil, payload: ByteBuffer(string: "round \(round)"))))
            }
            await subscriber.close()
            await redis.shutdown()
        }
    }

    @Test("BCAST tracking on a prefix: changes by another client (and redis-cli) arrive as invalidations; FLUSHALL as all")
    func trackingPushes() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            let subscriber = redis.makeSubscriber()
            var invalidations = try await subscriber.track(RedisTrackingOptions(prefixes: ["app:"])).makeAsyncIterator()
            try await redis.set("other:1", Array("x".utf8))  // outside the prefix: not reported
            try await redis.set("app:1", Array("x".utf8))
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:1")]))
            _ = try server.cli(["DEL", "app:1"])
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:1")]))
            _ = try server.cli(["SET", "app:2", "v", "PX", "50"])  // set, then expired by the server
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:2")]))
            try await eventually(timeout: .seconds(3)) { try await redis.get("app:2") == nil }
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:2")]))
            _ = try server.cli(["FLUSHALL"])
            #expect(await next(&invalidations) == .all)
            await subscriber.close()
            await redis.shutdown()
        }
    }

    @Test("REDIRECT with NOLOOP: a data connection's own writes are not reported, others' are")
    func redirectNoLoop() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port) { $0.pool.maximumConnections = 1 })
            let subscriber = redis.makeSubscriber()
            var invalidations = try await subscriber.track(RedisTrackingOptions(prefixes: ["none-such:"])).makeAsyncIterator()
            let target = try #require(subscriber.clientID)
            let data = try await redis.connection()
            _ = try await data.send(.clientTracking(true, options: RedisTrackingOptions(prefixes: ["k:"], noLoop: true), redirect: target), timeout: .seconds(2))
            _ = try await data.send(.set("k:mine", Array("1".utf8)), timeout: .seconds(2))
            _ = try server.cli(["SET", "k:theirs", "2"])
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "k:theirs")]))
            await subscriber.close()
            await redis.shutdown()
        }
    }

    @Test("a dropped tracking connection is reported, tracking and subscriptions come back by themselves")
    func droppedConnection() async throws {
        try await withRedisServer { server in
            let redis = try RedisClient(testConfiguration(port: server.port))
            let subscriber = redis.makeSubscriber()
            var invalidations = try await subscriber.track(RedisTrackingOptions(prefixes: ["app:"])).makeAsyncIterator()
            var messages = try await subscriber.subscribe(to: ["news"]).makeAsyncIterator()
            let firstID = try #require(subscriber.clientID)
            _ = try server.cli(["CLIENT", "KILL", "ID", "\(firstID)"])
            guard case .lost? = await next(&invalidations) else { Issue.record("no loss reported"); return }
            guard case .restored(let newID)? = await next(&invalidations) else { Issue.record("not restored"); return }
            #expect(newID != firstID && newID != 0)
            guard case .lost? = await next(&messages) else { Issue.record("subscription loss not reported"); return }
            #expect(await next(&messages) == .restored)
            try await redis.set("app:after", Array("x".utf8))
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:after")]))
            _ = try await redis.publish(Array("again".utf8), to: "news")
            #expect(await next(&messages) == .message(RedisPubSubMessage(channel: "news", pattern: nil, payload: ByteBuffer(string: "again"))))

            // The server itself goes away and comes back on the same port.
            server.kill()
            guard case .lost? = await next(&invalidations) else { Issue.record("no loss on kill"); return }
            try server.restart()
            guard case .restored? = await next(&invalidations, timeout: .seconds(10)) else { Issue.record("not restored after restart"); return }
            // The data pool learns of the restart on its own schedule: its first command may still meet
            // the killed connection.
            try await eventually(timeout: .seconds(5)) { (try? await redis.set("app:restarted", Array("x".utf8))) != nil }
            // The pool may report its own reconnect first; the invalidation must come.
            #expect(await next(&invalidations) == .keys([ByteBuffer(string: "app:restarted")]))
            await subscriber.close()
            await redis.shutdown()
        }
    }
}
