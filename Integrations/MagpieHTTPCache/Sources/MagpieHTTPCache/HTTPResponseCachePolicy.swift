import HTTPTypes
import Magpie

/// What an ``HTTPResponseCache`` stores, for how long, and what it does when the origin fails: the
/// choices HTTP leaves to a cache's operator.
///
/// ```swift
/// var policy = HTTPResponseCachePolicy()
/// policy.defaultMaxAge = .seconds(30)            // responses that say nothing: fresh for 30 s
/// policy.failSafe = .seconds(600)                // origin down: serve what we hold, up to 10 min stale
/// policy.tag = { request, _ in request.path?.hasPrefix("/products") == true ? "products" : nil }
/// ```
public struct HTTPResponseCachePolicy: Sendable {
    /// What to do with a response that sets a cookie.
    public enum SetCookieRule: Sendable, Hashable {
        /// Never store it (the default): a cookie is one client's.
        case refuse
        /// Store it without its `Set-Cookie` fields: the client that caused the store gets its cookie,
        /// every hit is served without one.
        case storeWithoutCookies
    }

    /// The freshness lifetime of a response that gives none (no `s-maxage`, `max-age` or `Expires`)
    /// and whose status is cacheable by default (RFC 9110 §15.1: 200, 203, 204, 300, 301, 308, 404,
    /// 405, 410, 414, 501). Nil (the default): such responses are not stored.
    public var defaultMaxAge: Duration?
    /// The longest freshness lifetime kept, whatever the response asks for. Nil: no bound.
    public var maximumLifetime: Duration?
    /// Bodies longer than this are passed through, never stored (a stream is recorded up to this
    /// length, then passed through). 1 MiB by default; never more than the cache can store.
    public var maximumBodySize: Int
    /// Responses with `Set-Cookie`: ``SetCookieRule/refuse`` by default.
    public var setCookie: SetCookieRule
    /// Fail-safe (Varnish's saint mode, nginx's `proxy_cache_use_stale error`): when the handler throws
    /// or answers 5xx, a stored response this long past its freshness is served instead, as if the
    /// response had said `stale-if-error` with this many seconds (the longer of the two applies).
    /// Never for a response with `must-revalidate`, `proxy-revalidate`, `s-maxage` or `no-cache`.
    /// Nil (the default): only `stale-if-error` does this.
    public var failSafe: Duration?
    /// After the handler failed for a key with a stale response to serve, how long that response is
    /// served without calling the handler again (so a failing origin is not hammered).
    public var failSafeThrottle: Duration
    /// Prepended to every key, so that one Magpie cache can hold responses of several services (or
    /// responses beside other values).
    public var keyPrefix: String
    /// Query parameters left out of the key (tracking parameters, say): requests that differ only in
    /// them share an entry.
    public var ignoredQueryParameters: Set<String>
    /// The tag (a Magpie group) of a response about to be stored, or nil for none;
    /// ``HTTPResponseCache/invalidate(tag:)`` removes every response of a tag at once, on every instance
    /// of a fleet when the cache has a remote tier.
    public var tag: (@Sendable (HTTPRequest, HTTPResponse) -> String?)?
    /// The tiers responses are kept in (memory and disk by default).
    public var tiers: Tiers

    /// The defaults: store only what says how long it is fresh, bodies up to 1 MiB, no cookies, no
    /// fail-safe beyond `stale-if-error`, a 5-second throttle, keys prefixed `http:`.
    public init(
        defaultMaxAge: Duration? = nil, maximumLifetime: Duration? = nil, maximumBodySize: Int = 1 << 20,
        setCookie: SetCookieRule = .refuse, failSafe: Duration? = nil, failSafeThrottle: Duration = .seconds(5),
        keyPrefix: String = "http:", ignoredQueryParameters: Set<String> = [],
        tag: (@Sendable (HTTPRequest, HTTPResponse) -> String?)? = nil, tiers: Tiers = .memoryAndDisk
    ) {
        self.defaultMaxAge = defaultMaxAge
        self.maximumLifetime = maximumLifetime
        self.maximumBodySize = maximumBodySize
        self.setCookie = setCookie
        self.failSafe = failSafe
        self.failSafeThrottle = failSafeThrottle
        self.keyPrefix = keyPrefix
        self.ignoredQueryParameters = ignoredQueryParameters
        self.tag = tag
        self.tiers = tiers
    }
}
