import HTTPTypes
import MagpieHTTPCache
import MagpieHTTPCacheConformance
import Synchronization
import Testing

/// The conformance table straight through `HTTPResponseCache.respond` (no framework): the rules'
/// own check, before each middleware runs the same table through its framework.
@Suite struct ConformanceDirectTests {
    @Test(arguments: HTTPCacheConformance.cases, [false, true])
    func conformance(_ testCase: ConformanceCase, backgroundRefresh: Bool) async throws {
        try await Self.run(testCase, backgroundRefresh: backgroundRefresh)
    }

    @Test(arguments: HTTPCacheConformance.backgroundRefreshCases)
    func backgroundRefresh(_ testCase: ConformanceCase) async throws {
        try await Self.run(testCase, backgroundRefresh: true)
    }

    static func run(_ testCase: ConformanceCase, backgroundRefresh: Bool) async throws {
        let environment = try ConformanceEnvironment(testCase)
        defer { environment.close() }
        let failures = await environment.run { request in
            var fields = HTTPFields()
            for (name, value) in request.headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
            let head = HTTPRequest(method: request.method, scheme: "http", authority: "localhost", path: request.target, headerFields: fields)
            let origin: HTTPResponseCache.Handler = { try await environment.origin($0) }
            let response = try await environment.responseCache.respond(to: head, refresh: backgroundRefresh ? origin : nil, handler: origin)
            let collector = Collector()
            try await response.body.write(to: collector)
            var headers: [(name: String, value: String)] = []
            for field in response.head.headerFields { headers.append((field.name.rawName, field.value)) }
            return ConformanceResult(status: response.head.status.code, headers: headers, body: request.method == .head ? [] : collector.bytes)
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    @Test func atLeastThirtyCases() {
        #expect(HTTPCacheConformance.cases.count >= 30)
        #expect(Set(HTTPCacheConformance.cases.map(\.name)).count == HTTPCacheConformance.cases.count)
    }
}

final class Collector: HTTPCacheBodySink, Sendable {
    private let state = Mutex<[UInt8]>([])
    var bytes: [UInt8] { state.withLock { $0 } }
    func write(_ chunk: ArraySlice<UInt8>) async throws { state.withLock { $0.append(contentsOf: chunk) } }
}
