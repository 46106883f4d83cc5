import HTTPTypes
import Magpie
import Synchronization

/// Whole HTTP responses cached by HTTP's rules, over a Magpie ``Cache``: what a framework's middleware
/// calls. The rules are written here once, over swift-http-types; a middleware only converts its
/// framework's request and response (see <doc:CachingHTTPResponses>).
///
/// - Stores only what a shared cache may (RFC 9111 §3) for as long as the response allows (§4.2), each
///   `Vary` variant its own entry; answers hits with `Age`, and `If-None-Match` / `If-Modified-Since`
///   with 304 from the entry; HEAD from the GET entry.
/// - Runs the handler once for concurrent misses of a key (Magpie's loader); serves a stale response
///   while one background run refreshes it (`stale-while-revalidate`), and when the handler throws or
///   answers 5xx (`stale-if-error`, ``HTTPResponseCachePolicy/failSafe``).
/// - Invalidates a URL's entries on a successful unsafe request to it (§4.4), and a tag's on
///   ``invalidate(tag:)``: through Magpie's removals, so across a fleet when the cache has a remote tier.
/// - Bodies are Magpie values (compressed on disk like any value); a streamed body is recorded as it is
///   sent, and one over ``HTTPResponseCachePolicy/maximumBodySize`` is passed through.
///
/// One instance serves every request (it holds no per-request state); share it.
public final class HTTPResponseCache: Sendable {
    /// The Magpie cache the responses are kept in.
    public let cache: Cache
    /// The operator's choices.
    public let policy: HTTPResponseCachePolicy
    /// The keys a request is refreshing in line (stale-while-revalidate without a background refresh).
    private let inlineRefreshes = Mutex<Set<String>>([])

    /// What runs the request when the cache cannot answer it: the rest of the framework's chain (the
    /// route's handler), given the request to run (the cache may have removed its conditional fields,
    /// so that the response it stores is a whole one).
    public typealias Handler = @Sendable (HTTPRequest) async throws -> HTTPCacheResponse

    /// A response cache over `cache` with `policy`.
    public init(cache: Cache, policy: HTTPResponseCachePolicy = HTTPResponseCachePolicy()) {
        self.cache = cache
        self.policy = policy
    }

    /// The response to send for `request`: from the cache, or from `handler` (and then stored when the
    /// rules allow). The one entry point a framework's middleware calls, with the request's head and a
    /// closure that runs the rest of its chain and returns the response's head and body.
    ///
    /// - GET and HEAD: a fresh stored response (HEAD: without its body), or a 304 when the request's
    ///   conditional fields match it; otherwise `handler` runs, in this request, once for all the
    ///   concurrent misses of the key (the others wait for its response and share it), and its response
    ///   is stored if it may be. A streamed body is sent as it comes, recorded aside, and stored when it
    ///   has ended within the size limit.
    /// - Unsafe methods (POST, PUT, DELETE, PATCH, ...): `handler` runs; a 2xx or 3xx response removes
    ///   the stored responses of the request's URL (and of its `Location` and `Content-Location`, when
    ///   they name this origin).
    /// - Anything else: `handler` runs.
    ///
    /// `handler` never runs after this call returns, so a framework may pass its non-escaping `next`.
    /// A stale response within its `stale-while-revalidate` window is then refreshed by one request,
    /// which waits for the handler, while every other request gets the stale response at once. A
    /// framework whose chain may outlive the request passes it as `refresh` as well: the refresh then
    /// runs in the background and every request, that one included, gets the stale response at once.
    ///
    /// - Parameters:
    ///   - request: the request's head.
    ///   - handler: runs the rest of the chain for the request it is given.
    ///   - refresh: the same, callable after this call has returned (for background refreshes); nil when
    ///     the framework cannot offer one. Evaluated only when the cache cannot answer from a fresh entry,
    ///     so a hit never pays for building it.
    /// - Throws: what `handler` throws, when there is no stale response to serve in its place. The cache's
    ///   own failures (a closed cache, a disk error) are never thrown: the request then goes to `handler`.
    public func respond(
        to request: HTTPRequest, refresh: @autoclosure () -> Handler? = nil,
        handler: (HTTPRequest) async throws -> HTTPCacheResponse
    ) async throws -> HTTPCacheResponse {
        if request.method == .get || request.method == .head {
            guard let base = baseKey(request) else { return try await handler(request) }
            return try await respondSafe(request, base: base, refresh: refresh, handler)
        }
        let response = try await handler(request)
        if !StoreRules.isSafe(request.method), (200..<400).contains(response.head.status.code) {
            await invalidate(after: request, response: response.head)
        }
        return response
    }

