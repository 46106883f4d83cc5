import Foundation
import Hummingbird
import Magpie
import MagpieHummingbird

// `magpie-persist-bench`: Hummingbird's `PersistDriver` calls as a service makes them, from 1, 16 and 256
// tasks on Swift's global executor at once: `MagpiePersistDriver` over a memory-only `Cache` beside
// Hummingbird's own `MemoryPersistDriver` (an actor holding the Swift values), in the same run, the
// systems alternating at each task count (Magpie first in odd rounds, Hummingbird first in even ones). Gets are hits (every key set first); sets replace a value
// without an expiry. Each call is timed; throughput is calls over the phase's wall time.
//
//   magpie-persist-bench [--tasks 1 16 256] [--gets N] [--sets N] [--keys N] [--rounds N]

struct Product: Codable, Sendable, Equatable {
    var id: Int
    var name: String
    var price: Double
    var tags: [String]
    var inStock: Bool
}

struct Options {
    var tasks = [1, 16, 256]
    var gets = 400_000
    var sets = 100_000
    var keys = 1_000
    var rounds = 2

    init(_ arguments: [String]) throws {
        var index = 0
        func values() -> [Int] {
            var out: [Int] = []
            while index + 1 < arguments.count, let value = Int(arguments[index + 1]) {
                out.append(value)
                index += 1
            }
            return out
        }
        while index < arguments.count {
            let name = arguments[index]
            let given = values()
            guard !given.isEmpty, given.allSatisfy({ $0 > 0 }) else { throw Usage("\(name) needs positive numbers") }
            switch name {
            case "--tasks": tasks = given
            case "--gets": gets = given[0]
            case "--sets": sets = given[0]
            case "--keys": keys = given[0]
            case "--rounds": rounds = given[0]
            default: throw Usage("unknown option \(name)")
            }
            index += 1
        }
    }
}

struct Usage: Error, CustomStringConvertible {
    let description: String
    init(_ text: String) { description = text + "\nusage: magpie-persist-bench [--tasks 1 16 256] [--gets N] [--sets N] [--keys N] [--rounds N]" }
}

func product(_ id: Int) -> Product {
    Product(id: id, name: "Product \(id)", price: Double(id % 1000) + 0.99, tags: ["magpie", "bench", "tag\(id % 7)"], inStock: id % 3 != 0)
}

@inline(__always) func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

/// Runs `total` calls split over `tasks` child tasks: (calls per second, sorted latencies in ns).
func measure(tasks: Int, total: Int, _ call: @escaping @Sendable (Int) async throws -> Void) async throws -> (Double, [UInt64]) {
    let start = now()
    let latencies = try await withThrowingTaskGroup(of: [UInt64].self) { group in
        for task in 0..<tasks {
            let share = total / tasks + (task < total % tasks ? 1 : 0)
            group.addTask {
                var times: [UInt64] = []
                times.reserveCapacity(share)
                var state = UInt64(task) &* 0x9E37_79B9_7F4A_7C15 | 1
                for _ in 0..<share {
                    state ^= state << 13
                    state ^= state >> 7
                    state ^= state << 17
                    let begun = now()
                    try await call(Int(truncatingIfNeeded: state >> 1))
                    times.append(now() - begun)
                }
                return times
            }
        }
        var all: [UInt64] = []
        for try await times in group { all += times }
        return all
    }
    let seconds = Double(now() - start) / 1e9
    return (Double(total) / seconds, latencies.sorted())
}

func percentile(_ sorted: [UInt64], _ p: Double) -> UInt64 {
    sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

func rate(_ value: Double) -> String {
    value >= 1e6 ? String(format: "%.2f M", value / 1e6) : String(format: "%.0f k", value / 1e3)
}

let options: Options
do {
    options = try Options(Array(CommandLine.arguments.dropFirst()))
} catch {
    FileHandle.standardError.write(Data("\(error)\n".utf8))
    exit(2)
}

let cache = try Cache(Cache.Configuration(memoryBudget: 64 << 20))
let systems: [(String, any PersistDriver)] = [
    ("magpie-persist", MagpiePersistDriver(cache: cache, tiers: .memoryOnly)),
    ("hummingbird-memory", MemoryPersistDriver()),
]
let keys = (0..<options.keys).map { "product:\($0)" }
let values = (0..<options.keys).map(product)
for (_, driver) in systems {
    for (key, value) in zip(keys, values) { try await driver.set(key: key, value: value, expires: nil) }
    // Every value reads back exactly before anything is timed.
    for (key, value) in zip(keys, values) {
        guard try await driver.get(key: key, as: Product.self) == value else { fatalError("a value did not read back") }
    }
}

var rows: [[String]] = [["operation", "tasks", "system", "round", "calls/s", "p50 ns", "p99 ns", "p99.9 ns", "magpie / hummingbird"]]
for operation in ["get", "set"] {
    for tasks in options.tasks {
        for round in 1...options.rounds {
            var measured: [String: Double] = [:]
            for (name, driver) in round % 2 == 1 ? systems : systems.reversed() {
                let keyCount = options.keys
                let (perSecond, latencies) =
                    if operation == "get" {
                        try await measure(tasks: tasks, total: options.gets) { n in
                            let i = n % keyCount
                            guard try await driver.get(key: keys[i], as: Product.self) != nil else { fatalError("a get missed") }
                        }
                    } else {
                        try await measure(tasks: tasks, total: options.sets) { n in
                            let i = n % keyCount
                            try await driver.set(key: keys[i], value: values[i], expires: nil)
                        }
                    }
                measured[name] = perSecond
                let ratio = measured.count == 2 ? measured[systems[0].0]! / measured[systems[1].0]! : nil
                rows.append([
                    operation, String(tasks), name, String(round), rate(perSecond), String(percentile(latencies, 0.5)),
                    String(percentile(latencies, 0.99)), String(percentile(latencies, 0.999)),
                    ratio.map { String(format: "%.2f", $0) } ?? "",
                ])
            }
        }
    }
}
let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
for (n, row) in rows.enumerated() {
    print(row.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }.joined(separator: "  "))
    if n == 0 { print(String(repeating: "-", count: widths.reduce(0, +) + 2 * (widths.count - 1))) }
}
try await cache.shutdown()
