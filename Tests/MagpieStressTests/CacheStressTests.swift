import Foundation
import Synchronization
import MagpieTestSupport
import Testing

@testable import Magpie

@Suite("Cache: hostile input")
struct CacheHostileInputTests {
    @Test("odd keys are ordinary keys: empty, path-like, NUL, invalid UTF-8, 64 KiB; over-limit keys throw")
    func oddKeys() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let keys: [[UInt8]] = [
            [], Array("/".utf8), Array("../../etc/passwd".utf8), Array("..".utf8), [0], [0, 0, 0x2f, 0],
            [0xff, 0xfe, 0xc3], Array("ключ/🔑".utf8), [UInt8](repeating: 0x2e, count: 65_535),
        ]
        do {
            let cache = try makeCache(directory, memoryBudget: 4 << 20, diskBudget: 8 << 20)
            for (i, key) in keys.enumerated() { try cache.set(selfDescribingValue(key: i, version: 1, length: 50), forKey: key) }
            for (i, key) in keys.enumerated() { #expect(try cache.value(forKey: key) == selfDescribingValue(key: i, version: 1, length: 50)) }
            let tooLong = [UInt8](repeating: 1, count: 65_536)
            let error = #expect(throws: MagpieError.self) { try cache.set([1], forKey: tooLong) }
            #expect(error?.code == .keyTooLong)
            #expect(throws: MagpieError.self) { try cache.value(forKey: tooLong) }
            #expect(throws: MagpieError.self) { try cache.set([1], forKey: "k", options: EntryOptions(group: String(repeating: "g", count: 70_000))) }
            try cache.close()
        }
        // Nothing outside the cache directory was created, and keys never became file names.
        let names = try FileManager.default.subpathsOfDirectory(atPath: directory.path).sorted()
        #expect(names.allSatisfy { $0 == "MANIFEST" || $0 == "LOCK" || $0 == "buckets" || $0.hasPrefix("buckets/") })
        let cache = try makeCache(directory, memoryBudget: 4 << 20, diskBudget: 8 << 20)
        for (i, key) in keys.enumerated() { #expect(try cache.value(forKey: key) == selfDescribingValue(key: i, version: 1, length: 50)) }
    }

    @Test("zero, tiny and invalid budgets: store nothing or throw invalidConfiguration, never trap")
    func budgets() throws {
        let zero = try Cache(memoryBudget: 0)
        try zero.set([1, 2, 3], forKey: "k")
        #expect(zero["k"] == nil)
        let tiny = try Cache(memoryBudget: 100)
        try tiny.set([UInt8](repeating: 1, count: 1000), forKey: "k")
        #expect(tiny["k"] == nil)
        #expect(throws: MagpieError.self) { try Cache(memoryBudget: -1) }
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        #expect(throws: MagpieError.self) { try Cache(Cache.Configuration(directory: directory.child("c"), diskBudget: 0)) }
        var odd = Cache.Configuration(directory: directory.child("d"), memoryBudget: 1 << 20, diskBudget: 1 << 20)
        odd.disk?.bucketCount = 3
        #expect(throws: MagpieError.self) { try Cache(odd) }
        // A 16 KiB disk tier: values larger than a bucket can borrow throw, the rest work.
        var small = Cache.Configuration(directory: directory.child("e"), memoryBudget: 0, diskBudget: 16 << 10)
        small.disk?.bucketCount = 4
        let cache = try Cache(small)
        try cache.set([], forKey: "empty")
        #expect(cache["empty"] == [])
        var generator = SeededGenerator(seed: 1)
        let incompressible = (0..<(12 << 10)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        #expect(throws: MagpieError.self) { try cache.set(incompressible, forKey: "big") }
        for i in 0..<200 { try cache.set(selfDescribingValue(key: i, version: 0, length: 500), forKey: "k\(i)") }
        try cache.flush()  // every buffered store written, and no write left in the background while the files are read
        #expect(directoryBytes(directory.child("e") + "/buckets") <= 16 << 10)
    }

    @Test("an unwritable or missing parent directory is a clear error; a second opener gets directoryLocked")
    func directories() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let missing = Cache.Configuration(directory: directory.child("no/such/parent"))
        #expect(throws: MagpieError.self) { try Cache(missing) }
        let first = try Cache(Cache.Configuration(directory: directory.child("c")))
        let error = #expect(throws: MagpieError.self) { try Cache(Cache.Configuration(directory: directory.child("c"))) }
        #expect(error?.code == .directoryLocked)
        try first.close()
        _ = try Cache(Cache.Configuration(directory: directory.child("c")))
        if getuid() != 0 {  // root writes anywhere: the read-only case only means something for other users
            let readOnly = directory.child("ro")
            try FileManager.default.createDirectory(atPath: readOnly, withIntermediateDirectories: false)
            chmod(readOnly, 0o500)
            #expect(throws: MagpieError.self) { try Cache(Cache.Configuration(directory: readOnly + "/cache")) }
        }
    }
}

/// Strings collected from many tasks.
private final class Collected: Sendable {
    let items = Locked<[String]>([])
}

/// The synchronous API, called from async code (where the async overloads would be chosen).
private func syncSet(_ cache: Cache, _ value: [UInt8], _ key: String, _ options: EntryOptions) throws {
    try cache.set(value, forKey: key, options: options)
}

private func syncValue(_ cache: Cache, _ key: String) throws -> [UInt8]? {
    try cache.value(forKey: key)
}

@Suite("Cache: concurrency stress")
struct CacheStressTests {
    /// Operations per task: MAGPIE_STRESS_OPS, default 600 (CI).
    static var operations: Int { ProcessInfo.processInfo.environment["MAGPIE_STRESS_OPS"].flatMap(Int.init) ?? 600 }

