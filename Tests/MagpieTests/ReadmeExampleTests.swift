import Foundation
import Magpie
import Testing

@Suite("README")
struct ReadmeExampleTests {
    // README-EXAMPLE-BEGIN
    func example() throws -> (String?, Int?) {
        // 64 MiB of memory, split over the default number of shards.
        let cache = try MemoryTier(budget: 64 << 20)

        try cache.set(Array("hello, magpie".utf8), forKey: "greeting")

        // A copy of the value, as [UInt8]:
        let text = cache.value(forKey: "greeting").map { String(decoding: $0, as: UTF8.self) }
        // Or read it in place, without a copy:
        let length = cache.withValue(forKey: "greeting") { bytes in bytes.count }

        cache.removeValue(forKey: "greeting")
        print(cache.statistics.hits, cache.statistics.misses)
        return (text, length)
    }
    // README-EXAMPLE-END

    @Test("the README's example compiles and does what it says")
    func runs() throws {
        let (text, length) = try example()
        #expect(text == "hello, magpie")
        #expect(length == 13)
    }

    @Test("the README shows the same code as this test")
    func matchesReadme() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: URL(fileURLWithPath: #filePath), encoding: .utf8)
        let begin = source.range(of: "// README-EXAMPLE-" + "BEGIN")!.upperBound
        let end = source.range(of: "    // README-EXAMPLE-" + "END")!.lowerBound
        let body = source[begin..<end].split(separator: "\n").dropFirst(2).dropLast(2)  // func line, return
        let readmeLines = Set(readme.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
        for line in body.map({ $0.trimmingCharacters(in: .whitespaces) }) where !line.isEmpty {
            #expect(readmeLines.contains(line), "README.md is missing the example line: \(line)")
        }
    }
}
