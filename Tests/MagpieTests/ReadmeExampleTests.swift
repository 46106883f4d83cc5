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

    // README-DISK-EXAMPLE-BEGIN
    func diskExample(directory: String) throws -> ([UInt8]?, Int) {
        // 256 MiB of disk in `directory`; values of 64 bytes or more are zstd-compressed when that pays.
        let disk = try DiskTier(.init(directory: directory, budget: 256 << 20))

        try disk.set(Array("session data".utf8), forKey: "session:42", expiry: .after(.seconds(3600)), group: "user:7")
        let stored = try disk.value(forKey: "session:42")

        let removed = try disk.removeAll(inGroup: "user:7")  // durably: it stays removed after a restart
        try disk.close()  // flushes, and leaves index snapshots for a fast reopen
        return (stored, removed)
    }
    // README-DISK-EXAMPLE-END

    @Test("the README's disk example compiles and does what it says")
    func diskRuns() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (stored, removed) = try diskExample(directory: directory.child("cache"))
        #expect(stored == Array("session data".utf8))
        #expect(removed == 1)
    }

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
        let readmeLines = Set(readme.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
        for marker in ["README-EXAMPLE-", "README-DISK-EXAMPLE-"] {
            let begin = source.range(of: "// " + marker + "BEGIN")!.upperBound
            let end = source.range(of: "    // " + marker + "END")!.lowerBound
            let body = source[begin..<end].split(separator: "\n").dropFirst(2).dropLast(2)  // func line, return
            for line in body.map({ $0.trimmingCharacters(in: .whitespaces) }) where !line.isEmpty {
                #expect(readmeLines.contains(line), "README.md is missing the example line: \(line)")
            }
        }
    }
}
