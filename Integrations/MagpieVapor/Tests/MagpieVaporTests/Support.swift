import Foundation
import Magpie
import Synchronization
import Vapor

/// A wall clock the tests move by hand (milliseconds since 1970).
final class ManualClock: Sendable {
    private let milliseconds: Atomic<Int64>

    init(_ start: Int64 = 1_800_000_000_000) { milliseconds = Atomic(start) }

    var now: Int64 { milliseconds.load(ordering: .relaxed) }

    func advance(_ duration: Duration) {
        milliseconds.add(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000, ordering: .relaxed)
    }

    var cacheClock: CacheClock { CacheClock(now: { [self] in now }) }
}

/// A directory of its own under the system's temporary directory, removed by `remove()`.
struct TemporaryDirectory {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("magpie-vapor-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// A memory-only cache, or a two-tier cache in `directory`, on `clock` (the system's when nil).
func makeCache(directory: String? = nil, memoryBudget: Int = 8 << 20, clock: ManualClock? = nil) throws -> Magpie.Cache {
    var configuration = Magpie.Cache.Configuration(directory: directory, memoryBudget: memoryBudget, diskBudget: 64 << 20)
    configuration.metrics = nil
    if let clock { configuration.clock = clock.cacheClock }
    return try Magpie.Cache(configuration)
}

/// The stores the cache's memory tier has taken (inserts and replacements).
func memoryWrites(_ cache: Magpie.Cache) -> UInt64 {
    let statistics = cache.statistics.memory
    return statistics.inserts + statistics.updates
}
