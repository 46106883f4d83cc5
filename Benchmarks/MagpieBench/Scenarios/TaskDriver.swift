import Foundation
import Histogram
import Synchronization

// The task driver of the async scenarios (`fleet-async`, `disk-tasks`): a fixed number of operations
// from N concurrent tasks on Swift's global executor, the way services call an async API, each task
// taking the next operation as it finishes one.

/// Runs `operation(i)` for i in 0..<count from `tasks` concurrent tasks on the global executor (each takes
/// the next i). Each operation's latency is its own call only; `check` then judges what it returned (a
/// found or correct result), outside the timed span. Returns every operation's tally and the wall time.
func driveTasks<Result: Sendable>(
    tasks: Int, count: Int, _ operation: @escaping @Sendable (Int) async throws -> Result,
    check: @escaping @Sendable (Int, Result) -> Bool
) async -> (tally: TaskTally, seconds: Double) {
    let next = TaskCounter()
    let start = ContinuousClock.now
    let tallies = await withTaskGroup(of: TaskTally.self) { group -> [TaskTally] in
        for _ in 0..<tasks {
            group.addTask {
                var tally = TaskTally()
                while true {
                    let i = next.take()
                    guard i < count else { break }
                    let began = ContinuousClock.now
                    do {
                        let result = try await operation(i)
                        tally.latency.record(nanoseconds(since: began))
                        if check(i, result) { tally.found += 1 }
                    } catch {
                        tally.latency.record(nanoseconds(since: began))
                        tally.errors += 1
                    }
                }
                return tally
            }
        }
        var all: [TaskTally] = []
        for await tally in group { all.append(tally) }
        return all
    }
    let elapsed = ContinuousClock.now - start
    var total = TaskTally()
    for tally in tallies { total.merge(tally) }
    return (total, Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

private func nanoseconds(since start: ContinuousClock.Instant) -> UInt64 {
    let elapsed = ContinuousClock.now - start
    return UInt64(max(1, elapsed.components.attoseconds / 1_000_000_000 + elapsed.components.seconds * 1_000_000_000))
}

/// Hands out operation numbers to the tasks, one at a time.
final class TaskCounter: Sendable {
    private let value = Atomic(0)
    func take() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}

/// The row of a measurement `driveTasks` made: the rate, each operation's latency, the share found, and
/// `extra` with the workload, the tasks and the errors.
func taskRow(
    _ scenario: String, _ system: String, workload: String, tasks: Int, count: Int, _ measured: (tally: TaskTally, seconds: Double)
) -> BenchResult {
    BenchResult(
        scenario: scenario, system: system, threads: tasks, operations: count, seconds: measured.seconds,
        ops_per_sec: Double(count) / measured.seconds, latency_ns: Percentiles(measured.tally.latency),
        hit_ratio: Double(measured.tally.found) / Double(max(1, count)),
        extra: ["workload": .string(workload), "tasks": .int(tasks), "errors": .int(measured.tally.errors)])
}

/// What one task (or all of them, merged) measured.
struct TaskTally: Sendable {
    var latency = latencyHistogram()
    var found = 0
    var errors = 0

    mutating func merge(_ other: TaskTally) {
        latency.add(other.latency)
        found += other.found
        errors += other.errors
    }
}
