import Magpie
import NIOCore
import Vapor

extension Application.Caches.Provider {
    /// Vapor's `Cache` kept in a Magpie cache: `app.caches.use(.magpie(cache))`.
    ///
    /// ```swift
    /// let cache = try Magpie.Cache(Magpie.Cache.Configuration(directory: "/var/cache/my-app"))
    /// app.caches.use(.magpie(cache))
    /// try await req.cache.set("greeting", to: "hello", expiresIn: .minutes(5))
    /// ```
    ///
    /// `app.cache` calls the factory this registers on every access: each call makes a
    /// ``MagpieVaporCache``, a handle of a few references over the one `cache`, which every handle shares.
    /// - Parameters:
    ///   - cache: the Magpie cache that keeps the values (within its byte budgets; with a remote tier,
    ///     shared by every instance).
    ///   - keyPrefix: prepended to every key, so that these entries can share the cache with others.
    ///   - options: how each value is stored (tiers, group); nil: the cache's default options. A `set`
    ///     with `expiresIn` replaces their expiries with its own.
    ///   - coder: the values' encoding (JSON by default).
    public static func magpie(
        _ cache: Magpie.Cache, keyPrefix: String = "vapor-cache:", options: EntryOptions? = nil,
        coder: any CacheCoder = JSONCacheCoder()
    ) -> Self {
        let shared = MagpieVaporCache.Shared(
            cache: cache, keyPrefix: keyPrefix, options: options ?? cache.configuration.defaultOptions, coder: coder)
        return .init { application in
            application.caches.use { application in
                MagpieVaporCache(shared: shared, eventLoop: application.eventLoopGroup.any())
            }
        }
    }
}

/// Vapor's key-value `Cache` kept in a Magpie ``Magpie/Cache``: bounded by the cache's byte budgets, on
/// disk across restarts when the cache has a directory, and shared by a fleet when it has a remote tier.
/// Registered with `app.caches.use(.magpie(cache))`.
///
/// The rules, as Vapor's memory cache keeps them (one test suite runs against both):
/// - `get` returns nil for a key never set, deleted, or expired; the value last set otherwise.
/// - `set` replaces the value; `set(_:to: nil)` and `delete` remove it; `set(_:to:expiresIn:)` expires
///   it after that many seconds (a lifetime of zero or less removes the key), and a `set` without one
///   never expires it (unless the driver's options give an expiry).
/// - `for(request)` is the same cache, its futures on the request's event loop.
///
/// Where it differs, by design:
/// - Values are encoded (JSON by default) when set and decoded when read, where the memory cache keeps
///   the Swift value: a value stored as one type and read as another that does not decode from it throws
///   the coder's `DecodingError` (the memory cache returns nil; Vapor's Redis cache throws too). A value
///   that fails to encode fails the `set`.
/// - It is bounded: the least useful entries are evicted when the cache's budget is reached (the memory
///   cache grows without bound), and expired entries are removed by the cache, not only when read.
/// - The cache's own failures (an I/O error, a key longer than ``Magpie/Cache/maximumKeyLength`` with
///   its prefix, a value larger than ``Magpie/Cache/largestStorableValue`` in a cache with a disk tier)
///   fail the future with the ``MagpieError``: in a route that throws it, Vapor's `ErrorMiddleware`
///   answers 500, as for any non-`AbortError`. A memory-only cache refuses a value larger than it keeps
///   as it would evict it: the `set` succeeds and the key reads as absent (counted in
///   `statistics.memory.refusals`).
///
/// A handle is cheap (the cache, the shared settings and an event loop): `app.cache` makes one on every
/// access, over the one shared Magpie cache.
public struct MagpieVaporCache: Vapor.Cache, Sendable {
    /// What every handle of one registration shares.
    final class Shared: Sendable {
        let cache: Magpie.Cache
        let keyPrefix: String
        let options: EntryOptions
        let coder: any CacheCoder

        init(cache: Magpie.Cache, keyPrefix: String, options: EntryOptions, coder: any CacheCoder) {
            self.cache = cache
            self.keyPrefix = keyPrefix
            self.options = options
            self.coder = coder
        }
    }

