import Foundation
import Synchronization

// The systems `magpie-bench fleet` compares, as a worker's callers use them. Every system answers the
// same three calls — a read (which, on a miss, fills the key from the same origin), a set, a removal —
// so that the callers (FleetWorker+Tasks.swift, FleetWorker+Drive.swift), the ground truth and the judge
// of stale reads are one for all of them. The systems (`--systems`, names stable):
//
//   magpie-fleet       Magpie with the Redis remote tier: reads through the loader API
//                      (`cache.value(forKey:options:loader:load:)`, single flight per key in the process
//                      and, with the default load lease, in the fleet), writes `cache.async.set`, removals
//                      `cache.async.removeValue` (FleetMagpieSystem.swift).
//   redis-cache-aside  every read a Redis GET; a miss loads the origin and SETs the value, one load per
//                      key per process (FleetFlights); writes SET, removals DEL (FleetCacheAsideSystem.swift).
//   local-pubsub       the pattern users build by hand (and FusionCache or Redisson give them): a bounded
//                      local map in front of Redis, writes SET + PUBLISH of the key, every instance's
//                      subscriber drops what it is told (FleetLocalPubSubSystem.swift).
//   local-uncoherent   Magpie without a remote tier: each instance's own cache, told nothing of the
//                      others' writes (the stale-read detector's control: it must count stale reads).

/// Where a read's value came from, as far as the system can tell.
enum FleetSource {
    /// The local memory (or disk) tier.
    case memory, disk
    /// Redis answered it.
    case remote
    /// No tier held it: the origin's value (loaded by this read or by the load it joined).
    case origin
    /// The system does not say (Magpie's loader API returns the value only; its remote reads are counted
    /// from `cache.statistics.remote`).
    case unknown
}

/// A read's value and where it came from.
struct FleetRead {
    var value: [UInt8]
    var source: FleetSource
}

/// What a worker's callers call, for one system. The async forms are what the task callers (`--tasks N`)
/// use; the blocking forms, for the thread callers (`--tasks 0`), default to the async ones run to their
/// end on the calling thread (a bench thread, never one of Swift's cooperative pool).
protocol FleetSystem: AnyObject, Sendable {
    /// The value of `name` (the bench's key `key`); on a miss, the origin's (`FleetOrigin`), stored.
    func read(_ name: String, key: Int) async throws -> FleetRead
    /// Stores `value` as `name`'s new value (the origin already holds it).
    func set(_ name: String, _ value: [UInt8]) async throws
    /// Removes `name`'s value (the origin holds a new version of the key).
    func remove(_ name: String) async throws

    func readBlocking(_ name: String, key: Int) throws -> FleetRead
    func setBlocking(_ name: String, _ value: [UInt8]) throws
    func removeBlocking(_ name: String) throws

    /// Whether a read of `name` now would be answered without Redis (the own-write probes: a system that
    /// keeps its own writes answers true); nil for a system without local copies or without Redis.
    func answersLocally(_ name: String) async -> Bool?
    /// Reads that went to Redis since the system was made (its own GETs, or the cache's remote reads),
    /// and, for Magpie, the split that `cache.statistics.remote` gives.
    func remoteReads() -> FleetRemoteReads
    /// Whether the system's invalidation feed is up and current (for the fault run's recovery time), and
    /// which part of it is not; nil for a system without one.
    var feedHealth: FleetFeedHealth? { get }
    /// What the worker reports beside its tally (counters of the system's own).
    func report() -> [String: JSONValue]
    /// One line of the system's state for `FLEET_TRACE` (nil: nothing to say).
    func traceLine() -> String?
    /// Closes the system's connections.
    func close() async
}

extension FleetSystem {
    func readBlocking(_ name: String, key: Int) throws -> FleetRead {
        try FleetInstance.blocking { try await self.read(name, key: key) }
    }

    func setBlocking(_ name: String, _ value: [UInt8]) throws {
        try FleetInstance.blocking { try await self.set(name, value) }
    }

    func removeBlocking(_ name: String) throws {
        try FleetInstance.blocking { try await self.remove(name) }
    }

