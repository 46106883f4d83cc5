/// How the loader API (``Cache/value(forKey:options:loader:load:)-(String,_,_,_)`` and its forms) treats a
/// value that is stale, a loader that fails, and one that is slow. See <doc:FreshnessAndLoaders>.
///
/// Freshness itself is an entry's: ``EntryOptions/freshFor`` says how long a stored value is fresh,
/// its expiry how long it may be served at all. These options say what the loader API does in between.
///
/// ```swift
/// let loader = LoaderOptions(staleWhileRevalidate: true, eagerRefresh: 0.8,
///                            failSafeMaxAge: .seconds(3600), softTimeout: .milliseconds(50),
///                            hardTimeout: .seconds(2))
/// let profile = try await cache.value(forKey: "user:42",
///                                     options: .fresh(for: .seconds(30), staleUntil: .after(.seconds(3600))),
///                                     loader: loader) { try await origin.profile(42) }
/// ```
public struct LoaderOptions: Sendable, Hashable {
    /// A stale hit returns the stale value at once and starts one background load to refresh it
    /// (single flight: one per key however many stale hits arrive). False: a caller that finds a stale
    /// value waits for the load, and gets the stale value only through ``failSafeMaxAge`` or
    /// ``softTimeout``.
    public var staleWhileRevalidate: Bool
    /// Eager refresh: a fresh hit after this fraction of the value's fresh lifetime (0 < f < 1, say 0.8)
    /// starts a background load, so that a value read often is replaced before it goes stale. Nil: off.
    public var eagerRefresh: Double?
    /// Fail-safe: when a load throws (or passes ``hardTimeout``) and the key has a stale value loaded at
    /// most this long ago (and not expired), the caller gets that value instead of the error; the
    /// error is logged and counted (``CacheStatistics/loaderFailures``), and the key is not loaded
    /// again for ``failSafeThrottle``. Nil: off (callers get the error).
    public var failSafeMaxAge: Duration?
    /// After a failed load of a key with a usable stale value, how long that value is served without
    /// calling the loader again, so that a failing origin is not hammered. Never past the value's
    /// ``failSafeMaxAge`` or its expiry.
    public var failSafeThrottle: Duration
    /// A caller that waits for a load of a key with a stale value gets the stale value after this long;
    /// the load goes on and caches its value when it finishes. Nil: wait for the load.
    public var softTimeout: Duration?
    /// A caller that waits for a load gets ``MagpieError/Code/loadTimedOut`` after this long (or, with
    /// ``failSafeMaxAge``, a stale value young enough); the load goes on and caches its value when it
    /// finishes. Nil: no limit.
    public var hardTimeout: Duration?
    /// Negative caching: when a loader that may find nothing (the `loadIfPresent` forms) returns nil,
    /// the absence is remembered this long, in the tiers the entry options name, so that a missing key
    /// does not reach the origin on every request. Nil: not remembered (nil is returned and the key's
    /// previous value removed).
    public var negativeLifetime: Duration?

    /// Options with the given behaviours. The defaults: stale-while-revalidate on, everything else off
    /// (a throttle of 30 seconds once fail-safe is on).
    public init(
        staleWhileRevalidate: Bool = true, eagerRefresh: Double? = nil, failSafeMaxAge: Duration? = nil,
        failSafeThrottle: Duration = .seconds(30), softTimeout: Duration? = nil, hardTimeout: Duration? = nil,
        negativeLifetime: Duration? = nil
    ) {
        self.staleWhileRevalidate = staleWhileRevalidate
        self.eagerRefresh = eagerRefresh
        self.failSafeMaxAge = failSafeMaxAge
        self.failSafeThrottle = failSafeThrottle
        self.softTimeout = softTimeout
        self.hardTimeout = hardTimeout
        self.negativeLifetime = negativeLifetime
    }

    /// Whether a fresh value loaded at `loadedAt` and fresh until `freshUntil` is due an eager refresh at `now`.
    func eagerRefreshDue(freshUntil: Int64, loadedAt: Int64, now: Int64) -> Bool {
        Self.eagerRefreshDue(eagerRefresh, freshUntil: freshUntil, loadedAt: loadedAt, now: now)
    }

    @inline(__always)
    static func eagerRefreshDue(_ eagerRefresh: Double?, freshUntil: Int64, loadedAt: Int64, now: Int64) -> Bool {
        guard let eagerRefresh, eagerRefresh > 0, eagerRefresh < 1, freshUntil > loadedAt, loadedAt > 0 else { return false }
        return Double(now - loadedAt) >= Double(freshUntil - loadedAt) * eagerRefresh
    }

    /// Whether fail-safe may serve a stale value loaded at `loadedAt` (0: unknown) at `now`.
    func failSafeAllows(loadedAt: Int64, now: Int64) -> Bool {
        guard let failSafeMaxAge, loadedAt > 0 else { return false }
        return now - loadedAt < failSafeMaxAge.wholeMilliseconds  // truncated: never a millisecond more
    }
}
