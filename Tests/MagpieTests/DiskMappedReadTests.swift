import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

@Suite("DiskTier: mapped reads, the SIGBUS guard, checksums and incompressible values")
struct DiskMappedReadTests {
    static func configuration(_ path: String, mapped: Bool, budget: Int = 4 << 20) -> DiskTier.Configuration {
        var configuration = DiskTier.Configuration(directory: path, budget: budget, bucketCount: 4, hashSeed: 91)
        configuration.mappedReads = mapped
        return configuration
    }

    static func bucketFiles(_ path: String) -> [String] {
        DiskCorruptionTests.bucketFiles(path).filter { !$0.hasSuffix(".index") }
    }

    @Test(
        "a bucket file truncated or overwritten while the tier is open: no crash, no wrong value, counted, healed",
        arguments: [true, false])
    func damagedWhileOpen(mapped: Bool) throws {
        for damage in ["truncate", "overwrite"] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            // One bucket, so that the first damaged record read heals the whole file.
            var configuration = Self.configuration(directory.path, mapped: mapped)
            configuration.bucketCount = 1
            let tier = try DiskTier(configuration)
            var written: [Int: [UInt8]] = [:]
            for i in 0..<200 {
                written[i] = selfDescribingValue(key: i, version: 1, length: 100 + i * 53 % 4000)
                try tier.set(written[i]!, forKey: keyBytes(i))
            }
            // Behind the tier's back (it holds the file open and, when `mapped`, mapped).
            let file = Self.bucketFiles(directory.path)[0]
            // The end of the records written (the file may run on in free slots: Bucket+HugePages.swift).
            try tier.flush()
            let size = tier.buckets[0].withLock { state in state.layout.regions.map { state.layout.start(of: $0) + $0.end }.max() ?? 0 }
            #expect(size > 100_000)
            if damage == "truncate" {
                #expect(truncate(file, off_t(size / 3)) == 0)
            } else {
                let fd = open(file, O_WRONLY)
                let junk = [UInt8](repeating: 0xA5, count: size / 3)
                #expect(junk.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(size / 3)) } == junk.count)
                close(fd)
            }
            // Read until the first damaged record: that read heals the file, every other damaged record
            // included (the compaction verifies each record again and leaves the damaged ones out).
            var firstLost: Int? = nil
            for i in 0..<200 where firstLost == nil {
                if let got = try tier.value(forKey: keyBytes(i)) {
                    #expect(got == written[i], "\(damage), mapped \(mapped): key \(i) read bytes that were never its value")
                } else {
                    firstLost = i
                }
            }
            #expect(firstLost != nil, "\(damage): the damage changed nothing, so the test proved nothing")
            #expect(tier.statistics.corruptRecords > 1, "\(damage), mapped \(mapped): damage read but not counted")
            try tier.set([7, 8, 9], forKey: "after")  // the tier keeps working
            #expect(try tier.value(forKey: "after") == [7, 8, 9])
            try tier.close()
            // Healed: a full scan (no index snapshot) finds no damage left in the file.
            for file in DiskCorruptionTests.bucketFiles(directory.path) where file.hasSuffix(".index") {
                try FileManager.default.removeItem(atPath: file)
            }
            let reopened = try DiskTier(configuration)
            #expect(reopened.statistics.corruptRecords == 0 && reopened.statistics.truncatedTails == 0,
                "\(damage), mapped \(mapped): damage was still in the file after healing")
            #expect(try reopened.value(forKey: "after") == [7, 8, 9])
            var lost = 0
            for i in 0..<200 {
                if let got = try reopened.value(forKey: keyBytes(i)) {
                    #expect(got == written[i], "\(damage), mapped \(mapped): key \(i) after reopen")
                } else {
                    lost += 1
                }
            }
            #expect(lost > 0)
            try reopened.close()
        }
    }

    @Test("mapped, pread and write-through tiers give the same answers through evictions, reclaims, removals and a reopen")
    func mappedAgreesWithPread() throws {
        let seed = TestSeed.value(default: 515)
        // Mapped reads with memtables (the defaults, but written by the storing thread, so that the file
        // layout does not depend on a thread's timing), pread with them, mapped with every record written
        // at once: the first two must give the same answers and the same evictions; the third, which lays
        // its files out otherwise, answers nil or the latest value.
        let kinds: [(mapped: Bool, buffer: Int?)] = [(true, nil), (false, nil), (true, 0)]
        var latest: [[UInt8]: [UInt8]] = [:]
        let directories = kinds.map { _ in TemporaryDirectory() }
        defer { for directory in directories { directory.cleanup() } }
        func open() throws -> [DiskTier] {
            try kinds.enumerated().map { index, kind in
                var configuration = Self.configuration(directories[index].path, mapped: kind.mapped, budget: 256 << 10)
                if let buffer = kind.buffer { configuration.writeBufferSize = buffer }
                configuration.sealsInBackground = false
                return try DiskTier(configuration)
            }
        }
        var tiers = try open()
        var generator = SeededGenerator(seed: seed)
        var bufferedReads = 0
        for step in 0..<4000 {
            let key = keyBytes(Int.random(in: 0..<300, using: &generator))
            let choice = Int.random(in: 0..<10, using: &generator)
            let value = selfDescribingValue(key: step, version: step, length: Int.random(in: 0..<3000, using: &generator))
            if step == 2000 {
                for tier in tiers { try tier.close() }
                tiers = try open()
            }
            if choice >= 6 && tiers[0].statistics.bufferedBytes > 0 { bufferedReads += 1 }
            let results = try tiers.map { tier -> [UInt8]? in
                switch choice {
                case 0..<5:
                    try tier.set(value, forKey: key)
                    return nil
                case 5: return try tier.removeValue(forKey: key) ? [1] : [0]
                default: return try tier.value(forKey: key)
                }
            }
            #expect(results[0] == results[1], "seed \(seed) step \(step): mapped and pread tiers disagree")
            if choice < 5 { latest[key] = value } else if choice == 5 { latest[key] = nil }
            if choice > 5 {
                for (n, result) in results.enumerated() where result != nil {
                    #expect(result == latest[key], "seed \(seed) step \(step): tier \(n) read a value that is not the latest")
                }
            }
        }
        let statistics = tiers.map(\.statistics)
        #expect(statistics.allSatisfy { $0.regionsReclaimed > 0 }, "no region was reclaimed: the slot reuse went untested")
        #expect(statistics[2].bufferedBytes == 0 && bufferedReads > 1000, "the memtables went untested")
        #expect(statistics[0].hits == statistics[1].hits && statistics[0].evictions == statistics[1].evictions)
        #expect(statistics[0].regionsReclaimed == statistics[1].regionsReclaimed && statistics[0].entries == statistics[1].entries)
        #expect(statistics.allSatisfy { $0.corruptRecords == 0 && $0.lostBufferedStores == 0 })
    }

    @Test("a prefetch over pages the file no longer has neither faults nor reads; ranges past the mapping are clamped")
    func prefetchPastTheFile() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let path = directory.path + "/mapped"
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        let bytes = [UInt8](repeating: 0x5A, count: 64 * 1024)
        #expect(bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) } == bytes.count)
        let mapping = try #require(FileMapping.map(fd, length: bytes.count))
        defer { mapping.unmap() }
        var copied = [UInt8](repeating: 0, count: 4096)
        #expect(copied.withUnsafeMutableBytes { mapping.copy(at: 8192, into: $0) } && copied == Array(bytes[0..<4096]))
        // Every page of the mapping now lies past the end of the file: a load there raises SIGBUS (the
        // guarded copy reports it), a prefetch must not. An unguarded fault would end this process.
        #expect(ftruncate(fd, 0) == 0)
        mapping.prefetch(at: 0, count: bytes.count)
        // Ranges FileMapping.prefetch must cut to the mapping or refuse: without the clamp the second would
        // run on for 2^63 bytes (a hang, or a fault outside the mapping), the fourth would start before it.
        mapping.prefetch(at: 4000, count: Int.max)
        mapping.prefetch(at: bytes.count - 1, count: 1 << 20)
        mapping.prefetch(at: -64, count: 128)
        mapping.prefetch(at: 100, count: -1)
        #expect(copied.withUnsafeMutableBytes { mapping.copy(at: 8192, into: $0) } == false, "the truncation was not seen")
    }

    @Test("a SIGBUS outside the guard still reaches the handler installed before it")
    func guardChains() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // A handler that returns without handing on re-runs the faulting load forever: the helper times it out.
        let outcome = try runTestChild(["sigbus-child", "--directory", directory.path])
        #expect(!outcome.timedOut, "the child hung in its SIGBUS handler")
        #expect(outcome.exitStatus == 42, "the child's own SIGBUS handler did not run (\(outcome))")
    }

    @Test("one byte of a payload changed in the file while the tier is open: a miss, counted, never the changed bytes", arguments: [true, false])
    func damagedPayload(mapped: Bool) throws {
        // A raw value (noise) and a compressed one (a repeating ramp): the payload is raw bytes or a zstd frame.
        for (key, value) in [(Array("raw-payload".utf8), noiseBytes(4000, seed: 5)), (Array("zstd-payload".utf8), selfDescribingValue(key: 1, version: 1, length: 4000))] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            var configuration = Self.configuration(directory.path, mapped: mapped)
            configuration.bucketCount = 1
            let tier = try DiskTier(configuration)
            try tier.set(value, forKey: key)
            try tier.flush()
            #expect(try tier.value(forKey: key) == value)
            let name = String(decoding: key, as: UTF8.self)
            // The key's bytes are the record's; its payload starts right after them (no group, no metadata):
            // 100 bytes further is inside the payload, which only the payload hash covers.
            let file = Self.bucketFiles(directory.path)[0]
            let contents = try [UInt8](Data(contentsOf: URL(fileURLWithPath: file)))
            let keyAt = try #require(contents.indices.first { contents[$0..<min(contents.count, $0 + key.count)].elementsEqual(key) })
            let at = keyAt + key.count + 100
            let fd = open(file, O_WRONLY)
            #expect([contents[at] ^ 0x20].withUnsafeBytes { pwrite(fd, $0.baseAddress, 1, off_t(at)) } == 1)
            close(fd)
            #expect(try tier.value(forKey: key) == nil, "mapped \(mapped): \(name) was read past its damage")
            #expect(tier.statistics.corruptRecords == 1, "mapped \(mapped): \(name): the damage was not counted")
            try tier.close()
        }
    }

    @Test("record checksums and payload hashes through libxxhash's dispatcher equal the plain entry point's")
    func checksumDispatch() {
        var generator = SeededGenerator(seed: TestSeed.value(default: 33))
        let bytes = (0..<9000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        bytes.withUnsafeBytes { raw in
            for _ in 0..<300 {
                let start = Int.random(in: 0..<64, using: &generator)
                let length = Int.random(in: 0..<8000, using: &generator)
                let header = UnsafeRawBufferPointer(rebasing: raw[0..<44])
                let body = UnsafeRawBufferPointer(rebasing: raw[start..<(start + length)])
                let plain = KeyHash.checksumWithoutDispatch(header: header, body: body)
                // The dispatcher against the plain entry, whichever of them this CPU uses for records
                // (KeyHash.dispatchLong). Where the library has no dispatcher (not x86-64), both are plain.
                #expect(KeyHash.checksum(header: header, body: body, dispatch: true) == plain)
                #expect(KeyHash.checksum(header: header, body: body) == plain)
                #expect(KeyHash.payloadHash(body, dispatch: true) == KeyHash.payloadHash(body, dispatch: false))
                #expect(KeyHash.payloadHash(body) == KeyHash.payloadHash(body, dispatch: true))
            }
        }
    }

    @Test("the compressibility test tells noise from text, JSON, base64 and runs")
    func compressibility() {
        var generator = SeededGenerator(seed: TestSeed.value(default: 8))
        let random = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let json = Array(String(repeating: #"{"id":12,"user":"ada","tags":["x","y"],"score":0.5},"#, count: 80).utf8)
        let base64 = Array(Data(random).base64EncodedString().utf8)
        let text = Array(String(repeating: "the quick brown fox jumps over the lazy dog ", count: 100).utf8)
        func incompressible(_ bytes: [UInt8]) -> Bool { bytes.withUnsafeBytes { Compressibility.looksIncompressible($0) } }
        #expect(incompressible(random))
        #expect(incompressible(Array(random.prefix(600))))
        #expect(incompressible(random + random + random))  // sampled runs across a large value
        #expect(!incompressible(Array(random.prefix(511))), "below the minimum length zstd is always tried")
        #expect(!incompressible(json))
        #expect(!incompressible(base64))
        #expect(!incompressible(text))
        #expect(!incompressible([UInt8](repeating: 0, count: 4096)))
        #expect(!incompressible(Array(random.prefix(2048)) + [UInt8](repeating: 0, count: 2048)))
    }

    @Test("noise-like values are stored raw without asking zstd; compressible ones are compressed")
    func incompressibleStoredRaw() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path, mapped: true))
        var generator = SeededGenerator(seed: 5)
        // 4 KiB of random bytes twice: zstd would halve it by matching the second half to the first, but
        // the sampled runs (16 of 64 bytes, 541 apart) never meet the same bytes twice, so the histogram
        // looks like noise and the value is stored raw (the documented cost). Were zstd asked, the
        // ratio would be about 0.5.
        let block = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let repeated = block + block
        #expect(repeated.withUnsafeBytes { Compressibility.looksIncompressible($0) })
        try tier.set(repeated, forKey: "noise")
        try tier.writeBuffers()  // compression happens when the memtable is written
        #expect(tier.statistics.compressionRatio == 1.0)
        #expect(try tier.value(forKey: "noise") == repeated)
        let json = Array(String(repeating: #"{"id":12,"user":"ada","tags":["x","y"]},"#, count: 100).utf8)
        try tier.set(json, forKey: "json")
        try tier.writeBuffers()
        #expect(tier.statistics.storedValueBytes - UInt64(repeated.count) < UInt64(json.count / 4))
        #expect(try tier.value(forKey: "json") == json)
    }
}
