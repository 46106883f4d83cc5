import Foundation
import Magpie
import MagpieTestSupport
import Testing

struct Profile: Codable, Sendable {
    var name: String
}

func downloadAvatar(_ id: Int) async throws -> [UInt8] {
    [UInt8(id)]
}

@Suite("README")
struct ReadmeExampleTests {
    // README-EXAMPLE-BEGIN
    // `async`: the README's synchronous calls must compile inside an async function too.
    func example(directory: String) async throws -> ([UInt8]?, RemovedEntries, String?) {
        // Memory (64 MiB) in front of disk (1 GiB) in `directory`; without a directory, memory only.
        let cache = try Cache(Cache.Configuration(directory: directory, memoryBudget: 64 << 20, diskBudget: 1 << 30))

        cache["greeting"] = Array("hello, magpie".utf8)  // both tiers
        let greeting = cache["greeting"]  // memory, else disk (then promoted into memory)

        // Five minutes in memory, a day on disk, removed together with the rest of user 7's entries:
        let options = EntryOptions(memoryExpiry: .after(.seconds(300)), diskExpiry: .after(.seconds(86_400)), group: "user:7")
        try cache.set(Array("session data".utf8), forKey: "session:42", options: options)
        let removed = try cache.removeAll(inGroup: "user:7")  // both tiers, durably

        // Any Codable value, JSON by default (pass any CacheCoder):
        let profiles = cache.typed(Profile.self)
        try profiles.set(Profile(name: "Ada"), forKey: "profile:1")
        let name = try profiles.value(forKey: "profile:1")?.name

        try cache.close()  // leaves index snapshots for a fast reopen
        return (greeting, removed, name)
    }
    // README-EXAMPLE-END

    // README-ASYNC-EXAMPLE-BEGIN
    func asyncExample(cache: Cache) async throws -> [UInt8] {
        try await cache.async.set(Array("hi".utf8), forKey: "note:1")  // the disk write runs on an I/O thread
        let note = try await cache.async.value(forKey: "note:1")  // a memory hit returns without a hop
        let avatar = try await cache.value(forKey: "avatar:42") {
            try await downloadAvatar(42)  // runs once for all concurrent callers; errors reach them all, uncached
        }
        return avatar + (note ?? [])
    }
    // README-ASYNC-EXAMPLE-END

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
    func runs() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (greeting, removed, name) = try await example(directory: directory.child("cache"))
        #expect(greeting == Array("hello, magpie".utf8))
        #expect(removed == RemovedEntries(memory: 1, disk: 1))
        #expect(name == "Ada")
        let reopened = try Cache(Cache.Configuration(directory: directory.child("cache")))
        #expect(reopened["greeting"] == Array("hello, magpie".utf8))
        #expect(reopened["session:42"] == nil)
        #expect(try await asyncExample(cache: reopened) == [42] + Array("hi".utf8))
        #expect(try await asyncExample(cache: reopened) == [42] + Array("hi".utf8))
    }

    @Test("the README shows the same code as this test")
    func matchesReadme() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: URL(fileURLWithPath: #filePath), encoding: .utf8)
        let readmeLines = Set(readme.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
        for marker in ["README-EXAMPLE-", "README-ASYNC-EXAMPLE-", "README-DISK-EXAMPLE-"] {
            let begin = source.range(of: "// " + marker + "BEGIN")!.upperBound
            let end = source.range(of: "    // " + marker + "END")!.lowerBound
            let body = source[begin..<end].split(separator: "\n").dropFirst(2).dropLast(2)  // func line, return
            for line in body.map({ $0.trimmingCharacters(in: .whitespaces) }) where !line.isEmpty {
                #expect(readmeLines.contains(line), "README.md is missing the example line: \(line)")
            }
        }
    }
}
