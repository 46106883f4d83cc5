import Foundation
import Magpie
import Synchronization

/// A cache measured by the memory scenario: cache-aside `get`, and `put` on a miss.
protocol MemorySystem: Sendable {
    /// The name in reports (stable: tuning scripts depend on it).
    var name: String { get }
    /// Looks `key` up; true on a hit. A hit must read the value (at least one byte of it).
    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool
    /// Stores `value` for `key`.
    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer)
    /// Scenario-specific figures after a run.
    func extra() -> [String: JSONValue]
}

/// Magpie's memory tier alone, read one way or another: a miss's store and the figures are the tier's.
protocol MemoryTierSystem: MemorySystem {
    var tier: MemoryTier { get }
}

extension MemoryTierSystem {
    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        _ = try? tier.set(value, forKey: key)
    }

    func extra() -> [String: JSONValue] {
        let stats = tier.statistics
        return [
            "budget_bytes": .int(tier.budget), "charged_bytes": .int(stats.chargedBytes), "entries": .int(stats.entries),
            "entry_overhead_bytes": .int(MemoryTier.entryOverhead), "shards": .int(tier.shardCount),
            "evictions": .int(Int(stats.evictions)), "refusals": .int(Int(stats.refusals)),
            "unreclaimed_bytes": .int(stats.unreclaimedBytes),
        ]
    }
}

/// Magpie's memory tier through its copying read (`value(forKey:)` returns a new `[UInt8]`).
struct MagpieCopying: MemoryTierSystem {
    let tier: MemoryTier
    var name: String { "magpie" }

    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool {
        guard let value = tier.value(forKey: key) else { return false }
        sink &+= UInt64(value.first ?? 0)
        return true
    }
}

/// Magpie's memory tier through its in-place read (`withValue(forKey:_:)`, no copy): the read to put
/// beside RocksDB's pinned `Lookup`/`Value`/`Release`.
struct MagpieInPlace: MemoryTierSystem {
    let tier: MemoryTier
    var name: String { "magpie-inplace" }

    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool {
        guard let byte = tier.withValue(forKey: key, { $0.first ?? 0 }) else { return false }
        sink &+= UInt64(byte)
        return true
    }
}

/// The two-tier `Cache` façade with no directory (memory only), copying read: what the façade adds
/// over ``MagpieCopying`` on the same workload (the bar: a hit costs ≤ 1.2 × a memory-tier hit).
struct MagpieCacheSystem: MemorySystem {
    let cache: Cache
    var name: String { "magpie-cache" }

    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool {
        guard let value = try? cache.value(forKey: key) else { return false }
        sink &+= UInt64(value.first ?? 0)
        return true
    }

    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        try? cache.set(value, forKey: key)
    }

    func extra() -> [String: JSONValue] {
        let stats = cache.statistics.memory
        return [
            "budget_bytes": .int(cache.configuration.memory.budget), "charged_bytes": .int(stats.chargedBytes),
            "entries": .int(stats.entries), "entry_overhead_bytes": .int(MemoryTier.entryOverhead),
            "evictions": .int(Int(stats.evictions)), "refusals": .int(Int(stats.refusals)),
            "unreclaimed_bytes": .int(stats.unreclaimedBytes),
        ]
    }
}

/// Foundation's NSCache with `totalCostLimit` = the budget and cost = key + value bytes.
final class NSCacheSystem: MemorySystem, @unchecked Sendable {
    // @unchecked: NSCache is documented thread-safe; it is not annotated Sendable in corelibs-foundation.
    let cache = NSCache<NSData, NSData>()
    var name: String { "NSCache" }

    init(budget: Int) {
        cache.totalCostLimit = budget
    }

    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool {
        let keyObject = NSData(bytes: key.baseAddress, length: key.count)
        guard let value = cache.object(forKey: keyObject) else { return false }
        if value.length > 0 { sink &+= UInt64(value.bytes.load(as: UInt8.self)) }
        return true
    }

    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        let keyObject = NSData(bytes: key.baseAddress, length: key.count)
        let valueObject = NSData(bytes: value.baseAddress, length: value.count)
        cache.setObject(valueObject, forKey: keyObject, cost: key.count + value.count)
    }

    func extra() -> [String: JSONValue] { [:] }
}

/// The no-eviction reference: an unbounded `Dictionary` behind one `Mutex`.
final class MutexDictionary: MemorySystem {
    struct Key16: Hashable, Sendable {
        let a: UInt64
        let b: UInt64
    }

    let table = Mutex<[Key16: [UInt8]]>([:])
    var name: String { "mutex-dictionary" }

    @inline(__always)
    private func key16(_ key: UnsafeRawBufferPointer) -> Key16 {
        Key16(a: key.loadUnaligned(as: UInt64.self), b: key.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
    }

    func get(_ key: UnsafeRawBufferPointer, sink: inout UInt64) -> Bool {
        let k = key16(key)
        guard let value = table.withLock({ $0[k] }) else { return false }
        sink &+= UInt64(value.first ?? 0)
        return true
    }

    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        let k = key16(key)
        let v = [UInt8](value)
        table.withLock { $0[k] = v }
    }

    func extra() -> [String: JSONValue] {
        ["entries": .int(table.withLock { $0.count })]
    }
}