    /// Removes every stored response tagged `tag` (see ``HTTPResponseCachePolicy/tag``): a Magpie group
    /// removal, so on every instance of a fleet when the cache has a remote tier.
    @discardableResult
    public func invalidate(tag: String) async throws -> RemovedEntries {
        try await cache.async.removeAll(inGroup: tag)
    }

    /// Removes the stored responses of `target` (a path and query, as in a request: `/products?page=2`),
    /// every variant of it.
    public func invalidate(target: String) async throws {
        guard let key = key(forTarget: target) else { return }
        _ = try await cache.async.removeValue(forKey: key)
    }

    // MARK: - Safe methods

    private func respondSafe(
        _ request: HTTPRequest, base: String, refresh makeRefresh: () -> Handler?,
        _ handler: (HTTPRequest) async throws -> HTTPCacheResponse
    ) async throws -> HTTPCacheResponse {
        var key = base
        var index: VariantIndex?
        // At most: the base key (a response or an index), the variant, and once more after a load
        // that answered with an index.
        for _ in 0..<4 {
            // A plain read (a memory hit costs a probe and a copy): the record itself says how fresh it is.
            let value: [UInt8]?
            do { value = try await cache.async.value(forKey: key) } catch { return try await handler(request) }
            var stale: (StoredResponse, Int64)?
            var record = value.flatMap { StoredRecord(decoding: $0) }
            if case .variants = record, key != base { record = nil }
            if value != nil, record == nil {
                // Not one of our records (another writer, an older format): removed, so that the load
                // below stores in its place instead of finding it.
                _ = try? await cache.async.removeValue(forKey: key)
            }
            if let record {
                switch record {
                case .variants(let found) where key == base:
                    guard let variant = variantKey(base, found, request) else { return try await handler(request) }
                    index = found
                    key = variant
                    continue
                case .variants:
                    break  // an index where a response belongs: removed above
                case .response(let stored):
                    let now = cache.configuration.clock.now()
                    let freshUntil = stored.storedAt.addingSaturated(stored.lifetimes.freshFor)
                    let (staleness, overflow) = now.subtractingReportingOverflow(freshUntil)
                    if overflow || staleness < 0 { return serve(stored, to: request, now: now) }
                    stale = (stored, staleness)
                }
            }
            if request.method == .head { return try await handler(request) }  // HEAD is stored only as GET
            // Stale within stale-while-revalidate and no background refresh possible: one request
            // refreshes (in line), the others get the stale response meanwhile.
            let refresh = makeRefresh()
            var refreshing = false
            if let (stored, staleness) = stale, staleness < stored.lifetimes.staleWhileRevalidate, refresh == nil {
                guard inlineRefreshes.withLock({ $0.insert(key).inserted }) else {
                    return serve(stored, to: request, now: cache.configuration.clock.now())
                }
                refreshing = true
            }
            let loaded: Loaded
            do {
                defer { if refreshing { _ = inlineRefreshes.withLock { $0.remove(key) } } }
                loaded = try await load(request, key: key, base: base, index: index, stale: stale, refresh: refresh, handler)
            }
            switch loaded {
            case .response(let response):
                return response
            case .record(let bytes):
                guard let record = StoredRecord(decoding: bytes) else { return try await handler(request) }
                switch record {
                case .response(let stored):
                    return serve(stored, to: request, now: cache.configuration.clock.now())
                case .variants(let found):
                    guard key == base, let variant = variantKey(base, found, request) else { return try await handler(request) }
                    index = found
                    key = variant
                }
            }
        }
        return try await handler(request)
    }

    private enum Loaded {
        case response(HTTPCacheResponse)
        case record([UInt8])
    }

    /// The origin's failure that a stored response may stand in for: a 5xx (its body when buffered, for
    /// the requests that shared the run).
    private struct ServerError: Error, CustomStringConvertible {
        let response: HTTPResponse
        let body: [UInt8]?

        var description: String { "the handler answered \(response.status.code)" }
    }

