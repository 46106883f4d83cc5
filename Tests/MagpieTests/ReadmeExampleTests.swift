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
    // README-QUICKSTART-BEGIN
    // The quick start of README.md and of the DocC article "Getting started", line for line.
    func quickStart(directory: String) async throws -> ([UInt8]?, [UInt8]?, [UInt8]) {
        let memory = try Cache(Cache.Configuration(memoryBudget: 64 << 20))  // memory only, 64 MiB
        memory["greeting"] = Array("hello, magpie".utf8)
        let greeting = memory["greeting"]  // [UInt8]?, nil once evicted

        // Two tiers: 64 MiB of memory in front of 1 GiB of disk in `directory`, kept across restarts.
        let cache = try Cache(Cache.Configuration(directory: directory, memoryBudget: 64 << 20, diskBudget: 1 << 30))
        try cache.set(Array("session data".utf8), forKey: "session:42", options: .expiring(.after(.seconds(3600))))
        let session = try cache.value(forKey: "session:42")  // memory, else disk (then promoted into memory)

        // Async, with a loader: one download however many callers miss "avatar:42" at once.
        let avatar = try await cache.value(forKey: "avatar:42") { try await downloadAvatar(42) }
        try cache.close()  // flushes, and leaves index snapshots for a fast reopen
        return (greeting, session, avatar)
    }
    // README-QUICKSTART-END

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

    // The async and disk-tier examples that README.md showed before its quick start: kept as tests of the calls.
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

    @Test("the quick start compiles and does what it says")
    func quickStartRuns() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let (greeting, session, avatar) = try await quickStart(directory: directory.child("cache"))
        #expect(greeting == Array("hello, magpie".utf8))
        #expect(session == Array("session data".utf8))
        #expect(avatar == [42])
        let reopened = try Cache(Cache.Configuration(directory: directory.child("cache")))
        #expect(reopened["session:42"] == Array("session data".utf8))
        #expect(reopened["avatar:42"] == [42])
        try reopened.close()
    }

    /// The statements of the function between `// MARKER-BEGIN` and `// MARKER-END` in this file: the lines
    /// after its `func` line and before its `return`, without the function's indentation.
    static func body(of marker: String) throws -> String {
        let source = try String(contentsOf: URL(fileURLWithPath: #filePath), encoding: .utf8)
        let begin = try #require(source.range(of: "// " + marker + "BEGIN")).upperBound
        let end = try #require(source.range(of: "    // " + marker + "END")).lowerBound
        let lines = source[begin..<end].split(separator: "\n", omittingEmptySubsequences: false)
        let start = try #require(lines.firstIndex { $0.hasPrefix("    func ") }) + 1
        let stop = try #require(lines.lastIndex { $0.hasPrefix("        return ") })
        return lines[start..<stop].map { $0.hasPrefix("        ") ? String($0.dropFirst(8)) : String($0) }.joined(separator: "\n")
    }

    static func file(_ path: String) throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        return try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
    }

    @Test("README.md and the DocC article Getting started show this file's quick start, line for line, in one block")
    func quickStartMatches() throws {
        let block = "```swift\nimport Magpie\n\n" + (try Self.body(of: "README-QUICKSTART-")) + "\n```"
        #expect(try Self.file("README.md").contains(block), "README.md's quick start differs from ReadmeExampleTests.quickStart")
        #expect(
            try Self.file("Sources/Magpie/Magpie.docc/GettingStarted.md").contains(block),
            "GettingStarted.md's quick start differs from ReadmeExampleTests.quickStart")
    }

    @Test("README.md shows this file's example, line for line, in one block")
    func exampleMatches() throws {
        let block = "```swift\nimport Magpie\n\n" + (try Self.body(of: "README-EXAMPLE-")) + "\n```"
        #expect(try Self.file("README.md").contains(block), "README.md's example differs from ReadmeExampleTests.example")
    }

    @Test("README.md and Getting started name the same Debian packages as the Makefile's deps")
    func installMatches() throws {
        let makefile = try Self.file("Makefile")
        let line = try #require(makefile.split(separator: "\n").first { $0.hasPrefix("APT_PACKAGES := ") })
        let packages = line.dropFirst("APT_PACKAGES := ".count).split(separator: " ").joined(separator: " ")
        for path in ["README.md", "Sources/Magpie/Magpie.docc/GettingStarted.md"] {
            #expect(try Self.file(path).contains("apt-get install -y \(packages)"), "\(path) does not install \(packages)")
        }
    }
}
