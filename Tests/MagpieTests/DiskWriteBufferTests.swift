import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// The disk tier's write buffer (Bucket+WriteBuffer.swift): what is in the file when, what a crash
/// keeps, what a failed buffer write loses.
@Suite("DiskTier: write buffer")
struct DiskWriteBufferTests {
    /// One bucket, so that every record goes through the same buffer.
    static func configuration(_ path: String, buffer: Int = 64 << 10) -> DiskTier.Configuration {
        var configuration = DiskTier.Configuration(
            directory: path, budget: 4 << 20, bucketCount: 1, compressionLevel: nil, hashSeed: 17)
        configuration.writeBufferSize = buffer
        return configuration
    }

    static func fileSize(_ path: String) -> Int {
        let file = DiskMappedReadTests.bucketFiles(path)[0]
        return (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? -1
    }

    /// What a SIGKILL would leave: the files as the kernel has them now, copied while the tier is open.
    static func crashImage(of path: String, to copy: String) throws {
        try FileManager.default.createDirectory(atPath: copy + "/buckets", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: path + "/MANIFEST", toPath: copy + "/MANIFEST")
        for file in DiskMappedReadTests.bucketFiles(path) {
            try FileManager.default.copyItem(atPath: file, toPath: copy + "/buckets/" + (file as NSString).lastPathComponent)
        }
    }

    @Test("buffered stores are served before they reach the file, and reach it when the buffer fills or on flush")
    func servedFromBuffer() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path))
        _ = tier.statistics  // every bucket loaded: a new file gets its header when its bucket loads
        let empty = Self.fileSize(directory.path)
        for i in 0..<10 { try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i)) }
        #expect(Self.fileSize(directory.path) == empty, "a store reached the file before its buffer filled")
        #expect(tier.statistics.bufferedBytes > 10_000)
        for i in 0..<10 { #expect(try tier.value(forKey: keyBytes(i)) == selfDescribingValue(key: i, version: 1, length: 1000)) }
        // Replacing a buffered value, then filling the buffer: the file gets whole buffers only.
        try tier.set(selfDescribingValue(key: 3, version: 2, length: 500), forKey: keyBytes(3))
        for i in 10..<100 { try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i)) }
        let statistics = tier.statistics
        #expect(Self.fileSize(directory.path) > empty)
        #expect(Self.fileSize(directory.path) + statistics.bufferedBytes == statistics.bytesOnDisk)
        #expect(statistics.bufferedBytes <= 64 << 10)
        try tier.flush()
        #expect(tier.statistics.bufferedBytes == 0 && Self.fileSize(directory.path) == tier.statistics.bytesOnDisk)
        try tier.close()
        let reopened = try DiskTier(Self.configuration(directory.path))
        for i in 0..<100 {
            let expected = i == 3 ? selfDescribingValue(key: 3, version: 2, length: 500) : selfDescribingValue(key: i, version: 1, length: 1000)
            #expect(try reopened.value(forKey: keyBytes(i)) == expected)
        }
        try reopened.close()
    }

    @Test("after a crash: buffered stores are misses, never the values they replaced; removals are kept")
    func crashKeepsRemovals() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path))
        for i in 0..<20 { try tier.set(selfDescribingValue(key: i, version: 1, length: 700), forKey: keyBytes(i)) }
        try tier.flush()
        for i in 0..<10 { try tier.set(selfDescribingValue(key: i, version: 2, length: 700), forKey: keyBytes(i)) }
        #expect(try tier.removeValue(forKey: keyBytes(15)))  // written through, with the buffer before it
        #expect(tier.statistics.bufferedBytes == 0)
        for i in 0..<5 { try tier.set(selfDescribingValue(key: i, version: 3, length: 700), forKey: keyBytes(i)) }
        try tier.set(selfDescribingValue(key: 16, version: 3, length: 700), forKey: keyBytes(16))
        #expect(try tier.removeValue(forKey: keyBytes(17)))
        try tier.set(selfDescribingValue(key: 18, version: 3, length: 700), forKey: keyBytes(18))  // buffered
        let image = directory.child("crash")
        try Self.crashImage(of: directory.path, to: image)
        let recovered = try DiskTier(Self.configuration(image))
        for i in 0..<20 {
            let got = try recovered.value(forKey: keyBytes(i))
            switch i {
            case 0..<5: #expect(got == selfDescribingValue(key: i, version: 3, length: 700), "key \(i): written through by the removal of 17")
            case 5..<10: #expect(got == selfDescribingValue(key: i, version: 2, length: 700), "key \(i)")
            case 15, 17: #expect(got == nil, "key \(i): a removal was undone by a crash")
            case 16: #expect(got == selfDescribingValue(key: 16, version: 3, length: 700))
            case 18: #expect(got == nil, "key 18: its buffered store is lost, and the value it replaced must not come back")
            default: #expect(got == selfDescribingValue(key: i, version: 1, length: 700), "key \(i)")
            }
        }
        #expect(recovered.statistics.corruptRecords == 0)
        try recovered.close()
        try tier.close()
    }

    @Test("a failed buffer write: its stores become counted misses, the failing call throws, the tier goes on")
    func failedBufferWrite() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path, buffer: 16 << 10))
        for i in 0..<30 { try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i)) }
        try tier.flush()
        FileIOFaults.set(under: directory.path) { call, _ in call == "pwrite" ? ENOSPC : nil }
        // 5 was written; its replacement goes to the buffer (and the old record is marked dead).
        try tier.set(selfDescribingValue(key: 5, version: 2, length: 1000), forKey: keyBytes(5))
        var buffered: [Int] = [5]
        var failure: MagpieError? = nil
        for i in 30..<100 {
            do {
                try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i))
                buffered.append(i)
            } catch {
                failure = error
                break
            }
        }
        #expect(failure?.code == .noSpace)
        #expect(buffered.count >= 10, "the buffer held \(buffered.count) stores")
        // Lost stores are misses; the value 5's lost store replaced does not come back.
        FileIOFaults.set(under: directory.path, nil)
        func expected(_ i: Int) -> [UInt8]? { i < 30 && i != 5 ? selfDescribingValue(key: i, version: 1, length: 1000) : nil }
        for i in 0..<100 { #expect(try tier.value(forKey: keyBytes(i)) == expected(i), "key \(i)") }
        #expect(tier.statistics.lostBufferedStores == UInt64(buffered.count))
        #expect(tier.statistics.bufferedBytes == 0)
        try tier.set([1, 2, 3], forKey: "after")
        try tier.close()
        let reopened = try DiskTier(Self.configuration(directory.path))
        #expect(try reopened.value(forKey: "after") == [1, 2, 3])
        for i in 0..<100 { #expect(try reopened.value(forKey: keyBytes(i)) == expected(i), "key \(i) after reopen") }
        #expect(reopened.statistics.corruptRecords == 0 && reopened.statistics.truncatedTails == 0)
        try reopened.close()
    }

    @Test("a compaction takes the buffered records along and leaves the buffer empty")
    func compactionTakesBuffer() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var configuration = Self.configuration(directory.path)
        configuration.budget = 256 << 10  // one bucket of 256 KiB: a buffer of 32 KiB
        let tier = try DiskTier(configuration)
        var latest: [Int: [UInt8]] = [:]
        var generator = SeededGenerator(seed: 8)
        for step in 0..<2000 {
            let key = Int.random(in: 0..<60, using: &generator)
            latest[key] = selfDescribingValue(key: key, version: step, length: Int.random(in: 100..<3000, using: &generator))
            try tier.set(latest[key]!, forKey: keyBytes(key))
            #expect(Self.fileSize(directory.path) <= 256 << 10)
        }
        #expect(tier.statistics.compactions > 5)
        for key in 0..<60 {
            let got = try tier.value(forKey: keyBytes(key))
            #expect(got == nil || got == latest[key], "key \(key) read an older value")
        }
        // A miss here may only be an eviction: a buffered record the compaction lost would read as a
        // corrupt record (its slot pointing past the new file).
        #expect(tier.statistics.corruptRecords == 0 && tier.statistics.lostBufferedStores == 0)
        #expect(tier.statistics.entries + Int(tier.statistics.evictions) >= 60)
        try tier.close()
    }

    @Test("a Cache writes its disk buffers to the kernel every diskBufferWriteInterval; without it they wait")
    func cacheWritesBuffers() async throws {
        for interval in [Duration.milliseconds(50), nil] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 1 << 20, diskBudget: 4 << 20)
            configuration.disk?.bucketCount = 1
            configuration.hashSeed = 3
            configuration.metrics = nil
            configuration.diskBufferWriteInterval = interval
            let cache = try Cache(configuration)
            let value = selfDescribingValue(key: 1, version: 1, length: 3000)
            try await cache.async.set(value, forKey: "k")
            var buffered = cache.statistics.disk?.bufferedBytes ?? -1
            for _ in 0..<(interval == nil ? 15 : 100) where buffered != 0 {  // up to 0.3 s (6 intervals) or 2 s
                try await Task.sleep(for: .milliseconds(20))
                buffered = cache.statistics.disk?.bufferedBytes ?? -1
            }
            if interval == nil {
                #expect(buffered > 0, "without the periodic write the store stays buffered")
            } else {
                #expect(buffered == 0, "the periodic write did not run")
                // What a SIGKILL would leave now holds the store.
                let image = directory.child("crash")
                try Self.crashImage(of: directory.path, to: image)
                let recovered = try DiskTier(.init(directory: image, budget: 4 << 20))
                #expect(try recovered.value(forKey: "k") == value)
                try recovered.close()
            }
            try cache.close()
        }
    }
}