    /// Goes through Magpie's loader (one run per key for concurrent callers; a stale entry served
    /// while it refreshes, or when the run fails, as its lifetimes allow). The request that the load
    /// elects runs `handler` here, in its own task.
    private func load(
        _ request: HTTPRequest, key: String, base: String, index: VariantIndex?, stale: (StoredResponse, Int64)?,
        refresh: Handler?, _ handler: (HTTPRequest) async throws -> HTTPCacheResponse
    ) async throws -> Loaded {
        var loader = LoaderOptions(staleWhileRevalidate: false, failSafeThrottle: policy.failSafeThrottle)
        if let (stored, staleness) = stale {
            loader.staleWhileRevalidate = refresh != nil && staleness < stored.lifetimes.staleWhileRevalidate
            if stored.lifetimes.staleIfError > 0 {
                loader.failSafeMaxAge = .milliseconds(stored.lifetimes.freshFor.addingSaturated(stored.lifetimes.staleIfError))
            }
        }
        var origin = request
        origin.headerFields[.ifNoneMatch] = nil
        origin.headerFields[.ifModifiedSince] = nil
        // A request served stale at once never runs the refresh itself, even when the loader starts it
        // before returning the stale response.
        let handoff = Handoff(electable: !loader.staleWhileRevalidate)
        let target = Target(request: origin, key: key, base: base, index: index)
        let options = EntryOptions(memoryExpiry: .after(.zero), tiers: policy.tiers)
        let call = Task { [loader] () -> Result<[UInt8]?, any Error> in
            let result: Result<[UInt8]?, any Error>
            do {
                // Anything stored by the loader itself is superseded by the run's own store (it knows the
                // lifetimes); `options` only bound a value that is not: gone at once.
                result = .success(
                    try await cache.valueIfPresent(forKey: key, options: options, loader: loader) { [self] in
                        if let promise = handoff.elect() { return try await promise.value() }
                        // Nobody waits: a background refresh, with the framework's escaping chain.
                        guard let refresh else { return nil }
                        return try await backgroundRun(target, refresh)
                    })
            } catch {
                result = .failure(error)
            }
            handoff.finish(result)
            return result
        }
        switch await handoff.outcome() {
        case .elected(let promise):
            return try await runElected(target, promise: promise, call: call, handler)
        case .finished(.success(let bytes?)):
            return .record(bytes)
        case .finished(.success(nil)):
            return .response(try await handler(request))  // not storable: every request runs it
        case .finished(.failure(let error as ServerError)):
            guard let body = error.body else { return .response(try await handler(request)) }
            return .response(HTTPCacheResponse(head: error.response, body: .bytes(body)))
        case .finished(.failure(let error)):
            if error is MagpieError { return .response(try await handler(request)) }
            throw error
        }
    }

    /// What a load is of.
    private struct Target: Sendable {
        let request: HTTPRequest
        let key: String
        let base: String
        let index: VariantIndex?
    }

    /// What the rules make of a response the handler produced.
    private enum Disposition {
        case serverError
        case passThrough
        case store(Lifetimes)
    }

    private var bodyLimit: Int { min(policy.maximumBodySize, cache.largestStorableValue) }

    private func disposition(of response: HTTPCacheResponse, to request: HTTPRequest) -> Disposition {
        if response.head.status.code >= 500 { return .serverError }
        let now = cache.configuration.clock.now()
        guard case .success(let lifetimes) = StoreRules.lifetimes(request: request, response: response.head, now: now, policy: policy),
            (response.body.contentLength ?? 0) <= bodyLimit
        else { return .passThrough }
        return .store(lifetimes)
    }

    /// The elected request: runs the handler, hands the load its value, and sends what it should.
    private func runElected(
        _ target: Target, promise: Promise, call: Task<Result<[UInt8]?, any Error>, Never>,
        _ handler: (HTTPRequest) async throws -> HTTPCacheResponse
    ) async throws -> Loaded {
        let response: HTTPCacheResponse
        do {
            response = try await handler(target.request)
        } catch {
            promise.fulfil(.failure(error))
            if case .success(let bytes?) = await call.value { return .record(bytes) }  // stale-if-error
            throw error
        }
        switch disposition(of: response, to: target.request) {
        case .serverError:
            var body = response.body.bytes
            if let bytes = body, bytes.count > bodyLimit { body = nil }
            promise.fulfil(.failure(ServerError(response: response.head, body: body)))
            if case .success(let bytes?) = await call.value { return .record(bytes) }  // stale-if-error
            return .response(response)
        case .passThrough:
            promise.fulfil(.success(nil))
            return .response(response)
        case .store(let lifetimes):
            if let bytes = response.body.bytes {
                promise.fulfil(.success(await store(response.head, bytes, lifetimes, target)))
                // The client that caused the store gets its cookies (the entry has none).
                if response.head.headerFields[.setCookie] != nil { return .response(response) }
                guard case .success(let value?) = await call.value else { return .response(response) }
                return .record(value)
            }
            // A stream: sent now, recorded as it goes, stored (and the load answered) when it ends.
            let recorder = Recorder(limit: bodyLimit)
            let original = response.body
            let guardian = RecordingGuard(recorder)
            Task { [self] in
                guard let bytes = await recorder.result() else { return promise.fulfil(.success(nil)) }
                promise.fulfil(.success(await store(response.head, bytes, lifetimes, target)))
            }
            return .response(
                HTTPCacheResponse(
                    head: response.head,
                    body: .stream(contentLength: original.contentLength) { sink in
                        do {
                            try await original.write(to: TeeSink(downstream: sink, recorder: guardian.recorder))
                            guardian.recorder.finish(complete: true)
                        } catch {
                            guardian.recorder.finish(complete: false)
                            throw error
                        }
                    }))
        }
    }

