import HTTPTypes
import Magpie
import MagpieHTTPCache
import Synchronization

/// A request a conformance case sends.
public struct ConformanceRequest: Sendable {
    public var method: HTTPRequest.Method
    /// Path and query.
    public var target: String
    public var headers: [(name: String, value: String)]

    public init(_ method: HTTPRequest.Method = .get, _ target: String, headers: [(name: String, value: String)] = []) {
        self.method = method
        self.target = target
        self.headers = headers
    }
}

/// What a framework's client received.
public struct ConformanceResult: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    func header(_ name: String) -> String? {
        headers.first(where: { $0.name.lowercased() == name.lowercased() })?.value
    }
}

/// What the origin (the route's handler) answers for a path.
public struct OriginReply: Sendable {
    public var status: Int
    /// Header fields; a value `@date:+N` is the HTTP date N seconds from the case's clock (N may be
    /// negative).
    public var headers: [(name: String, value: String)]
    /// The body: this text, then `#` and the number of the origin's call (`v#1`, `v#2`), then the
    /// request's value of `echo` when set.
    public var body: String
    public var numbered: Bool
    public var echo: String?
    /// Sent as a stream of this many chunks (nil: one buffer).
    public var chunks: Int?
    /// The handler throws instead of answering.
    public var fails: Bool
    /// The handler sleeps this long (real time) before answering.
    public var delayMilliseconds: Int

    public init(
        _ status: Int = 200, _ headers: [(name: String, value: String)] = [], body: String = "v", numbered: Bool = true,
        echo: String? = nil, chunks: Int? = nil, fails: Bool = false, delayMilliseconds: Int = 0
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.numbered = numbered
        self.echo = echo
        self.chunks = chunks
        self.fails = fails
        self.delayMilliseconds = delayMilliseconds
    }

    /// A 200 with `Cache-Control: cacheControl`.
    public static func cc(_ cacheControl: String, _ more: [(name: String, value: String)] = [], status: Int = 200) -> OriginReply {
        OriginReply(status, [("Cache-Control", cacheControl)] + more)
    }
}

/// What a response must be.
public struct Expect: Sendable {
    public var status: Int
    public var body: String?
    /// The body is one of these (when not empty).
    public var oneOf: [String]
    public var headers: [(name: String, value: String)]
    public var present: [String]
    public var absent: [String]
    /// The origin's calls so far (all paths), checked after the response.
    public var originCalls: Int?

    public init(
        _ status: Int = 200, body: String? = nil, oneOf: [String] = [], headers: [(name: String, value: String)] = [],
        present: [String] = [], absent: [String] = [], calls: Int? = nil
    ) {
        self.status = status
        self.body = body
        self.oneOf = oneOf
        self.headers = headers
        self.present = present
        self.absent = absent
        self.originCalls = calls
    }
}

/// One step of a case.
public enum ConformanceStep: Sendable {
    /// From now on the origin answers `path` (without its query) with this reply.
    case origin(String, OriginReply)
    /// Sends a request and checks the response.
    case send(ConformanceRequest, Expect)
    /// Sends this many copies of a request at once; checks every response.
    case concurrent(Int, ConformanceRequest, Expect)
    /// Sends the request until the response is as expected (a background refresh lands), for up to 5 s.
    case eventually(ConformanceRequest, Expect)
    /// Moves the cache's clock.
    case advance(seconds: Int64)
    /// Removes a tag's responses.
    case invalidate(tag: String)
}

/// One RFC 9111 / RFC 5861 case: a policy, an origin and requests with the responses they must get.
public struct ConformanceCase: Sendable, CustomStringConvertible {
    public var name: String
    /// The rule, by section.
    public var rule: String
    public var policy: HTTPResponseCachePolicy
    public var steps: [ConformanceStep]

    public init(_ name: String, _ rule: String, policy: HTTPResponseCachePolicy = HTTPResponseCachePolicy(), _ steps: [ConformanceStep]) {
        self.name = name
        self.rule = rule
        self.policy = policy
        self.steps = steps
    }

    public var description: String { name }
}

/// A case's world: a memory-only Magpie cache on a clock the case moves, the response cache over it,
/// and the origin. A framework's test builds its application with its middleware over
/// ``responseCache`` and a route for every path and method that answers with ``origin(_:)``, then calls
/// ``run(_:)`` with a closure that sends a request through its testing library.
public final class ConformanceEnvironment: Sendable {
    public let testCase: ConformanceCase
    public let responseCache: HTTPResponseCache
    private let replies = Mutex<[String: OriginReply]>([:])
    private let calls = Atomic<Int>(0)

    /// 2026-01-01T00:00:00Z.
    static let start: Int64 = 1_767_225_600_000

    public init(_ testCase: ConformanceCase) throws {
        self.testCase = testCase
        let box = ClockBox()
        var configuration = Cache.Configuration(memoryBudget: 8 << 20)
        configuration.clock = CacheClock(now: { box.now() })
        configuration.metrics = nil
        self.box = box
        self.responseCache = HTTPResponseCache(cache: try Cache(configuration), policy: testCase.policy)
    }

    private let box: ClockBox

    /// The origin's calls so far.
    public var originCalls: Int { calls.load(ordering: .sequentiallyConsistent) }

