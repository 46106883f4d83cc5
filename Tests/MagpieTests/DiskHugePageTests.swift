import Foundation
import Glibc
import Synchronization
import MagpieTestSupport
import Testing

@testable import Magpie

// Bucket files grown in whole 2 MiB ranges held as huge pages (Disk/Bucket+HugePages.swift).

/// One bucket of 8 MiB (regions of 512 KiB), values stored raw, every store written before it returns.
private func configuration(_ path: String, hugePages: Bool = true) -> DiskTier.Configuration {
    var configuration = DiskTier.Configuration(directory: path, budget: 8 << 20, bucketCount: 1, compressionLevel: nil, hashSeed: 11)
    configuration.writeBufferSize = 0
    configuration.hugePageFiles = hugePages
    return configuration
}

private func file(_ directory: String) -> (size: Int, allocated: Int) {
    var info = stat()
    guard stat(DiskMappedReadTests.bucketFiles(directory)[0], &info) == 0 else { return (-1, -1) }
    return (Int(info.st_size), Int(info.st_blocks) * 512)
}

/// Bytes of this process's mappings of `path` that the kernel maps by 2 MiB pages (`FilePmdMapped`).
private func hugePageMapped(_ path: String) -> Int {
    guard let smaps = FileHandle(forReadingAtPath: "/proc/self/smaps").map({ String(decoding: $0.readDataToEndOfFile(), as: UTF8.self) }) else { return 0 }
    // As the kernel names it (a temporary directory's path may hold "//").
    guard let resolved = realpath(path, nil) else { return 0 }
    let path = String(cString: resolved)
    free(resolved)
    var inside = false
    var total = 0
    for line in smaps.split(separator: "\n") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        guard let first = fields.first else { continue }
        if first.contains("-") && !first.hasSuffix(":") {
            inside = fields.count >= 6 && fields[5...].joined(separator: " ") == path
        } else if inside, first == "FilePmdMapped:", fields.count >= 2, let kB = Int(fields[1]) {
            total += kB << 10
        }
    }
    return total
}

@Suite("DiskTier: huge pages for bucket files")
struct DiskHugePageTests {
    @Test("a file grows by whole 2 MiB ranges of holes: the slots are free until used, nothing is written for them, and reads, a reopen from the snapshot and a crash image see every value")
    func wholeRanges() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let value = { (i: Int) in selfDescribingValue(key: i, version: 1, length: 10_000) }
        var tier = try DiskTier(configuration(directory.path))
        for i in 0..<20 { try tier.set(value(i), forKey: keyBytes(i)) }
        let regionSize = tier.buckets[0].withLock { $0.layout.regionSize }
        var (size, allocated) = file(directory.path)
        // The first region's growth took the file to the end of its first 2 MiB range, in whole slots.
        #expect(size >= 2 << 20 && size < (2 << 20) + regionSize, "\(size)")
        #expect((size - BucketFileHeader.size) % regionSize == 0)
        #expect(tier.buckets[0].withLock { $0.layout.size } == size)
        #expect(allocated < 1 << 20, "the hole was written: \(allocated) bytes allocated")
        for i in 0..<20 { #expect(try tier.value(forKey: keyBytes(i)) == value(i)) }
        // Past the first range: the file grows to the end of the second.
        var i = 20
        while file(directory.path).size < 3 << 20 {
            try tier.set(value(i), forKey: keyBytes(i))
            i += 1
            #expect(i < 1000)
            if i >= 1000 { return }
        }
        (size, allocated) = file(directory.path)
        #expect(size >= 4 << 20 && size < (4 << 20) + regionSize, "\(size)")
        #expect(allocated < (size * 7) / 8, "\(allocated) of \(size)")
        let stored = i
        // A crash image (the files as they are now) recovers every value, with no damage counted.
        try tier.flush()
        let image = TemporaryDirectory()
        defer { image.cleanup() }
        try DiskMemtableTests.crashImage(of: directory.path, to: image.path, holding: tier)
        do {
            let recovered = try DiskTier(configuration(image.path))
            for k in 0..<stored { #expect(try recovered.value(forKey: keyBytes(k)) == value(k)) }
            #expect(recovered.statistics.corruptRecords == 0 && recovered.statistics.truncatedTails == 0)
            try recovered.close()
        }
        // A clean close and a reopen: from the snapshot, the file as it was.
        try tier.close()
        tier = try DiskTier(configuration(directory.path))
        for k in 0..<stored { #expect(try tier.value(forKey: keyBytes(k)) == value(k)) }
        let statistics = tier.statistics
        #expect(statistics.bucketsOpenedFromSnapshot == 1 && statistics.corruptRecords == 0)
        #expect(file(directory.path).size == size)
        try tier.close()
    }

    @Test("without huge pages the file grows only as slots are written")
    func off() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(configuration(directory.path, hugePages: false))
        for i in 0..<20 { try tier.set(selfDescribingValue(key: i, version: 1, length: 10_000), forKey: keyBytes(i)) }
        #expect(file(directory.path).size < 1 << 20)
        try tier.close()
    }

    @Test("emptied, the file takes its first range again; a share under 2 MiB never extends")
    func emptiedAndSmall() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(configuration(directory.path))
        for i in 0..<300 { try tier.set(selfDescribingValue(key: i, version: 1, length: 10_000), forKey: keyBytes(i)) }
        try tier.removeAll()
        #expect(file(directory.path).size == BucketFileHeader.size)
        try tier.set(selfDescribingValue(key: 1, version: 2, length: 10_000), forKey: keyBytes(1))
        #expect(file(directory.path).size >= 2 << 20)
        #expect(try tier.value(forKey: keyBytes(1)) == selfDescribingValue(key: 1, version: 2, length: 10_000))
        try tier.close()

        let small = TemporaryDirectory()
        defer { small.cleanup() }
        var configuration = configuration(small.path)
        configuration.budget = 1 << 20
        let smallTier = try DiskTier(configuration)
        for i in 0..<20 { try smallTier.set(selfDescribingValue(key: i, version: 1, length: 10_000), forKey: keyBytes(i)) }
        #expect(file(small.path).size < 300_000)
        try smallTier.close()
    }

