import Foundation
import Magpie
import MagpieVapor
import Vapor
import XCTVapor
import XCTest

/// A measurement, printed: the same writes of distinct keys through `app.cache`, to a Magpie cache
/// with a 4 MiB memory budget and to Vapor's memory cache. Magpie's stays within its budget (asserted:
/// it is the budget's promise); the memory cache keeps every value (asserted: every key reads back) and
/// the process's resident memory grows with them (measured, printed, not asserted: the allocator
/// decides what it returns).
final class BoundedMemoryTests: XCTestCase {
    static let keys = 8_000
    static let valueLength = 2_500
    static let budget = 4 << 20

    /// The process's resident set, in bytes (Linux's /proc/self/statm; 0 where it is not readable).
    func residentBytes() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    func fill(_ app: Application) async throws -> (seconds: Double, residentGrowth: Int, readable: Int) {
        let padding = String(repeating: "v", count: Self.valueLength - 8)
        let residentBefore = residentBytes()
        let start = ContinuousClock.now
        for index in 0..<Self.keys {
            // A value of its own per key (the memory cache keeps the Swift value: one shared string
            // would be counted once).
            let number = String(index)
            try await app.cache.set("key-\(index)", to: String(repeating: "0", count: 8 - number.count) + number + padding)
        }
        let elapsed = ContinuousClock.now - start
        let residentGrowth = residentBytes() - residentBefore
        var readable = 0
        for index in 0..<Self.keys where try await app.cache.get("key-\(index)", as: String.self) != nil {
            readable += 1
        }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return (seconds, residentGrowth, readable)
    }

    func testABoundedMagpieCacheHoldsItsBudgetWhereTheMemoryCacheGrows() async throws {
        let written = Self.keys * Self.valueLength
        let magpie = try makeCache(memoryBudget: Self.budget)
        let magpieApp = try await Application.make(.testing)
        magpieApp.caches.use(.magpie(magpie))
        let magpieRun = try await fill(magpieApp)
        let statistics = magpie.statistics.memory
        XCTAssertLessThanOrEqual(statistics.chargedBytes, Self.budget)
        XCTAssertLessThan(magpieRun.readable, Self.keys)
        XCTAssertEqual(statistics.entries, magpieRun.readable)

        let memoryApp = try await Application.make(.testing)
        memoryApp.caches.use(.memory)
        let memoryRun = try await fill(memoryApp)
        XCTAssertEqual(memoryRun.readable, Self.keys)

        func mib(_ bytes: Int) -> String { String(format: "%.1f MiB", Double(bytes) / 1_048_576) }
        print(
            """
            [bounded-memory] \(Self.keys) distinct keys of \(Self.valueLength)-byte strings (\(mib(written)) of values) through app.cache:
            [bounded-memory]   magpie (4 MiB memory budget): \(magpieRun.readable) keys held, \(mib(statistics.chargedBytes)) charged of \(mib(Self.budget)), \(statistics.evictions) evicted, resident +\(mib(magpieRun.residentGrowth)), \(String(format: "%.2f", magpieRun.seconds)) s
            [bounded-memory]   vapor memory cache (no bound): \(memoryRun.readable) keys held, resident +\(mib(memoryRun.residentGrowth)), \(String(format: "%.2f", memoryRun.seconds)) s
            """)
        try await memoryApp.asyncShutdown()
        try await magpieApp.asyncShutdown()
        try await magpie.shutdown()
    }
}