    let shared: Shared
    /// The event loop the futures complete on.
    public let eventLoop: any EventLoop

    /// A handle over `cache` whose futures complete on `eventLoop`.
    /// - Parameters:
    ///   - cache: the Magpie cache that keeps the values.
    ///   - eventLoop: where the returned futures complete.
    ///   - keyPrefix: prepended to every key.
    ///   - options: how each value is stored; nil: the cache's default options.
    ///   - coder: the values' encoding (JSON by default).
    public init(
        cache: Magpie.Cache, eventLoop: any EventLoop, keyPrefix: String = "vapor-cache:", options: EntryOptions? = nil,
        coder: any CacheCoder = JSONCacheCoder()
    ) {
        self.init(
            shared: Shared(cache: cache, keyPrefix: keyPrefix, options: options ?? cache.configuration.defaultOptions, coder: coder),
            eventLoop: eventLoop)
    }

    init(shared: Shared, eventLoop: any EventLoop) {
        self.shared = shared
        self.eventLoop = eventLoop
    }

    /// The Magpie cache underneath.
    public var cache: Magpie.Cache { shared.cache }

    public func get<T: Decodable>(_ key: String, as type: T.Type) -> EventLoopFuture<T?> {
        let shared = self.shared
        let read = eventLoop.makePromise(of: [UInt8]?.self)
        read.completeWithTask {
            try await shared.cache.async.value(forKey: shared.keyPrefix + key)
        }
        // Vapor's `Cache` asks for any `Decodable`, not only `Sendable` ones, so neither `T` nor its
        // metatype may cross into a `@Sendable` callback. The decoding is a plain closure made here, run
        // once on the event loop by the read's callback, which captures nothing else of `T`.
        let decoded = eventLoop.makePromise(of: T?.self)
        let coder = shared.coder
        nonisolated(unsafe) let finish: (Result<[UInt8]?, any Error>) -> Void = { result in
            let promise = decoded.assumeIsolated()  // on the event loop: the read's callback runs there
            do {
                promise.succeed(try result.get().map { try coder.decode(T.self, from: $0) })
            } catch {
                decoded.fail(error)
            }
        }
        read.futureResult.whenComplete { finish($0) }
        return decoded.futureResult
    }

    public func set<T: Encodable>(_ key: String, to value: T?) -> EventLoopFuture<Void> {
        set(key, to: value, expiresIn: nil)
    }

    public func set<T: Encodable>(_ key: String, to value: T?, expiresIn expirationTime: CacheExpirationTime?)
        -> EventLoopFuture<Void>
    {
        let shared = self.shared
        let fullKey = shared.keyPrefix + key
        guard let value else {
            return run { _ = try await shared.cache.async.removeValue(forKey: fullKey) }
        }
        let bytes: [UInt8]
        do {
            bytes = try shared.coder.encode(value)
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        var options = shared.options
        if let expirationTime {
            // A fixed instant on the cache's clock: both tiers (and a promotion from disk) keep it, and
            // no jitter of the driver's options moves it. Zero seconds or less: an instant already past,
            // which removes the key.
            let seconds = Int64(clamping: expirationTime.seconds)
            let now = shared.cache.configuration.clock.now()
            let (milliseconds, overflow) = seconds.multipliedReportingOverflow(by: 1000)
            let deadline: Int64
            if seconds <= 0 {
                deadline = 1
            } else if overflow {
                deadline = Int64.max
            } else {
                let (sum, sumOverflow) = now.addingReportingOverflow(milliseconds)
                deadline = sumOverflow ? Int64.max : sum
            }
            options.memoryExpiry = .at(millisecondsSince1970: deadline)
            options.diskExpiry = nil
        }
        return run { [options] in try await shared.cache.async.set(bytes, forKey: fullKey, options: options) }
    }

    public func `for`(_ request: Request) -> MagpieVaporCache {
        MagpieVaporCache(shared: shared, eventLoop: request.eventLoop)
    }

    private func run(_ body: @escaping @Sendable () async throws -> Void) -> EventLoopFuture<Void> {
        let promise = eventLoop.makePromise(of: Void.self)
        promise.completeWithTask(body)
        return promise.futureResult
    }
}