    /// A background refresh's run (nobody to send the response to): the body read here, up to the limit.
    private func backgroundRun(_ target: Target, _ refresh: Handler) async throws -> [UInt8]? {
        let response = try await refresh(target.request)
        switch disposition(of: response, to: target.request) {
        case .serverError:
            throw ServerError(response: response.head, body: response.body.bytes)
        case .passThrough:
            return nil
        case .store(let lifetimes):
            if let bytes = response.body.bytes { return await store(response.head, bytes, lifetimes, target) }
            let recorder = Recorder(limit: bodyLimit)
            do {
                try await response.body.write(to: DrainSink(recorder: recorder))
                recorder.finish(complete: true)
            } catch {
                recorder.finish(complete: false)
            }
            guard let bytes = await recorder.result() else { return nil }
            return await store(response.head, bytes, lifetimes, target)
        }
    }

    /// Stores a response and returns what the loader's callers get: the response's record, or the
    /// URL's index when it varies and the load was of the URL itself. Nil when it could not be stored.
    private func store(_ head: HTTPResponse, _ body: [UInt8], _ lifetimes: Lifetimes, _ target: Target) async -> [UInt8]? {
        let (request, key, base, index) = (target.request, target.key, target.base, target.index)
        let now = cache.configuration.clock.now()
        let record = StoredRecord.response(
            StoredResponse(head: head, body: body, lifetimes: lifetimes, storedAt: now, dropCookies: policy.setCookie == .storeWithoutCookies)
        ).encoded()
        let options = EntryOptions(
            memoryExpiry: .after(.milliseconds(lifetimes.keptFor)), group: policy.tag?(request, head), tiers: policy.tiers,
            freshFor: .milliseconds(lifetimes.freshFor))
        guard let names = StoreRules.varyNames(head.headerFields) else { return nil }
        do {
            if names.isEmpty {
                try await cache.async.set(record, forKey: base, options: options)
                return record
            }
            var current = index ?? VariantIndex(nonce: UInt64.random(in: 1...UInt64.max), names: names)
            if current.names != names { current = VariantIndex(nonce: UInt64.random(in: 1...UInt64.max), names: names) }
            guard let variant = variantKey(base, current, request) else { return nil }
            try await cache.async.set(record, forKey: variant, options: options)
            let indexBytes = StoredRecord.variants(current).encoded()
            if current != index {
                var indexOptions = options
                indexOptions.freshFor = nil
                try await cache.async.set(indexBytes, forKey: base, options: indexOptions)
            }
            return key == base ? indexBytes : record
        } catch {
            return nil
        }
    }

    // MARK: - Serving a stored response

    /// Fields a 304 carries (RFC 9110 §15.4.5), beside `Age`.
    private static let notModifiedFields: Set<String> = [
        "cache-control", "content-location", "date", "etag", "expires", "vary", "last-modified",
    ]

    private func serve(_ stored: StoredResponse, to request: HTTPRequest, now: Int64) -> HTTPCacheResponse {
        var head = stored.head(now: now)
        if Self.notModified(request, stored) {
            var fields = HTTPFields()
            for field in head.headerFields where Self.notModifiedFields.contains(field.name.canonicalName) || field.name == .age {
                fields.append(field)
            }
            return HTTPCacheResponse(head: HTTPResponse(status: .notModified, headerFields: fields))
        }
        if request.method == .head {
            head.headerFields[.contentLength] = String(stored.body.count)
            return HTTPCacheResponse(head: head)
        }
        return HTTPCacheResponse(head: head, body: .bytes(stored.body))
    }

