import Foundation
import Magpie

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A persistent cache measured by the disk scenario.
protocol DiskSystem {
    var name: String { get }
    /// Stores a value; false if the system refused or failed.
    func set(_ value: [UInt8], key: String) -> Bool
    func get(_ key: String) -> [UInt8]?
    /// Closes (flushing what the system flushes on close).
    func close()
    /// Extra figures for the report.
    func extra() -> [String: JSONValue]
    /// How the system is configured, for the report (the `config` JSON and the text).
    var configuration: String { get }
    /// Bytes the system's directory may hold above the budget (its documented or stated bound).
    var slackBytes: Int { get }
}

extension DiskSystem {
    var configuration: String { name }
    var slackBytes: Int { 0 }
}

/// Magpie's disk tier.
final class MagpieDisk: DiskSystem {
    let tier: DiskTier
    let budget: Int
    let level: Int?
    var name: String { "magpie" }

    init(directory: String, budget: Int, level: Int?, buckets: Int?, reinsertionThreshold: Int? = nil, hugePages: Bool = false) throws {
        var configuration = DiskTier.Configuration(directory: directory, budget: budget, bucketCount: buckets, compressionLevel: level)
        configuration.hugePageFiles = hugePages
        if let reinsertionThreshold { configuration.reinsertionThreshold = reinsertionThreshold }
        tier = try DiskTier(configuration)
        self.budget = budget
        self.level = level
    }

    /// None: everything in the directory (bucket files, index snapshots, SIZES, MANIFEST, LOCK) stays
    /// within the budget, Magpie's documented bound since #14 (DiskBudgetTests).
    var slackBytes: Int { 0 }

    var configuration: String {
        "Magpie DiskTier: budget=\(budget), \(tier.bucketCount) buckets, zstd \(level.map { "-\($0)" } ?? "off") where it pays, "
            + "64 KiB memtables written in the background, mapped reads\(tier.configuration.hugePageFiles ? " (huge pages)" : ""), FIFO regions with size-aware reinsertion "
            + "(threshold \(tier.configuration.reinsertionThreshold)), no fsync"
    }

    func set(_ value: [UInt8], key: String) -> Bool { (try? tier.set(value, forKey: key)) != nil }
    func get(_ key: String) -> [UInt8]? { try? tier.value(forKey: key) }
    func close() { try? tier.close() }

    func extra() -> [String: JSONValue] {
        let stats = tier.statistics
        return [
            "entries": .int(stats.entries), "bytes_on_disk": .int(stats.bytesOnDisk), "live_bytes": .int(stats.liveBytes),
            "index_bytes_per_entry": .double(stats.indexBytesPerEntry),
            "compression_ratio": .double(stats.storedValueBytes == 0 ? 1 : Double(stats.originalValueBytes) / Double(stats.storedValueBytes)),
            "evictions": .int(Int(stats.evictions)), "regions_reclaimed": .int(Int(stats.regionsReclaimed)),
            "reinsertions": .int(Int(stats.reinsertions)), "reinserted_bytes": .int(Int(stats.reinsertedBytes)),
            "tier_bytes_written": .int(Int(stats.bytesWritten)), "regions": .int(stats.regions),
            "buckets": .int(tier.bucketCount), "corrupt_records": .int(Int(stats.corruptRecords)),
        ]
    }
}

/// The classic pattern: one file per key in one folder, named by the key's base64 (with '/' made
/// file-safe), written whole, and oldest-first deletion to stay within the budget. Reopening lists and
/// stats every file to rebuild the size accounting.
final class FilePerKey: DiskSystem {
    let directory: String
    let budget: Int
    private var order: [(name: String, size: Int)] = []
    private var sizes: [String: Int] = [:]
    private var head = 0
    private var total = 0
    var name: String { "file-per-key" }

    init(directory: String, budget: Int) {
        self.directory = directory
        self.budget = budget
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        for name in names {
            let attributes = try? FileManager.default.attributesOfItem(atPath: directory + "/" + name)
            let size = (attributes?[.size] as? Int) ?? 0
            order.append((name, size))
            sizes[name] = size
            total += size
        }
    }

    private func fileName(_ key: String) -> String {
        Data(key.utf8).base64EncodedString().replacingOccurrences(of: "/", with: "_")
    }

    func set(_ value: [UInt8], key: String) -> Bool {
        let name = fileName(key)
        guard FileManager.default.createFile(atPath: directory + "/" + name, contents: Data(value)) else { return false }
        total += value.count - (sizes[name] ?? 0)
        if sizes[name] == nil { order.append((name, value.count)) }
        sizes[name] = value.count
        while total > budget && head < order.count {
            let oldest = order[head]
            head += 1
            guard let size = sizes.removeValue(forKey: oldest.name) else { continue }
            try? FileManager.default.removeItem(atPath: directory + "/" + oldest.name)
            total -= size
        }
        return true
    }

    func get(_ key: String) -> [UInt8]? {
        FileManager.default.contents(atPath: directory + "/" + fileName(key)).map { [UInt8]($0) }
    }

    func close() {}

    func extra() -> [String: JSONValue] {
        ["entries": .int(sizes.count), "bytes_on_disk": .int(total), "compression_ratio": .double(1)]
    }
}

/// Foundation's URLCache with a disk path (swift-corelibs-foundation on Linux), memory capacity 0.
final class URLCacheDisk: DiskSystem {
    let cache: URLCache
    var name: String { "URLCache" }

    init(directory: String, budget: Int) {
        cache = URLCache(memoryCapacity: 0, diskCapacity: budget, diskPath: directory)
    }

    private func request(_ key: String) -> URLRequest {
        URLRequest(url: URL(string: "https://magpie.invalid/\(key)")!)
    }

    func set(_ value: [UInt8], key: String) -> Bool {
        let request = request(key)
        guard let response = HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: nil)
        else { return false }
        cache.storeCachedResponse(CachedURLResponse(response: response, data: Data(value)), for: request)
        return true
    }

    func get(_ key: String) -> [UInt8]? {
        cache.cachedResponse(for: request(key)).map { [UInt8]($0.data) }
    }

    func close() {}

    func extra() -> [String: JSONValue] {
        ["bytes_on_disk": .int(cache.currentDiskUsage), "compression_ratio": .double(1)]
    }
}