    @Test("with huge pages, a bucket file of zeros (a crash between a new file's extension and its header) opens as an empty file, not as damage; other bytes without a header are damage, and so are zeros without huge pages")
    func zerosAreNew() throws {
        for (fill, hugePages, damage) in [(UInt8(0), true, UInt64(0)), (UInt8(0x5a), true, UInt64(1)), (UInt8(0), false, UInt64(1))] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            try DiskTier(configuration(directory.path, hugePages: hugePages)).close()
            let path = DiskMappedReadTests.bucketFiles(directory.path)[0]
            try Data(repeating: fill, count: 2 << 20).write(to: URL(fileURLWithPath: path))
            let tier = try DiskTier(configuration(directory.path, hugePages: hugePages))
            #expect(tier.statistics.corruptRecords == damage, "fill \(fill), huge pages \(hugePages)")
            try tier.set(selfDescribingValue(key: 1, version: 1, length: 1000), forKey: keyBytes(1))
            #expect(try tier.value(forKey: keyBytes(1)) == selfDescribingValue(key: 1, version: 1, length: 1000))
            try tier.close()
        }
    }

    @Test("the header's write back after the first range failed: the store fails, the file has no header until the next change of the file writes it first; a reopen then finds no damage and the later value")
    func headerWriteFails() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(configuration(directory.path))
        _ = tier.statistics  // loaded: the file holds its header alone
        let path = DiskMappedReadTests.bucketFiles(directory.path)[0]
        // The first pwrite of the first store is the header's, written back after the emptying.
        let writes = Atomic<Int>(0)
        FileIOFaults.set(under: directory.path) { call, _ in
            guard call == "pwrite" else { return nil }
            return writes.add(1, ordering: .relaxed).oldValue == 0 ? EIO : nil
        }
        #expect(throws: MagpieError.self) { try tier.set(selfDescribingValue(key: 1, version: 1, length: 10_000), forKey: keyBytes(1)) }
        FileIOFaults.set(under: directory.path, nil)
        let head = try FileHandle(forReadingFrom: URL(fileURLWithPath: path)).read(upToCount: BucketFileHeader.size) ?? Data()
        #expect(head.allSatisfy { $0 == 0 }, "the failed write left a header")
        try tier.set(selfDescribingValue(key: 2, version: 1, length: 10_000), forKey: keyBytes(2))
        #expect(try tier.value(forKey: keyBytes(2)) == selfDescribingValue(key: 2, version: 1, length: 10_000))
        // A crash image (no clean close, which would write the header too).
        let image = TemporaryDirectory()
        defer { image.cleanup() }
        try DiskMemtableTests.crashImage(of: directory.path, to: image.path, holding: tier)
        try tier.close()
        let recovered = try DiskTier(configuration(image.path))
        #expect(recovered.statistics.corruptRecords == 0)
        #expect(try recovered.value(forKey: keyBytes(2)) == selfDescribingValue(key: 2, version: 1, length: 10_000))
        try recovered.close()
    }

    @Test("where the kernel caches a populated hole as one 2 MiB folio, the tier's file is mapped by 2 MiB pages")
    func mappedByHugePages() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        // The probe: what this kernel and file system do with a populated hole in this directory.
        let probe = directory.child("probe")
        let fd = open(probe, O_RDWR | O_CREAT, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(ftruncate(fd, off_t(4 << 20)) == 0)
        let populated = FileMapping.populateHugePage(fd, at: 0)
        guard let probeMapping = FileMapping.map(fd, length: 4 << 20) else { return }
        var sum = 0
        for offset in stride(from: 0, to: 2 << 20, by: 4096) { sum &+= Int(probeMapping.base.load(fromByteOffset: offset, as: UInt8.self)) }
        let probed = hugePageMapped(probe)
        probeMapping.unmap()
        guard populated, probed >= 2 << 20, sum == 0 else {
            print("DiskHugePageTests.mappedByHugePages: this kernel or file system makes no 2 MiB folio of a hole (probe: \(probed) bytes); nothing to check")
            return
        }
        let cache = directory.child("cache")
        let tier = try DiskTier(configuration(cache))
        var i = 0
        while file(cache).size < 3 << 20 {
            try tier.set(selfDescribingValue(key: i, version: 1, length: 10_000), forKey: keyBytes(i))
            i += 1
        }
        for k in 0..<i { #expect(try tier.value(forKey: keyBytes(k)) == selfDescribingValue(key: k, version: 1, length: 10_000)) }
        let bucket = DiskMappedReadTests.bucketFiles(cache)[0]
        // Both ranges the file has completed are read through (the second is still filling).
        #expect(hugePageMapped(bucket) >= 2 << 20, "\(hugePageMapped(bucket)) bytes on 2 MiB pages")
        try tier.close()
    }
}
