import HTTPTypes
import MagpieHTTPCache

/// The RFC 9111 / RFC 5861 cases every middleware runs through its own framework (real requests).
public enum HTTPCacheConformance {
    private static func get(_ target: String, _ headers: [(name: String, value: String)] = []) -> ConformanceRequest {
        ConformanceRequest(.get, target, headers: headers)
    }

    private static func body(_ text: String, calls: Int? = nil, _ headers: [(name: String, value: String)] = []) -> Expect {
        Expect(200, body: text, headers: headers, calls: calls)
    }

    /// A policy with a default lifetime of 30 s.
    private static var withDefault: HTTPResponseCachePolicy { HTTPResponseCachePolicy(defaultMaxAge: .seconds(30)) }

    /// Every case.
    public static let cases: [ConformanceCase] = storing + freshness + keys + conditionals + stale + invalidation + bodies

    /// Cases for a middleware that refreshes in the background (one that gives `refresh:`): every
    /// request, the one that starts the refresh included, gets the stale response at once.
    public static let backgroundRefreshCases: [ConformanceCase] = [
        ConformanceCase("stale-while-revalidate in the background: every request served stale at once", "5861 §3", [
            .origin("/a", .cc("max-age=1, stale-while-revalidate=60")),
            .send(get("/a"), body("v#1")),
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=1, stale-while-revalidate=60")], delayMilliseconds: 300)),
            .advance(seconds: 5),
            .send(get("/a"), body("v#1", ["Age": "5"].pairs)),
            .concurrent(20, get("/a"), body("v#1", ["Age": "5"].pairs)),
            .eventually(get("/a"), body("v#2")),
            .send(get("/a"), body("v#2", calls: 2)),
        ])
    ]