    /// The origin: what the route's handler answers for `request` (every path and method).
    public func origin(_ request: HTTPRequest) async throws -> HTTPCacheResponse {
        let target = request.path ?? "/"
        let path = String(target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
        let reply = replies.withLock { $0[path] } ?? OriginReply()
        let number = calls.add(1, ordering: .sequentiallyConsistent).newValue
        if reply.delayMilliseconds > 0 { try await Task.sleep(for: .milliseconds(reply.delayMilliseconds)) }
        struct OriginFailed: Error {}
        if reply.fails { throw OriginFailed() }
        var fields = HTTPFields()
        let now = box.now()
        for (name, value) in reply.headers {
            guard let fieldName = HTTPField.Name(name) else { continue }
            var text = value
            if value.hasPrefix("@date:"), let offset = Int64(value.dropFirst(6)) { text = HTTPDate.format(now + offset * 1000) }
            fields.append(HTTPField(name: fieldName, value: text))
        }
        var body = reply.body
        if reply.numbered { body += "#\(number)" }
        if let echo = reply.echo, let name = HTTPField.Name(echo) {
            body += request.headerFields[values: name].joined(separator: ",")
        }
        let bytes = Array(body.utf8)
        let head = HTTPResponse(status: HTTPResponse.Status(code: reply.status), headerFields: fields)
        guard let chunks = reply.chunks, chunks > 0 else { return HTTPCacheResponse(head: head, body: .bytes(bytes)) }
        let size = max(1, (bytes.count + chunks - 1) / chunks)
        return HTTPCacheResponse(
            head: head,
            body: .stream { sink in
                var offset = 0
                while offset < bytes.count {
                    let end = min(bytes.count, offset + size)
                    try await sink.write(bytes[offset..<end])
                    offset = end
                    await Task.yield()
                }
            })
    }

    /// Runs the case's steps, sending each request with `send`; the failures, one line each (none: the
    /// case passes).
    public func run(_ send: @escaping @Sendable (ConformanceRequest) async throws -> ConformanceResult) async -> [String] {
        let box = self.box
        // Header values `@date:+N` become HTTP dates on the case's clock.
        let send: @Sendable (ConformanceRequest) async throws -> ConformanceResult = { request in
            var request = request
            request.headers = request.headers.map { field in
                guard field.value.hasPrefix("@date:"), let offset = Int64(field.value.dropFirst(6)) else { return field }
                return (field.name, HTTPDate.format(box.now() + offset * 1000))
            }
            return try await send(request)
        }
        var failures: [String] = []
        for (number, step) in testCase.steps.enumerated() {
            let label = "\(testCase.name) step \(number + 1)"
            do {
                switch step {
                case .origin(let path, let reply):
                    replies.withLock { $0[path] = reply }
                case .advance(let seconds):
                    box.advance(seconds * 1000)
                case .invalidate(let tag):
                    try await responseCache.invalidate(tag: tag)
                case .send(let request, let expect):
                    failures += check(try await send(request), expect, label)
                case .concurrent(let count, let request, let expect):
                    let results = try await withThrowingTaskGroup(of: ConformanceResult.self) { group in
                        for _ in 0..<count { group.addTask { try await send(request) } }
                        var results: [ConformanceResult] = []
                        for try await result in group { results.append(result) }
                        return results
                    }
                    var seen: Set<String> = []
                    for result in results {
                        for failure in check(result, expect, label) where seen.insert(failure).inserted { failures.append(failure) }
                    }
                case .eventually(let request, let expect):
                    var last: [String] = []
                    for _ in 0..<500 {
                        last = check(try await send(request), expect, label)
                        if last.isEmpty { break }
                        try await Task.sleep(for: .milliseconds(10))
                    }
                    failures += last
                }
            } catch {
                failures.append("\(label): \(error)")
            }
        }
        return failures
    }

    private func check(_ result: ConformanceResult, _ expect: Expect, _ label: String) -> [String] {
        var failures: [String] = []
        if result.status != expect.status { failures.append("\(label): status \(result.status), expected \(expect.status)") }
        let body = String(decoding: result.body, as: UTF8.self)
        if let expected = expect.body, body != expected { failures.append("\(label): body \"\(body)\", expected \"\(expected)\"") }
        if !expect.oneOf.isEmpty, !expect.oneOf.contains(body) {
            failures.append("\(label): body \"\(body)\", expected one of \(expect.oneOf)")
        }
        for (name, value) in expect.headers where result.header(name) != value {
            failures.append("\(label): \(name) \(result.header(name) ?? "absent"), expected \(value)")
        }
        for name in expect.present where result.header(name) == nil { failures.append("\(label): \(name) absent") }
        for name in expect.absent where result.header(name) != nil { failures.append("\(label): \(name) present") }
        if let calls = expect.originCalls, originCalls != calls {
            failures.append("\(label): \(originCalls) origin calls, expected \(calls)")
        }
        return failures
    }

    /// Closes the cache.
    public func close() {
        try? responseCache.cache.close()
    }
}

/// The case's clock: a Magpie `CacheClock` reads it.
final class ClockBox: Sendable {
    private let clock = Mutex(ConformanceEnvironment.start)
    func now() -> Int64 { clock.withLock { $0 } }
    func advance(_ milliseconds: Int64) { clock.withLock { $0 += milliseconds } }
}
