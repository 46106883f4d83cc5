import HTTPTypes

/// How long a response may be served, decided once when it is stored (RFC 9111 §4.2, RFC 5861).
struct Lifetimes: Sendable, Equatable {
    /// The freshness lifetime left at the store, in ms (the lifetime less the response's age).
    var freshFor: Int64
    /// How long past freshness it may be served while a refresh runs (`stale-while-revalidate`), ms.
    var staleWhileRevalidate: Int64
    /// How long past freshness it may be served when the origin fails (`stale-if-error`, or the
    /// policy's fail-safe), ms.
    var staleIfError: Int64
    /// The response's age at the store, in ms (its `Age` field).
    var initialAge: Int64

    /// How long the entry is kept: fresh, then stale for as long as either stale window allows.
    var keptFor: Int64 { freshFor.addingSaturated(max(staleWhileRevalidate, staleIfError)) }
}

/// Why a response is not stored (for tests and logs).
enum Refusal: Error, Equatable {
    case method, status, noStore, privateResponse, noCache, authorization, setCookie, varyStar, noFreshness,
        tooLarge, serverError
}

/// The storing rules of a shared cache (RFC 9111 §3) and the lifetimes of what may be stored (§4.2).
enum StoreRules {
    /// The longest lifetime or stale window kept (ten years, in ms): bounds the sums of lifetimes.
    static let longest: Int64 = 10 * 366 * 86_400_000

    /// Statuses a cache may store (it understands them; RFC 9111 §3 (2)). 206 is left out: ranges are
    /// not cached.
    static let understood: Set<Int> = [200, 203, 204, 300, 301, 302, 303, 307, 308, 404, 405, 410, 414, 501]
    /// Statuses cacheable by default (RFC 9110 §15.1): these may take a default (heuristic) lifetime.
    static let heuristic: Set<Int> = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501]

    /// The lifetimes of `response` to `request`, received at `now` (ms since 1970), or why it is not
    /// stored.
    static func lifetimes(
        request: HTTPRequest, response: HTTPResponse, now: Int64, policy: HTTPResponseCachePolicy
    ) -> Result<Lifetimes, Refusal> {
        guard request.method == .get else { return .failure(.method) }
        if response.status.code >= 500 { return .failure(.serverError) }
        guard understood.contains(response.status.code) else { return .failure(.status) }
        let requestControl = CacheControl(request.headerFields)
        let control = CacheControl(response.headerFields)
        if control.has("no-store") || requestControl.has("no-store") { return .failure(.noStore) }
        if control.has("private") { return .failure(.privateResponse) }
        if control.has("no-cache") { return .failure(.noCache) }
        if request.headerFields[.authorization] != nil,
            !(control.has("public") || control.has("s-maxage") || control.has("must-revalidate"))
        {
            return .failure(.authorization)
        }
        if response.headerFields[.setCookie] != nil, policy.setCookie == .refuse { return .failure(.setCookie) }
        if varyNames(response.headerFields) == nil { return .failure(.varyStar) }

        // Freshness lifetime (RFC 9111 §4.2.1): s-maxage, max-age, Expires − Date, else the policy's default.
        var lifetime: Int64
        if let shared = control.seconds("s-maxage") {
            lifetime = shared * 1000
        } else if let maxAge = control.seconds("max-age") {
            lifetime = maxAge * 1000
        } else if let expires = response.headerFields[.expires] {
            let date = response.headerFields[.date].flatMap(HTTPDate.parse) ?? now
            lifetime = HTTPDate.parse(expires).map { max(0, $0 - date) } ?? 0
        } else if let fallback = policy.defaultMaxAge, heuristic.contains(response.status.code) || control.has("public") {
            lifetime = fallback.milliseconds
        } else {
            return .failure(.noFreshness)
        }
        if let bound = policy.maximumLifetime { lifetime = min(lifetime, bound.milliseconds) }
        lifetime = max(0, min(lifetime, Self.longest))
        let age = (response.headerFields[.age].flatMap { Int64($0.trimmingWhitespace.prefix(10)) } ?? 0) * 1000

        // Serving stale (RFC 9111 §4.2.4, RFC 5861): never after must-revalidate, proxy-revalidate or
        // s-maxage (which implies proxy-revalidate for a shared cache, §5.2.2.10).
        let mayServeStale = !(control.has("must-revalidate") || control.has("proxy-revalidate") || control.has("s-maxage"))
        let revalidateWindow = mayServeStale ? (control.seconds("stale-while-revalidate") ?? 0) * 1000 : 0
        var errorWindow = mayServeStale ? (control.seconds("stale-if-error") ?? 0) * 1000 : 0
        if mayServeStale, let failSafe = policy.failSafe { errorWindow = max(errorWindow, failSafe.milliseconds) }
        errorWindow = max(0, min(errorWindow, Self.longest))
        let lifetimes = Lifetimes(
            freshFor: max(0, lifetime - age), staleWhileRevalidate: revalidateWindow, staleIfError: errorWindow, initialAge: age)
        guard lifetimes.keptFor > 0 else { return .failure(.noFreshness) }
        return .success(lifetimes)
    }

    /// The field names `Vary` lists, lowercased, sorted and without duplicates; nil for `Vary: *`.
    static func varyNames(_ fields: HTTPFields) -> [String]? {
        var names: Set<String> = []
        for line in fields[values: .vary] {
            for part in line.split(separator: ",") {
                let name = part.trimmingWhitespace.lowercased()
                if name == "*" { return nil }
                if !name.isEmpty { names.insert(name) }
            }
        }
        return names.sorted()
    }

    /// Whether `method` is safe (RFC 9110 §9.2.1): everything else invalidates (RFC 9111 §4.4).
    static func isSafe(_ method: HTTPRequest.Method) -> Bool {
        method == .get || method == .head || method == .options || method == .trace
    }
}

extension Int64 {
    /// `self + other`, at most `Int64.max`.
    func addingSaturated(_ other: Int64) -> Int64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }
}

extension Duration {
    /// Whole milliseconds, saturating.
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        let (product, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? .min : .max }
        return product + attoseconds / 1_000_000_000_000_000
    }
}
