import HTTPTypes
import Magpie
import MagpieHTTPCache
import Testing

/// What the conformance table does not reach: dates, and values under the cache's keys that are not
/// its records.
@Suite struct RulesTests {
    @Test func httpDatesParseAndFormat() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777_000)
        #expect(HTTPDate.format(784_111_777_000) == "Sun, 06 Nov 1994 08:49:37 GMT")
        for milliseconds: Int64 in [0, 951_782_400_000, 1_767_225_600_000, 4_102_444_799_000] {
            #expect(HTTPDate.parse(HTTPDate.format(milliseconds)) == milliseconds)
        }
        for invalid in ["", "0", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 UTC"]
        {
            #expect(HTTPDate.parse(invalid) == nil, "\(invalid)")
        }
        #expect(HTTPDate.format(-5_000) == "Thu, 01 Jan 1970 00:00:00 GMT")
    }

    @Test func aValueThatIsNotARecordIsAMiss() async throws {
        let cache = try Cache(Cache.Configuration(memoryBudget: 4 << 20))
        defer { try? cache.close() }
        let responses = HTTPResponseCache(cache: cache)
        for garbage: [UInt8] in [[], [1], [1, 0, 255, 255], [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 127], Array(repeating: 0xFF, count: 64)] {
            try cache.set(garbage, forKey: "http:/a")
            var runs = 0
            let request = HTTPRequest(method: .get, scheme: "http", authority: "localhost", path: "/a")
            for _ in 0..<2 {
                let response = try await responses.respond(to: request) { _ in
                    runs += 1
                    return HTTPCacheResponse(head: HTTPResponse(status: .ok, headerFields: [.cacheControl: "max-age=60"]), body: .bytes([7]))
                }
                #expect(response.body.bytes == [7])
            }
            #expect(runs == 1)  // the garbage replaced by the stored response, then a hit
        }
    }
}