    /// Whether the request's conditional fields match the stored response (RFC 9110 §13.1.2, §13.1.3):
    /// `If-None-Match` by weak comparison, else `If-Modified-Since` against `Last-Modified` (or `Date`).
    static func notModified(_ request: HTTPRequest, _ stored: StoredResponse) -> Bool {
        guard (200..<300).contains(stored.status) else { return false }
        if let condition = request.headerFields[values: .ifNoneMatch].first.map({ _ in
            request.headerFields[values: .ifNoneMatch].joined(separator: ",")
        }) {
            guard let etag = stored.fields[.eTag] else { return false }
            if condition.trimmingWhitespace == "*" { return true }
            let tag = opaqueTag(etag)
            return condition.split(separator: ",").contains { opaqueTag(String($0)) == tag }
        }
        if let text = request.headerFields[.ifModifiedSince], let since = HTTPDate.parse(text) {
            guard let modified = stored.fields[.lastModified].flatMap(HTTPDate.parse) ?? stored.fields[.date].flatMap(HTTPDate.parse)
            else { return stored.storedAt / 1000 * 1000 <= since }
            return modified <= since
        }
        return false
    }

    /// An entity tag without its weakness indicator (weak comparison, RFC 9110 §8.8.3.2).
    private static func opaqueTag(_ text: String) -> String {
        let trimmed = text.trimmingWhitespace
        return trimmed.hasPrefix("W/") ? String(trimmed.dropFirst(2)) : trimmed
    }

    // MARK: - Keys

    /// The key of the request's URL: the prefix, the path and the normalised query (its parameters
    /// sorted, empty ones and ignored ones left out). Nil when too long to be a Magpie key.
    func baseKey(_ request: HTTPRequest) -> String? {
        request.path.flatMap { key(forTarget: $0) }
    }

    func key(forTarget target: String) -> String? {
        if !target.utf8.contains(where: { $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }) {
            let key = policy.keyPrefix + target  // no query: the common case, one concatenation
            return key.utf8.count <= Cache.maximumKeyLength ? key : nil
        }
        var path = Substring(target)
        var query: Substring = ""
        if let mark = target.firstIndex(of: "?") {
            path = target[..<mark]
            query = target[target.index(after: mark)...]
        }
        if let hash = query.firstIndex(of: "#") { query = query[..<hash] }
        if let hash = path.firstIndex(of: "#") { path = path[..<hash] }
        var parameters = query.split(separator: "&").filter { !$0.isEmpty }
        if !policy.ignoredQueryParameters.isEmpty {
            parameters.removeAll { parameter in
                let name = parameter.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).first ?? parameter
                return policy.ignoredQueryParameters.contains(String(name))
            }
        }
        parameters.sort { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        let key = policy.keyPrefix + path + (parameters.isEmpty ? "" : "?" + parameters.joined(separator: "&"))
        return key.utf8.count <= Cache.maximumKeyLength ? key : nil
    }

    /// The key of the request's variant: the URL's key, the index's nonce, and the request's values of
    /// the fields the responses vary on. Nil when too long.
    func variantKey(_ base: String, _ index: VariantIndex, _ request: HTTPRequest) -> String? {
        var key = base + "\u{1}" + String(index.nonce, radix: 16)
        for name in index.names {
            key += "\u{1}" + name + "="
            if let fieldName = HTTPField.Name(name) {
                key += request.headerFields[values: fieldName].map(\.trimmingWhitespace).joined(separator: ",")
            }
        }
        return key.utf8.count <= Cache.maximumKeyLength ? key : nil
    }

    // MARK: - Invalidation

    /// After a successful unsafe request: removes the entries of its URL and of the URLs its
    /// `Location` and `Content-Location` name on this origin (RFC 9111 §4.4).
    private func invalidate(after request: HTTPRequest, response: HTTPResponse) async {
        var targets: [String] = []
        if let path = request.path { targets.append(path) }
        for name in [HTTPField.Name.location, .contentLocation] {
            guard let value = response.headerFields[name] else { continue }
            if value.hasPrefix("/") {
                targets.append(value)
            } else if let authority = request.authority, let scheme = request.scheme,
                value.lowercased().hasPrefix("\(scheme.lowercased())://\(authority.lowercased())/")
            {
                targets.append(String(value.dropFirst(scheme.count + 3 + authority.count)))
            }
        }
        for target in targets {
            try? await invalidate(target: target)
        }
    }
}