    @Test("2 × cores tasks mixing every operation (loader, group removal, remove all) on shared keys: every read belongs to its key")
    func everything() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let cache = try makeCache(directory, memoryBudget: 24 << 10, diskBudget: 256 << 10, buckets: 4)
        let seed = TestSeed.value(default: 77)
        let tasks = max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)
        let wrong = Collected()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<tasks {
                group.addTask {
                    var generator = SeededGenerator(seed: seed &+ UInt64(task))
                    for step in 0..<Self.operations {
                        let key = Int.random(in: 0..<40, using: &generator)
                        let name = "k\(key)"
                        let options = EntryOptions(
                            group: "g\(key % 3)", tiers: [.memoryAndDisk, .memoryOnly, .diskOnly][step % 3])
                        let value = selfDescribingValue(key: key, version: task * 1_000_000 + step, length: 200 + key * 7)
                        var read: [UInt8]? = nil
                        switch Int.random(in: 0..<100, using: &generator) {
                        case 0..<30: try await cache.async.set(value, forKey: name, options: options)
                        case 30..<35: try syncSet(cache, value, name, options)
                        case 35..<60: read = try await cache.async.value(forKey: name)
                        case 60..<70: read = try syncValue(cache, name)
                        case 70..<80: read = try await cache.value(forKey: name, options: options) { value }
                        case 80..<88: try await cache.async.removeValue(forKey: name)
                        case 88..<92: try await cache.async.removeAll(inGroup: "g\(key % 3)")
                        case 92..<93: try await cache.async.removeAll()
                        case 93..<96: _ = try await cache.async.contains(name)
                        case 96..<98: try await cache.async.removeExpired()
                        default: _ = cache.statistics
                        }
                        if let read, !read.starts(with: Array("k\(key)v".utf8)) {
                            wrong.items.withLock { $0.append("task \(task) step \(step): \(name) read \(read.prefix(16))") }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        let violations = wrong.items.withLock { $0 }
        #expect(violations.isEmpty, "seed \(seed): \(violations.prefix(5))")
        let stats = cache.statistics
        #expect(stats.memory.chargedBytes <= 24 << 10)
        #expect(stats.disk!.bytesOnDisk <= 256 << 10)
        #expect(stats.diskErrors == 0)
    }
}
