import Foundation
import Magpie

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

// The systems the tiered scenario compares: Magpie's two-tier `Cache`, and URLCache with memory and disk.

struct MagpieTiered: TieredSystem {
    let cache: Cache
    var name: String { "magpie" }

    func get(_ key: String) -> (value: [UInt8]?, tier: CacheHit.Tier?) {
        guard let hit = try? cache.lookup(key) else { return (nil, nil) }
        return (hit.value, hit.tier)
    }

    func set(_ value: [UInt8], key: String) { try? cache.set(value, forKey: key) }

    func extra() -> [String: JSONValue] {
        let stats = cache.statistics
        return [
            "promotions": .int(Int(stats.promotions)), "memory_evictions": .int(Int(stats.memory.evictions)),
            "disk_evictions": .int(Int(stats.disk?.evictions ?? 0)), "disk_bytes": .int(stats.disk?.bytesOnDisk ?? 0),
            "compression_ratio": .double(stats.disk?.compressionRatio ?? 1),
        ]
    }
}

/// Foundation's URLCache with both a memory and a disk capacity (swift-corelibs-foundation).
struct URLCacheTiered: TieredSystem {
    let cache: URLCache
    var name: String { "URLCache" }

    private func request(_ key: String) -> URLRequest {
        URLRequest(url: URL(string: "https://magpie.invalid/\(key)")!)
    }

    func get(_ key: String) -> (value: [UInt8]?, tier: CacheHit.Tier?) {
        (cache.cachedResponse(for: request(key)).map { [UInt8]($0.data) }, nil)
    }

    func set(_ value: [UInt8], key: String) {
        let request = request(key)
        guard let response = HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: nil)
        else { return }
        cache.storeCachedResponse(CachedURLResponse(response: response, data: Data(value)), for: request)
    }

    func extra() -> [String: JSONValue] {
        ["disk_bytes": .int(cache.currentDiskUsage), "memory_bytes": .int(cache.currentMemoryUsage)]
    }
}

/// The tiered scenario: cache-aside over a Zipf working set ten times the memory budget that fits on
/// disk; per-tier hit ratios and latencies (promoted hits apart), Magpie vs URLCache on a capped copy of
/// the workload, and the cost of a memory hit through the `Cache` façade vs the bare memory tier.
