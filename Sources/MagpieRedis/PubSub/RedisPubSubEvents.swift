import NIOCore

/// A message received on a subscription.
public struct RedisPubSubMessage: Sendable, Hashable {
    /// The channel it was published to.
    public var channel: String
    /// The pattern that matched, for `PSUBSCRIBE`.
    public var pattern: String?
    /// The message.
    public var payload: ByteBuffer
}

/// What a subscription delivers.
public enum RedisPubSubEvent: Sendable, Hashable {
    /// A message.
    case message(RedisPubSubMessage)
    /// The subscription's connection was lost: messages published from now until ``RedisPubSubEvent/restored`` are missed.
    case lost(RedisError)
    /// The subscription is active again on a new connection (after a ``RedisPubSubEvent/lost(_:)``).
    case restored
}

/// What the tracking stream delivers (`CLIENT TRACKING` invalidations).
public enum RedisInvalidation: Sendable, Hashable {
    /// These keys changed (set, deleted, expired or evicted) on the server.
    case keys([ByteBuffer])
    /// Every tracked key may have changed (`FLUSHALL`, `FLUSHDB`).
    case all
    /// The tracking connection was lost: from now until ``RedisInvalidation/restored(clientID:)``, changes are not reported, so
    /// anything cached from the server is unverified (Redis's client-side caching docs: flush it).
    case lost(RedisError)
    /// Tracking is active again on a new connection, whose id (the target for `REDIRECT`) is given.
    case restored(clientID: Int64)
}

/// `CLIENT TRACKING` options.
public struct RedisTrackingOptions: Sendable, Hashable {
    /// Broadcasting mode (`BCAST`): report every change to a key under ``prefixes``, read or not.
    public var broadcast: Bool
    /// Key prefixes (`PREFIX`), with ``broadcast``; empty: every key.
    public var prefixes: [String]
    /// `NOLOOP`: do not report changes made through the connection that tracks.
    public var noLoop: Bool

    public init(broadcast: Bool = true, prefixes: [String] = [], noLoop: Bool = false) {
        self.broadcast = broadcast
        self.prefixes = prefixes
        self.noLoop = noLoop
    }
}

extension RedisCommand {
    /// `CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST] [PREFIX p]… [NOLOOP]`. A data connection may redirect
    /// its invalidations to a subscriber's connection (``RedisSubscriber/clientID``); with ``RedisTrackingOptions/noLoop`` its
    /// own writes are then not reported.
    public static func clientTracking(_ on: Bool, options: RedisTrackingOptions = .init(), redirect: Int64? = nil) -> RedisCommand {
        var arguments: [RedisArgument] = ["TRACKING", on ? "ON" : "OFF"]
        if on {
            if let redirect { arguments += ["REDIRECT", .integer(redirect)] }
            if options.broadcast {
                arguments.append("BCAST")
                for prefix in options.prefixes { arguments += ["PREFIX", .string(prefix)] }
            }
            if options.noLoop { arguments.append("NOLOOP") }
        }
        return RedisCommand("CLIENT", arguments)
    }
}
