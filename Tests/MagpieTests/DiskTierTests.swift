import Foundation
import Magpie
import Synchronization
import MagpieTestSupport
import Testing

private func config(_ directory: String, budget: Int = 1 << 20, buckets: Int? = 8, clock: CacheClock = .system)
    -> DiskTier.Configuration
{
    DiskTier.Configuration(directory: directory, budget: budget, bucketCount: buckets, clock: clock)
}

private func json(_ i: Int, _ length: Int) -> [UInt8] {
    let line = Array(#"{"id":\#(i),"name":"magpie","tags":["a","b"],"ok":true}"#.utf8)
    return (0..<length).map { line[$0 % line.count] }
}

private func random(_ length: Int, seed: UInt64) -> [UInt8] {
    var generator = SeededGenerator(seed: seed)
    return (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

@Suite("DiskTier: persistence")
struct DiskTierPersistenceTests {
    @Test("values round-trip across close and reopen, raw and compressed, every size")
    func roundTrip() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var expected: [[UInt8]: [UInt8]] = [:]
        do {
            let tier = try DiskTier(config(directory.path))
            for i in 0..<300 {
                let value = i % 2 == 0 ? json(i, i * 13 % 5000) : random(i * 7 % 3000, seed: UInt64(i))
                try tier.set(value, forKey: keyBytes(i))
                expected[keyBytes(i)] = value
            }
            try tier.set([], forKey: [UInt8]())  // empty key, empty value
            expected[[]] = []
            for (key, value) in expected { #expect(try tier.value(forKey: key) == value) }
            let stats = tier.statistics
            #expect(stats.compressionRatio < 0.8)
            #expect(stats.entries == expected.count)
            #expect(stats.indexBytesPerEntry <= 32)
            try tier.close()
        }
        let reopened = try DiskTier(config(directory.path))
        for (key, value) in expected { #expect(try reopened.value(forKey: key) == value) }
        #expect(reopened.statistics.corruptRecords == 0)
        #expect(try reopened.value(forKey: keyBytes(999)) == nil)
    }

    @Test("a clean close leaves index snapshots that the next open uses; a crash or a stale snapshot means a scan")
    func snapshots() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let configuration = config(directory.path, buckets: 8)
        do {
            let tier = try DiskTier(configuration)
            for i in 0..<200 { try tier.set(json(i, 300), forKey: keyBytes(i)) }
            try tier.close()
        }
        let stale = directory.path + "/stale"
        try FileManager.default.createDirectory(atPath: stale, withIntermediateDirectories: false)
        for name in try FileManager.default.contentsOfDirectory(atPath: directory.path + "/buckets") where name.hasSuffix(".index") {
            try FileManager.default.copyItem(atPath: directory.path + "/buckets/" + name, toPath: stale + "/" + name)
        }
        do {
            let tier = try DiskTier(configuration)
            #expect(tier.statistics.bucketsOpenedFromSnapshot == 8)
            #expect(tier.statistics.entries == 200)
            for i in 0..<200 { #expect(try tier.value(forKey: keyBytes(i)) == json(i, 300)) }
            for i in 0..<100 { try tier.removeValue(forKey: keyBytes(i)) }
            // Dropped without close: no snapshot is written.
        }
        do {
            let tier = try DiskTier(configuration)
            #expect(tier.statistics.bucketsOpenedFromSnapshot == 0)
            #expect(tier.statistics.entries == 100)
        }
        // Put the old snapshots back: they describe files that have changed since, and must be refused.
        for name in try FileManager.default.contentsOfDirectory(atPath: stale) {
            try? FileManager.default.removeItem(atPath: directory.path + "/buckets/" + name)
            try FileManager.default.copyItem(atPath: stale + "/" + name, toPath: directory.path + "/buckets/" + name)
        }
        let tier = try DiskTier(configuration)
        #expect(tier.statistics.bucketsOpenedFromSnapshot == 0)
        for i in 0..<200 { #expect(try tier.value(forKey: keyBytes(i)) == (i < 100 ? nil : json(i, 300))) }
    }

    @Test("the newest value wins after reopen, with or without a clean close")
    func newestWins() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        do {
            let tier = try DiskTier(config(directory.path))
            for version in 0..<5 { try tier.set(json(version, 100 + version * 50), forKey: "k") }
            try tier.close()
        }
        do {
            let tier = try DiskTier(config(directory.path))
            #expect(try tier.value(forKey: "k") == json(4, 300))
            try tier.set(json(5, 10), forKey: "k")
            // No close: the object is dropped as after a crash of the process (writes are in the page cache).
        }
        let tier = try DiskTier(config(directory.path))
        #expect(try tier.value(forKey: "k") == json(5, 10))
    }

    @Test("removals survive reopen and compaction, including removal of an evicted key")
    func durableRemoval() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 64 * 1024
        do {
            let tier = try DiskTier(config(directory.path, budget: budget, buckets: 2))
            for i in 0..<20 { try tier.set(json(i, 500), forKey: keyBytes(i)) }
            for i in 0..<10 { #expect(try tier.removeValue(forKey: keyBytes(i))) }
            // Push everything else out, compacting both buckets several times.
            for i in 100..<400 { try tier.set(random(600, seed: UInt64(i)), forKey: keyBytes(i)) }
            #expect(tier.statistics.regionsReclaimed > 2)
            // Key 15 was evicted (its record may still be on disk); removing it must still be durable.
            if try tier.value(forKey: keyBytes(15)) == nil { #expect(try !tier.removeValue(forKey: keyBytes(15))) }
            try tier.removeValue(forKey: keyBytes(15))
            try tier.close()
        }
        let tier = try DiskTier(config(directory.path, budget: budget, buckets: 2))
        for i in 0..<10 { #expect(try tier.value(forKey: keyBytes(i)) == nil, "removed key \(i) came back") }
        #expect(try tier.value(forKey: keyBytes(15)) == nil)
        #expect(directoryBytes(directory.path + "/buckets") <= budget)
    }

    @Test("a group is removed from the tier and stays removed after reopen and compaction")
    func groupRemoval() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let budget = 256 * 1024
        do {
            let tier = try DiskTier(config(directory.path, budget: budget, buckets: 4))
            for i in 0..<40 { try tier.set(json(i, 300), forKey: keyBytes(i), group: i % 2 == 0 ? "alice" : "bob") }
            #expect(try tier.removeAll(inGroup: "alice") == 20)
            for i in 0..<40 { #expect(try (tier.value(forKey: keyBytes(i)) != nil) == (i % 2 == 1)) }
            try tier.set(json(0, 300), forKey: keyBytes(0), group: "alice")  // after the removal: stays
            try tier.close()
        }
        do {
            let tier = try DiskTier(config(directory.path, budget: budget, buckets: 4))
            #expect(try tier.value(forKey: keyBytes(0)) == json(0, 300))
            for i in stride(from: 2, to: 40, by: 2) { #expect(try tier.value(forKey: keyBytes(i)) == nil, "key \(i) of a removed group came back") }
            for i in stride(from: 1, to: 40, by: 2) { #expect(try tier.value(forKey: keyBytes(i)) == json(i, 300)) }
            for i in 1000..<1600 { try tier.set(random(700, seed: UInt64(i)), forKey: keyBytes(i)) }  // compactions
            #expect(tier.statistics.regionsReclaimed > 0)
            try tier.close()
        }
        let tier = try DiskTier(config(directory.path, budget: budget, buckets: 4))
        for i in stride(from: 2, to: 40, by: 2) { #expect(try tier.value(forKey: keyBytes(i)) == nil) }
    }

    @Test("expiry is honoured at once and across reopen, by an injected clock")
    func expiry() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let clock = ManualClock()
        do {
            let tier = try DiskTier(config(directory.path, clock: clock.cacheClock))
            try tier.set(json(1, 100), forKey: "minute", expiry: .after(.seconds(60)))
            try tier.set(json(2, 100), forKey: "forever")
            try tier.set(json(3, 100), forKey: "past", expiry: .at(millisecondsSince1970: clock.now - 1))
            try tier.set(json(4, 100), forKey: "five", expiry: .after(.seconds(5)))
            #expect(try tier.value(forKey: "past") == nil)
            #expect(try tier.value(forKey: "five") == json(4, 100))
            clock.advance(seconds: 59)
            #expect(try tier.value(forKey: "five") == nil)  // at once, without a reopen
            #expect(try tier.value(forKey: "minute") == json(1, 100))
            try tier.close()
        }
        clock.advance(seconds: 2)
        let tier = try DiskTier(config(directory.path, clock: clock.cacheClock))
        #expect(try tier.value(forKey: "minute") == nil)
        #expect(try tier.value(forKey: "forever") == json(2, 100))
        try tier.set(json(4, 100), forKey: "soon", expiry: .after(.seconds(10)))
        clock.advance(seconds: 11)
        #expect(try tier.removeExpired() == 1)
        #expect(tier.statistics.entries == 1)
    }

    /// Found by the libFuzzer target: an expiry near Int64.max overflowed the index's rounding to seconds.
    @Test("far-future expiries (Int64.max instants, huge durations) are stored, read and reopened")
    func farFutureExpiry() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let expiries: [Expiry] = [
            .at(millisecondsSince1970: .max), .at(millisecondsSince1970: .max - 1), .after(.seconds(Int64.max)),
            .after(.seconds(Int64.max / 1000 - 1_700_000_000)),
        ]
        do {
            let tier = try DiskTier(config(directory.path))
            for (i, expiry) in expiries.enumerated() { try tier.set(json(i, 64), forKey: "far-\(i)", expiry: expiry) }
            for i in expiries.indices { #expect(try tier.value(forKey: "far-\(i)") == json(i, 64)) }
            try tier.close()
        }
        let tier = try DiskTier(config(directory.path))
        for i in expiries.indices { #expect(try tier.value(forKey: "far-\(i)") == json(i, 64)) }
        #expect(try tier.removeExpired() == 0)
    }
}

@Suite("DiskTier: budget, errors and hostile input")
struct DiskTierRobustnessTests {
    @Test("a reclaim reinserts the entries of the oldest region read often enough for their size, and evicts the rest")
    func reclaimReinsertsReadEntries() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // One bucket of 16 regions of 2 KiB: 7 records of 200-byte values (64 + 8 + 200 bytes) each.
        let recordLength = 64 + 8 + 200
        var configuration = DiskTier.Configuration(directory: directory.path, budget: 16 * 2048 + 64 + 128, bucketCount: 1, compressionLevel: nil)
        configuration.writeBufferSize = 0  // every store written at once: one reclaim at a time
        let tier = try DiskTier(configuration)
        #expect(tier.configuration.reinsertionThreshold == 5)
        var i = 0
        while tier.statistics.regionsReclaimed == 0 {
            try tier.set(random(200, seed: UInt64(i)), forKey: keyBytes(i))
            if i == 60 {  // the bucket is nearly full: read the even ones of the first 20, five times each
                for _ in 0..<5 { for j in stride(from: 0, to: 20, by: 2) { #expect(try tier.value(forKey: keyBytes(j)) != nil) } }
            }
            i += 1
        }
        let statistics = tier.statistics
        // The oldest region held keys 0..<7: the even ones were read five times (as often as the threshold
        // asks of a record of the mean length), the odd ones never.
        #expect(statistics.reinsertions == 4 && statistics.reinsertedBytes == UInt64(4 * recordLength))
        #expect(statistics.evictions == 3)
        for j in 0..<20 {
            let held = try tier.value(forKey: keyBytes(j)) != nil
            #expect(held == (j % 2 == 0 || j >= 7), "key \(j)")
        }
    }

    @Test("random operations: reads are nil or the last value set, and the files stay within the budget")
    func budgetInvariant() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let seed = TestSeed.value(default: 31_337)
        var generator = SeededGenerator(seed: seed)
        let budget = 96 * 1024
        let tier = try DiskTier(config(directory.path, budget: budget, buckets: 4))
        var model: [Int: [UInt8]] = [:]
        for step in 0..<3000 {
            let key = Int.random(in: 0..<150, using: &generator)
            switch Int.random(in: 0..<10, using: &generator) {
            case 0..<5:
                let length = Int.random(in: 0...2500, using: &generator)
                let value = step % 2 == 0 ? json(step, length) : random(length, seed: UInt64(step))
                try tier.set(value, forKey: keyBytes(key), group: key % 3 == 0 ? "g" : nil)
                model[key] = value
            case 5..<8:
                let got = try tier.value(forKey: keyBytes(key))
                if let got { #expect(got == model[key], "seed \(seed) step \(step): wrong value for \(key)") }
            case 8:
                try tier.removeValue(forKey: keyBytes(key))
                model[key] = nil
            default:
                if step % 50 == 0 {
                    try tier.removeAll(inGroup: "g")
                    for k in model.keys where k % 3 == 0 { model[k] = nil }
                }
            }
            let stats = tier.statistics
            #expect(stats.bytesOnDisk <= budget)
            #expect(tier.directoryBytes(directory.path + "/buckets") <= budget, "seed \(seed) step \(step)")
        }
        #expect(tier.statistics.evictions > 0 && tier.statistics.regionsReclaimed > 0)
    }

    @Test("a second opener, in this process, gets directoryLocked; after close it opens")
    func locked() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let first = try DiskTier(config(directory.path))
        let error = #expect(throws: MagpieError.self) { _ = try DiskTier(config(directory.path)) }
        #expect(error?.code == .directoryLocked)
        try first.close()
        #expect(throws: MagpieError.self) { try first.set([1], forKey: "x") }
        _ = try DiskTier(config(directory.path))
    }

    @Test("foreign files, a garbage MANIFEST and a bucket-count mismatch are clear errors; destroy resets")
    func unusableDirectories() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let foreign = directory.child("photos")
        try FileManager.default.createDirectory(atPath: foreign, withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: foreign + "/holiday.jpg", contents: Data([1, 2, 3])))
        #expect(throws: MagpieError.self) { _ = try DiskTier(config(foreign)) }
        #expect(FileManager.default.fileExists(atPath: foreign + "/holiday.jpg"))

        let cache = directory.child("cache")
        try DiskTier(config(cache, buckets: 8)).close()
        let mismatch = #expect(throws: MagpieError.self) { _ = try DiskTier(config(cache, buckets: 16)) }
        #expect(mismatch?.code == .manifestMismatch)
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: cache + "/MANIFEST"))
        let garbage = #expect(throws: MagpieError.self) { _ = try DiskTier(config(cache, buckets: 8)) }
        #expect(garbage?.code == .directoryUnusable)
        try DiskTier.destroy(directory: cache)
        let fresh = try DiskTier(config(cache, buckets: 16))
        #expect(fresh.bucketCount == 16)

        let missingParent = directory.child("no/such/parent")
        #expect(throws: MagpieError.self) { _ = try DiskTier(config(missingParent)) }
        #expect(throws: MagpieError.self) { _ = try DiskTier(config(directory.child("bad"), buckets: 3)) }
        #expect(throws: MagpieError.self) { _ = try DiskTier(config(directory.child("tiny"), budget: 100, buckets: 8)) }
        // More than 32 GiB per bucket file cannot be indexed: a clear error, not an overflow later.
        let huge = #expect(throws: MagpieError.self) { _ = try DiskTier(config(directory.child("huge"), budget: 1 << 40, buckets: 16)) }
        #expect(huge?.code == .invalidConfiguration)
        #expect(!FileManager.default.fileExists(atPath: directory.child("huge") + "/MANIFEST"), "a refused open left a MANIFEST")
    }

    @Test("an unwritable directory is a clear error at open, not a trap")
    func unwritableDirectory() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let prefix = directory.path
        // As root, chmod cannot make a directory unwritable, so the refusal is injected at open(2).
        FileIOFaults.set(under: prefix) { call, path in call == "open" ? EACCES : nil }
        defer { FileIOFaults.set(under: prefix, nil) }
        let error = #expect(throws: MagpieError.self) { _ = try DiskTier(config(directory.child("cache"))) }
        #expect(error?.code == .directoryUnusable)
        #expect(error?.errno == EACCES)
    }

    @Test("hostile keys are stored and read back; over-limit keys and oversized values are refused")
    func hostileKeys() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(config(directory.path, budget: 8 << 20))
        let keys: [[UInt8]] = [
            [], Array("/".utf8), Array("../../etc/passwd".utf8), [0, 0, 0], [0xff, 0xfe, 0xc0, 0x80],
            Array(String(repeating: "é/", count: 1000).utf8), [UInt8](repeating: 0x2e, count: DiskTier.maximumKeyLength),
        ]
        for (i, key) in keys.enumerated() { try tier.set(json(i, 50), forKey: key) }
        for (i, key) in keys.enumerated() { #expect(try tier.value(forKey: key) == json(i, 50)) }
        #expect(FileManager.default.fileExists(atPath: directory.path + "/etc") == false)
        let tooLong = #expect(throws: MagpieError.self) {
            try tier.set([1], forKey: [UInt8](repeating: 1, count: DiskTier.maximumKeyLength + 1))
        }
        #expect(tooLong?.code == .keyTooLong)
        try tier.set(json(7, 10), forKey: "big")
        let tooLarge = #expect(throws: MagpieError.self) {
            try tier.set(random(tier.largestStorableValue + 1, seed: 1), forKey: "big")
        }
        #expect(tooLarge?.code == .valueTooLarge)
        #expect(try tier.value(forKey: "big") == json(7, 10))
    }

    @Test("ENOSPC and other write failures are errors, and the tier stays consistent and usable")
    func injectedWriteFailures() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // Every record written through, so that each call meets its own failure (the memtables'
        // failures are DiskMemtableTests').
        var configuration = config(directory.path, budget: 64 * 1024, buckets: 2)
        configuration.writeBufferSize = 0
        let tier = try DiskTier(configuration)
        try tier.set(json(1, 200), forKey: "kept")
        // A member of "g" in the file: removing the group must write a group tombstone, which fails.
        try tier.set(json(4, 100), forKey: "member", group: "g")
        let prefix = directory.path
        FileIOFaults.set(under: prefix) { call, path in call == "pwrite" ? ENOSPC : nil }
        let full = #expect(throws: MagpieError.self) { try tier.set(json(2, 200), forKey: "kept") }
        #expect(full?.code == .noSpace)
        #expect(throws: MagpieError.self) { try tier.removeValue(forKey: "kept") }
        #expect(throws: MagpieError.self) { try tier.removeAll(inGroup: "g") }
        FileIOFaults.set(under: prefix) { call, path in call == "fsync" ? EIO : nil }
        #expect(throws: MagpieError.self) { try tier.flush() }
        // Every third write fails, while the stores below fill the regions and reclaim them: a failed
        // record, region header or tombstone leaves the index as it was, never pointing at unwritten bytes.
        let writes = Atomic<Int>(0)
        FileIOFaults.set(under: prefix) { call, path in
            call == "pwrite" && writes.add(1, ordering: .relaxed).newValue % 3 == 0 ? EIO : nil
        }
        for i in 0..<200 { _ = try? tier.set(random(900, seed: UInt64(i)), forKey: keyBytes(i)) }
        FileIOFaults.set(under: prefix, nil)
        // "kept" may have been evicted by the writes above, but it is never anything but its own value.
        let kept = try tier.value(forKey: "kept")
        #expect(kept == nil || kept == json(1, 200))
        try tier.set(json(3, 200), forKey: "after")
        #expect(try tier.value(forKey: "after") == json(3, 200))
        try tier.close()
        let reopened = try DiskTier(config(directory.path, budget: 64 * 1024, buckets: 2))
        #expect(try reopened.value(forKey: "after") == json(3, 200))
        #expect(reopened.statistics.corruptRecords == 0)
        #expect(directoryBytes(directory.path + "/buckets") <= 64 * 1024)
    }
}

@Suite("DiskTier: concurrency")
struct DiskTierConcurrencyTests {
    @Test("many tasks on overlapping keys, with evictions and compactions: every read belongs to its key")
    func concurrent() async throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(.init(directory: directory.path, budget: 512 * 1024, bucketCount: 4))
        let wrong = await withTaskGroup(of: Int.self) { group in
            for task in 0..<8 {
                group.addTask {
                    var generator = SeededGenerator(seed: UInt64(task) &+ 900)
                    var wrong = 0
                    for step in 0..<1500 {
                        let key = Int.random(in: 0..<400, using: &generator)
                        switch Int.random(in: 0..<10, using: &generator) {
                        case 0..<5:
                            let value = selfDescribingValue(key: key, version: task * 100_000 + step, length: Int.random(in: 0...3000, using: &generator))
                            _ = try? tier.set(value, forKey: keyBytes(key), group: key % 7 == 0 ? "seven" : nil)
                        case 5..<8:
                            if let value = try? tier.value(forKey: keyBytes(key)), !value.isEmpty,
                                !value.starts(with: Array("k\(key)v".utf8).prefix(value.count))
                            {
                                wrong += 1
                            }
                        case 8:
                            _ = try? tier.removeValue(forKey: keyBytes(key))
                        default:
                            if step % 300 == 0 { _ = try? tier.removeAll(inGroup: "seven") }
                        }
                    }
                    return wrong
                }
            }
            return await group.reduce(0, +)
        }
        #expect(wrong == 0)
        let stats = tier.statistics
        #expect(stats.regionsReclaimed > 0 && stats.corruptRecords == 0)
        #expect(stats.bytesOnDisk <= 512 * 1024)
        try tier.close()
        let reopened = try DiskTier(.init(directory: directory.path, budget: 512 * 1024, bucketCount: 4))
        for key in 0..<400 {
            if let value = try reopened.value(forKey: keyBytes(key)), !value.isEmpty {
                #expect(value.starts(with: Array("k\(key)v".utf8).prefix(value.count)))
            }
        }
    }
}