    var feedHealth: FleetFeedHealth? { nil }
    func answersLocally(_ name: String) async -> Bool? { nil }
    func report() -> [String: JSONValue] { [:] }
    func traceLine() -> String? { nil }
}

/// Reads that went to Redis (cumulative counts).
struct FleetRemoteReads {
    /// All of them: reads the local tiers could not answer.
    var total: Int
    /// Of those, the ones Redis answered with a value and the ones it had nothing for (Magpie's
    /// `readHits` and `readMisses`); nil when the system does not split them.
    var hits: Int? = nil
    var misses: Int? = nil
    /// Magpie's `unservedCopies`: local copies found but not served (past the bound, or older than a
    /// change the feed may have missed).
    var unserved: Int? = nil

    static func - (later: FleetRemoteReads, earlier: FleetRemoteReads) -> FleetRemoteReads {
        func minus(_ a: Int?, _ b: Int?) -> Int? { a.map { $0 - (b ?? 0) } }
        return FleetRemoteReads(
            total: later.total - earlier.total, hits: minus(later.hits, earlier.hits),
            misses: minus(later.misses, earlier.misses),
            unserved: minus(later.unserved, earlier.unserved))
    }
}

/// The origin every system loads a missing key from: after `origin-us` of simulated work, the value of
/// the newest version of the key (the shared table's version counter: a write takes its version, as a
/// service commits to its database, before it writes the cache). Counts its calls within the measured
/// window (the loads: a joined load is one call).
final class FleetOrigin: Sendable {
    let table: FleetShared
    let originUs: Int
    let valueSize: Int
    private let calls = Atomic<Int>(0)

    init(table: FleetShared, originUs: Int, valueSize: Int) {
        self.table = table
        self.originUs = originUs
        self.valueSize = valueSize
    }

    /// The origin's value of `key`, awaited (the work is a sleep of the task).
    func value(_ key: Int) async -> [UInt8] {
        if originUs > 0 { try? await Task.sleep(for: .microseconds(originUs)) }
        return current(key)
    }

    /// The origin's value of `key`, the work slept on this thread (the thread callers' loads).
    func valueBlocking(_ key: Int) -> [UInt8] {
        if originUs > 0 { usleep(UInt32(originUs)) }
        return current(key)
    }

    private func current(_ key: Int) -> [UInt8] {
        let now = monotonicNanoseconds()
        if now >= table.load(table.startWord), now < table.load(table.endWord) { calls.add(1, ordering: .relaxed) }
        return FleetValue.make(key: key, version: table.committedVersion(key), size: valueSize)
    }

    /// Origin calls within the measured window.
    var measuredCalls: Int { calls.load(ordering: .relaxed) }
}

/// The benchmark's values: "<key>:<version>:" padded to the value size, so a read names what it read.
enum FleetValue {
    static func make(key: Int, version: Int64, size: Int) -> [UInt8] {
        var bytes = Array("\(key):\(version):".utf8)
        bytes.reserveCapacity(max(size, bytes.count))
        while bytes.count < size { bytes.append(UInt8(ascii: "a") + UInt8(bytes.count % 26)) }
        return bytes
    }

    /// The key and version a value carries (nil: not one of this benchmark's values).
    static func parse(_ bytes: [UInt8]) -> (Int, Int64)? {
        let parts = bytes.prefix(40).split(separator: UInt8(ascii: ":"), maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, let key = Int(String(decoding: parts[0], as: UTF8.self)),
            let version = Int64(String(decoding: parts[1], as: UTF8.self))
        else { return nil }
        return (key, version)
    }
}

/// A system's invalidation feed: confirmed (its messages are known to arrive: the hand-built pattern's
/// subscriber connected, Magpie's heartbeat seen within 200 ms) and delivered (every instance's writes
/// landed: Magpie's fleet watermark within 350 ms; the pattern has none to wait for).
struct FleetFeedHealth {
    var confirmed: Bool
    var delivered: Bool
    var healthy: Bool { confirmed && delivered }
}