    /// RFC 9111 §3: what a shared cache may store.
    static let storing: [ConformanceCase] = [
        ConformanceCase("stores a response with max-age", "9111 §3, §4.2.1", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1", calls: 1)),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("no explicit freshness and no default: not stored", "9111 §3 (6)", [
            .origin("/a", OriginReply()),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("the policy's default lifetime for a heuristically cacheable status", "9111 §4.2.2", policy: withDefault, [
            .origin("/a", OriginReply()),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 29),
            .send(get("/a"), body("v#1", calls: 1)),
            .advance(seconds: 2),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("no default lifetime for a 302", "9111 §4.2.2, 9110 §15.1", policy: withDefault, [
            .origin("/a", OriginReply(302, [("Location", "/b")])),
            .send(get("/a"), Expect(302, body: "v#1")),
            .send(get("/a"), Expect(302, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("response no-store", "9111 §5.2.2.5", [
            .origin("/a", .cc("max-age=60, no-store")),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("request no-store", "9111 §5.2.1.5", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a", [("Cache-Control", "no-store")]), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("private", "9111 §5.2.2.7", [
            .origin("/a", .cc("private, max-age=60")),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("no-cache is not stored (no revalidation with the origin)", "9111 §5.2.2.4", [
            .origin("/a", .cc("no-cache, max-age=60")),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("Authorization without public, s-maxage or must-revalidate", "9111 §3.5", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a", [("Authorization", "Bearer x")]), body("v#1")),
            .send(get("/a", [("Authorization", "Bearer x")]), body("v#2", calls: 2)),
        ]),
        ConformanceCase("Authorization with public", "9111 §3.5", [
            .origin("/a", .cc("public, max-age=60")),
            .send(get("/a", [("Authorization", "Bearer x")]), body("v#1")),
            .send(get("/a", [("Authorization", "Bearer y")]), body("v#1", calls: 1)),
        ]),
        ConformanceCase("Authorization with s-maxage", "9111 §3.5", [
            .origin("/a", .cc("s-maxage=60")),
            .send(get("/a", [("Authorization", "Bearer x")]), body("v#1")),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("Authorization with must-revalidate", "9111 §3.5", [
            .origin("/a", .cc("max-age=60, must-revalidate")),
            .send(get("/a", [("Authorization", "Bearer x")]), body("v#1")),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("Set-Cookie: not stored by default", "policy", [
            .origin("/a", .cc("max-age=60", [("Set-Cookie", "session=1")])),
            .send(get("/a"), Expect(body: "v#1", present: ["Set-Cookie"])),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("Set-Cookie: stored without cookies when the policy says so", "policy",
            policy: HTTPResponseCachePolicy(setCookie: .storeWithoutCookies), [
            .origin("/a", .cc("max-age=60", [("Set-Cookie", "session=1")])),
            .send(get("/a"), Expect(body: "v#1", present: ["Set-Cookie"])),
            .send(get("/a"), Expect(body: "v#1", absent: ["Set-Cookie"], calls: 1)),
        ]),
        ConformanceCase("a status the cache does not store (201)", "9111 §3 (2)", [
            .origin("/a", .cc("max-age=60", status: 201)),
            .send(get("/a"), Expect(201, body: "v#1")),
            .send(get("/a"), Expect(201, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("a 404 with max-age is stored", "9111 §3, 9110 §15.1", [
            .origin("/a", .cc("max-age=60", status: 404)),
            .send(get("/a"), Expect(404, body: "v#1")),
            .send(get("/a"), Expect(404, body: "v#1", calls: 1)),
        ]),
        ConformanceCase("a 5xx is never stored", "9111 §3", [
            .origin("/a", .cc("max-age=60", status: 500)),
            .send(get("/a"), Expect(500, body: "v#1")),
            .send(get("/a"), Expect(500, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("POST is not stored", "9111 §3 (1)", [
            .origin("/a", .cc("max-age=60")),
            .send(ConformanceRequest(.post, "/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
    ]

    /// RFC 9111 §4.2: freshness and Age.
    static let freshness: [ConformanceCase] = [
        ConformanceCase("Age on every hit, growing with residence", "9111 §4.2.3, §5.1", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#1", ["Age": "0"].pairs)),
            .advance(seconds: 10),
            .send(get("/a"), body("v#1", calls: 1, ["Age": "10"].pairs)),
        ]),
        ConformanceCase("max-age runs out", "9111 §4.2.1", [
            .origin("/a", .cc("max-age=10")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 11),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("s-maxage over max-age (longer)", "9111 §5.2.2.10", [
            .origin("/a", .cc("max-age=1, s-maxage=60")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 30),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("s-maxage over max-age (shorter)", "9111 §5.2.2.10", [
            .origin("/a", .cc("max-age=60, s-maxage=5")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 6),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("Expires minus Date", "9111 §5.3", [
            .origin("/a", OriginReply(200, [("Date", "@date:+0"), ("Expires", "@date:+60")])),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 30),
            .send(get("/a"), body("v#1", calls: 1)),
            .advance(seconds: 31),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("an invalid Expires is already expired", "9111 §5.3", [
            .origin("/a", OriginReply(200, [("Expires", "0")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("the origin's Age counts against freshness", "9111 §4.2.3", [
            .origin("/a", .cc("max-age=60", [("Age", "30")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#1", calls: 1, ["Age": "30"].pairs)),
            .advance(seconds: 31),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("concurrent misses run the handler once", "loader (proxy_cache_lock)", [
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=60")], delayMilliseconds: 50)),
            .concurrent(50, get("/a"), body("v#1")),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
    ]

    /// RFC 9111 §4.1: the key and Vary.
    static let keys: [ConformanceCase] = [
        ConformanceCase("Vary: each variant its own entry", "9111 §4.1", [
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")], echo: "accept-language")),
            .send(get("/a", [("Accept-Language", "en")]), body("v#1en")),
            .send(get("/a", [("Accept-Language", "fr")]), body("v#2fr")),
            .send(get("/a", [("Accept-Language", "en")]), body("v#1en")),
            .send(get("/a", [("Accept-Language", "fr")]), body("v#2fr", calls: 2)),
        ]),
        ConformanceCase("Vary: an absent field is a variant of its own", "9111 §4.1", [
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")], echo: "accept-language")),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("Accept-Language", "en")]), body("v#2en")),
            .send(get("/a"), body("v#1", calls: 2)),
        ]),
        ConformanceCase("Vary: * is never stored", "9111 §4.1", [
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=60"), ("Vary", "*")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("the query is normalised (parameter order)", "key", [
            .origin("/q", .cc("max-age=60")),
            .send(get("/q?b=2&a=1"), body("v#1")),
            .send(get("/q?a=1&b=2"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("different queries are different entries", "key", [
            .origin("/q", .cc("max-age=60")),
            .send(get("/q?a=1"), body("v#1")),
            .send(get("/q?a=2"), body("v#2")),
            .send(get("/q?a=1"), body("v#1", calls: 2)),
        ]),
        ConformanceCase("ignored query parameters share the entry", "policy",
            policy: HTTPResponseCachePolicy(ignoredQueryParameters: ["utm_source"]), [
            .origin("/q", .cc("max-age=60")),
            .send(get("/q?utm_source=mail"), body("v#1")),
            .send(get("/q"), body("v#1", calls: 1)),
        ]),
        ConformanceCase("HEAD is served from the GET entry", "9111 §4", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1")),
            .send(ConformanceRequest(.head, "/a"), Expect(200, body: "", present: ["Age"], calls: 1)),
        ]),
        ConformanceCase("a HEAD miss goes to the handler and is not stored", "9111 §4", [
            .origin("/a", .cc("max-age=60")),
            .send(ConformanceRequest(.head, "/a"), Expect(200, calls: 1)),
            .send(get("/a"), body("v#2", calls: 2)),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
    ]

    /// RFC 9111 §4.3.2 (RFC 9110 §13): conditional requests answered from the entry.
    static let conditionals: [ConformanceCase] = [
        ConformanceCase("If-None-Match matching: 304 from the entry", "9111 §4.3.2", [
            .origin("/a", .cc("max-age=60", [("ETag", "\"x1\"")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("If-None-Match", "\"x1\"")]),
                  Expect(304, body: "", headers: [("ETag", "\"x1\"")], present: ["Age", "Cache-Control"], calls: 1)),
        ]),
        ConformanceCase("If-None-Match: weak comparison", "9110 §13.1.2", [
            .origin("/a", .cc("max-age=60", [("ETag", "W/\"x1\"")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("If-None-Match", "\"x0\", \"x1\"")]), Expect(304, body: "", calls: 1)),
        ]),
        ConformanceCase("If-None-Match not matching: the whole response", "9110 §13.1.2", [
            .origin("/a", .cc("max-age=60", [("ETag", "\"x1\"")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("If-None-Match", "\"x2\"")]), body("v#1", calls: 1)),
        ]),
        ConformanceCase("If-None-Match: *", "9110 §13.1.2", [
            .origin("/a", .cc("max-age=60", [("ETag", "\"x1\"")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("If-None-Match", "*")]), Expect(304, body: "", calls: 1)),
        ]),
        ConformanceCase("If-Modified-Since against Last-Modified", "9110 §13.1.3", [
            .origin("/a", .cc("max-age=60", [("Last-Modified", "@date:-100")])),
            .send(get("/a"), body("v#1")),
            .send(get("/a", [("If-Modified-Since", "@date:+0")]), Expect(304, body: "", calls: 1)),
            .send(get("/a", [("If-Modified-Since", "@date:-200")]), body("v#1", calls: 1)),
        ]),
        ConformanceCase("a conditional miss: the handler gets the whole request, the client its 304", "9111 §4.3.2", [
            .origin("/a", .cc("max-age=60", [("ETag", "\"x1\"")])),
            .send(get("/a", [("If-None-Match", "\"x1\"")]), Expect(304, body: "", calls: 1)),
            .send(get("/a"), body("v#1", calls: 1)),
        ]),
    ]

    /// RFC 5861 and RFC 9111 §4.2.4: serving stale.
    static let stale: [ConformanceCase] = [
        ConformanceCase("stale-while-revalidate serves stale and refreshes once in the background", "5861 §3", [
            .origin("/a", .cc("max-age=1, stale-while-revalidate=60")),
            .send(get("/a"), body("v#1")),
            // The refresh is slow, so every other concurrent stale request is answered before it lands.
            // With a background refresh every request gets the stale response; without one (a middleware
            // whose chain cannot outlive the request) the request that refreshes waits for the new one.
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=1, stale-while-revalidate=60")], delayMilliseconds: 300)),
            .advance(seconds: 5),
            .concurrent(20, get("/a"), Expect(oneOf: ["v#1", "v#2"])),
            .eventually(get("/a"), body("v#2")),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("past the stale-while-revalidate window the request waits", "5861 §3", [
            .origin("/a", .cc("max-age=1, stale-while-revalidate=5")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 10),
            .send(get("/a"), body("v#2", calls: 2)),
        ]),
        ConformanceCase("stale-if-error when the handler throws", "5861 §4", [
            .origin("/a", .cc("max-age=1, stale-if-error=60")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 5),
            .origin("/a", OriginReply(fails: true)),
            .send(get("/a"), body("v#1", calls: 2, ["Age": "5"].pairs)),
        ]),
        ConformanceCase("stale-if-error when the handler answers 5xx", "5861 §4", [
            .origin("/a", .cc("max-age=1, stale-if-error=60")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 5),
            .origin("/a", OriginReply(503)),
            .send(get("/a"), body("v#1", calls: 2)),
        ]),
        ConformanceCase("past the stale-if-error window the error goes through", "5861 §4", [
            .origin("/a", .cc("max-age=1, stale-if-error=10")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 30),
            .origin("/a", OriginReply(503)),
            .send(get("/a"), Expect(503, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("no stale-if-error: the 5xx goes through", "9111 §4.2.4", [
            .origin("/a", .cc("max-age=1")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 5),
            .origin("/a", OriginReply(503)),
            .send(get("/a"), Expect(503, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("must-revalidate: never stale, even with stale-if-error", "9111 §5.2.2.2", [
            .origin("/a", .cc("max-age=1, must-revalidate, stale-if-error=60")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 5),
            .origin("/a", OriginReply(503)),
            .send(get("/a"), Expect(503, body: "v#2", calls: 2)),
        ]),
        ConformanceCase("the policy's fail-safe serves stale when the handler throws", "policy (saint mode)",
            policy: HTTPResponseCachePolicy(failSafe: .seconds(600)), [
            .origin("/a", .cc("max-age=1")),
            .send(get("/a"), body("v#1")),
            .advance(seconds: 100),
            .origin("/a", OriginReply(fails: true)),
            .send(get("/a"), body("v#1", calls: 2)),
        ]),
    ]

    /// RFC 9111 §4.4 and tags.
    static let invalidation: [ConformanceCase] = [
        ConformanceCase("a successful POST invalidates the URL", "9111 §4.4", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1")),
            .send(ConformanceRequest(.post, "/a"), body("v#2")),
            .send(get("/a"), body("v#3", calls: 3)),
        ]),
        ConformanceCase("a DELETE invalidates every variant", "9111 §4.4", [
            .origin("/a", OriginReply(200, [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")], echo: "accept-language")),
            .send(get("/a", [("Accept-Language", "en")]), body("v#1en")),
            .send(get("/a", [("Accept-Language", "fr")]), body("v#2fr")),
            .send(ConformanceRequest(.delete, "/a"), body("v#3")),
            .send(get("/a", [("Accept-Language", "en")]), body("v#4en")),
            .send(get("/a", [("Accept-Language", "fr")]), body("v#5fr", calls: 5)),
        ]),
        ConformanceCase("a failed unsafe request invalidates nothing", "9111 §4.4", [
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1")),
            .origin("/a", OriginReply(500)),
            .send(ConformanceRequest(.put, "/a"), Expect(500, body: "v#2")),
            .origin("/a", .cc("max-age=60")),
            .send(get("/a"), body("v#1", calls: 2)),
        ]),
        ConformanceCase("Location and Content-Location are invalidated too", "9111 §4.4", [
            .origin("/b", .cc("max-age=60")),
            .origin("/c", .cc("max-age=60")),
            .origin("/a", OriginReply(201, [("Location", "/b"), ("Content-Location", "/c")])),
            .send(get("/b"), body("v#1")),
            .send(get("/c"), body("v#2")),
            .send(ConformanceRequest(.post, "/a"), Expect(201, body: "v#3")),
            .send(get("/b"), body("v#4")),
            .send(get("/c"), body("v#5", calls: 5)),
        ]),
        ConformanceCase("a tag removes its responses together", "tags (Magpie groups)",
            policy: HTTPResponseCachePolicy(tag: { request, _ in request.path?.hasPrefix("/products") == true ? "products" : nil }), [
            .origin("/products/1", .cc("max-age=60")),
            .origin("/products/2", .cc("max-age=60")),
            .origin("/other", .cc("max-age=60")),
            .send(get("/products/1"), body("v#1")),
            .send(get("/products/2"), body("v#2")),
            .send(get("/other"), body("v#3")),
            .invalidate(tag: "products"),
            .send(get("/products/1"), body("v#4")),
            .send(get("/products/2"), body("v#5")),
            .send(get("/other"), body("v#3", calls: 5)),
        ]),
    ]

    /// Bodies: streamed and over the size limit.
    static let bodies: [ConformanceCase] = [
        ConformanceCase("a streamed body is stored as it is sent", "bodies", [
            .origin("/s", OriginReply(200, [("Cache-Control", "max-age=60")], body: String(repeating: "s", count: 64), chunks: 8)),
            .send(get("/s"), body(String(repeating: "s", count: 64) + "#1")),
            .eventually(get("/s"), body(String(repeating: "s", count: 64) + "#1", calls: 1)),
        ]),
        ConformanceCase("a body over the size limit is passed through", "bodies", policy: HTTPResponseCachePolicy(maximumBodySize: 16), [
            .origin("/big", .init(200, [("Cache-Control", "max-age=60")], body: String(repeating: "b", count: 100))),
            .send(get("/big"), body(String(repeating: "b", count: 100) + "#1")),
            .send(get("/big"), body(String(repeating: "b", count: 100) + "#2", calls: 2)),
        ]),
        ConformanceCase("a streamed body over the size limit is passed through", "bodies", policy: HTTPResponseCachePolicy(maximumBodySize: 16), [
            .origin("/big", OriginReply(200, [("Cache-Control", "max-age=60")], body: String(repeating: "b", count: 100), chunks: 10)),
            .send(get("/big"), body(String(repeating: "b", count: 100) + "#1")),
            .send(get("/big"), body(String(repeating: "b", count: 100) + "#2", calls: 2)),
        ]),
    ]
}

extension Dictionary where Key == String, Value == String {
    var pairs: [(name: String, value: String)] { map { ($0.key, $0.value) } }
}
