import Foundation
import Magpie
import Synchronization

/// A seeded generator (splitmix64) so every random test replays exactly. Set MAGPIE_TEST_SEED to
/// replay a failing run; the seed in use is part of every failure message.
package struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64

    package init(seed: UInt64) { state = seed }

    package mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

package enum TestSeed {
    /// MAGPIE_TEST_SEED if set, else the given default.
    package static func value(default seed: UInt64) -> UInt64 {
        ProcessInfo.processInfo.environment["MAGPIE_TEST_SEED"].flatMap(UInt64.init) ?? seed
    }
}

/// Incompressible bytes, a function of `seed` (eight at a time: fast enough for tens of MiB in a debug
/// build).
package func noiseBytes(_ count: Int, seed: UInt64) -> [UInt8] {
    var generator = SeededGenerator(seed: seed)
    var words = [UInt64](repeating: 0, count: (count + 7) / 8)
    for i in words.indices { words[i] = generator.next() }
    return words.withUnsafeBytes { Array($0.prefix(count)) }
}

/// A value that names its key and version, so a read can prove it belongs to the key it was read for.
package func selfDescribingValue(key: Int, version: Int, length: Int) -> [UInt8] {
    var bytes = Array("k\(key)v\(version);".utf8)
    while bytes.count < length { bytes.append(UInt8(truncatingIfNeeded: key &* 31 &+ version &+ bytes.count)) }
    return Array(bytes.prefix(max(length, 0)))
}

package func keyBytes(_ key: Int) -> [UInt8] {
    Array("key-\(key)".utf8)
}

/// A fresh empty directory under the system's temporary directory, removed by `cleanup()`.
package struct TemporaryDirectory {
    package let path: String

    package init(_ label: String = "magpie") {
        var template = Array("\(NSTemporaryDirectory())/\(label)-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp failed")
        path = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// A path inside the directory that does not exist yet.
    package func child(_ name: String) -> String { path + "/" + name }

    package func cleanup() {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// A clock tests move by hand; its timers (the loader API's timeouts) fire when it is moved past them.
package final class ManualClock: Sendable {
    private struct State {
        var now: Int64
        var sleepers: [Int: (wake: Int64, continuation: CheckedContinuation<Void, any Error>)] = [:]
        var cancelled: Set<Int> = []
        var nextID = 0
    }

    private let state: Locked<State>

    package init(_ start: Int64 = 1_700_000_000_000) { state = Locked(State(now: start)) }

    package var now: Int64 { state.withLock { $0.now } }
    package func advance(seconds: Int64) { advance(milliseconds: seconds * 1000) }

    /// Moves the clock and wakes the timers now due.
    package func advance(milliseconds: Int64) {
        let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.now += milliseconds
            let due = state.sleepers.filter { $0.value.wake <= state.now }
            for id in due.keys { state.sleepers[id] = nil }
            return due.values.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }

    /// Timers waiting.
    package var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// Waits (polling, up to 10 s of real time) until `count` timers wait; false if they never do.
    package func waitForSleepers(_ count: Int) async -> Bool {
        for _ in 0..<10_000 {
            if sleeperCount >= count { return true }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return false
    }

    /// Suspends until the clock has been moved `duration` past now.
    package func sleep(_ duration: Duration) async throws {
        let (seconds, attoseconds) = duration.components
        let length = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let immediate = state.withLock { state -> Result<Void, any Error>? in
                    if state.cancelled.remove(id) != nil { return .failure(CancellationError()) }
                    if length <= 0 { return .success(()) }
                    state.sleepers[id] = (state.now + length, continuation)
                    return nil
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        } onCancel: {
            let sleeper = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let sleeper = state.sleepers.removeValue(forKey: id) else {
                    state.cancelled.insert(id)
                    return nil
                }
                return sleeper.continuation
            }
            sleeper?.resume(throwing: CancellationError())
        }
    }

    package var cacheClock: CacheClock { CacheClock(now: { [self] in now }, sleep: { [self] in try await sleep($0) }) }
}

/// Sum of the sizes of the files under `path` (recursively).
package func directoryBytes(_ path: String) -> Int {
    guard let names = FileManager.default.subpaths(atPath: path) else { return 0 }
    return names.reduce(0) { total, name in
        let attributes = try? FileManager.default.attributesOfItem(atPath: path + "/" + name)
        guard (attributes?[.type] as? FileAttributeType) == .typeRegular else { return total }
        return total + ((attributes?[.size] as? Int) ?? 0)
    }
}

/// An executable of this package (`magpie-bench`, `magpie-test-child`) built beside this test bundle.
package func builtExecutable(_ name: String) -> String? {
    let directory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    for candidate in [directory, directory.deletingLastPathComponent()] {
        let path = candidate.appendingPathComponent(name).path
        if FileManager.default.isExecutableFile(atPath: path) { return path }
    }
    return nil
}

package struct NotBuilt: Error, CustomStringConvertible {
    package var name: String
    package init(name: String) { self.name = name }
    package var description: String { "\(name) is not built next to the tests; run `make test` (it builds every product)" }
}

/// How a `magpie-test-child` run ended: its exit status, or that it was killed at the timeout.
package struct TestChildOutcome: Sendable {
    /// The child's exit status, or nil when it ended on a signal.
    package var exitStatus: Int32?
    /// Whether the child was still running at the timeout and was killed.
    package var timedOut: Bool
}

/// Runs the `magpie-test-child` built beside the tests with `arguments`, and kills it with SIGKILL if it
/// has not ended after `timeout`.
package func runTestChild(_ arguments: [String], timeout: Duration = .seconds(30)) throws -> TestChildOutcome {
    guard let executable = builtExecutable("magpie-test-child") else { throw NotBuilt(name: "magpie-test-child") }
    let child = Process()
    child.executableURL = URL(fileURLWithPath: executable)
    child.arguments = arguments
    try child.run()
    let deadline = ContinuousClock.now + timeout
    while child.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
    let timedOut = child.isRunning
    if timedOut { kill(child.processIdentifier, SIGKILL) }
    child.waitUntilExit()
    return TestChildOutcome(exitStatus: child.terminationReason == .exit ? child.terminationStatus : nil, timedOut: timedOut)
}

/// Runs the magpie-bench built beside the tests with `arguments`, its output discarded; returns its exit
/// status.
package func runBench(_ arguments: [String]) throws -> Int32 {
    guard let executable = builtExecutable("magpie-bench") else { throw NotBuilt(name: "magpie-bench") }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

/// The self-describing values of the crash loop and of `magpie-bench stress` (the crash child writes
/// them; the crash tests and the stress run check every byte they read back against them):
/// "k<key>v<version>l<length>;" then bytes that follow from (key, version).
package func crashValue(key: Int, version: Int, length: Int) -> [UInt8] {
    var bytes = Array("k\(key)v\(version)l\(length);".utf8)
    var x = UInt64(truncatingIfNeeded: key &* 1_000_003 &+ version)
    while bytes.count < length {
        x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        bytes.append(UInt8(truncatingIfNeeded: x >> 56))
    }
    return bytes
}

/// The key, version and length a value names in its "k<key>v<version>l<length>;" prefix (see
/// ``crashValue(key:version:length:)``), or nil when it names none.
package func crashValueDescription(_ value: [UInt8]) -> (key: Int, version: Int, length: Int)? {
    guard let end = value.firstIndex(of: UInt8(ascii: ";")), let text = String(bytes: value[..<end], encoding: .utf8),
        text.first == "k"
    else { return nil }
    let parts = text.dropFirst().split(whereSeparator: { $0 == "v" || $0 == "l" })
    guard parts.count == 3, let key = Int(parts[0]), let version = Int(parts[1]), let length = Int(parts[2]) else {
        return nil
    }
    return (key, version, length)
}

/// Whether `value` is exactly the crash value of `key` and of the version and length it names.
package func isCrashValue(_ value: [UInt8], ofKey key: Int) -> Bool {
    guard let described = crashValueDescription(value), described.key == key else { return false }
    return value == crashValue(key: key, version: described.version, length: described.length)
}

/// A two-tier cache over a fresh directory, with a manual clock and a fixed seed.
package func makeCache(
    _ directory: TemporaryDirectory?, clock: ManualClock = ManualClock(), memoryBudget: Int = 1 << 20,
    diskBudget: Int = 4 << 20, buckets: Int = 8, defaults: EntryOptions = EntryOptions(), diskWriteBuffer: Int = 64 << 10,
    inlineDiskReads: Bool = true, backgroundLoads: Bool = true
) throws -> Cache {
    var configuration = Cache.Configuration(
        directory: directory?.path, memoryBudget: memoryBudget, diskBudget: diskBudget, defaultOptions: defaults)
    configuration.disk?.bucketCount = buckets
    configuration.disk?.writeBufferSize = diskWriteBuffer
    configuration.memory.shardCount = 4
    configuration.clock = clock.cacheClock
    configuration.hashSeed = 42
    configuration.metrics = nil
    configuration.inlineResidentDiskReads = inlineDiskReads
    configuration.disk?.loadsInBackground = backgroundLoads
    return try Cache(configuration)
}

/// Runs `hold` on a thread of its own: `hold` takes what it holds (a lock) and calls the function it is
/// given, which returns once the caller lets go. Returns, once `hold` holds it, the function that lets go.
package func holdOnAnotherThread(_ hold: @escaping @Sendable (_ waitForRelease: () -> Void) -> Void) -> @Sendable () -> Void {
    let held = DispatchSemaphore(value: 0)
    let release = DispatchSemaphore(value: 0)
    Thread {
        hold {
            held.signal()
            release.wait()
        }
    }.start()
    held.wait()
    return { release.signal() }
}

/// A gate a loader waits at until the test opens it (async loaders) or signals it (blocking loaders).
package final class Gate: Sendable {
    private let state = Locked<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
    private let semaphore = DispatchSemaphore(value: 0)
    private let entered = Atomic<Int>(0)

    package init() {}

    package func wait() async {
        entered.add(1, ordering: .relaxed)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let open = state.withLock { state -> Bool in
                if !state.open { state.waiters.append(continuation) }
                return state.open
            }
            if open { continuation.resume() }
        }
    }

    package func waitBlocking() {
        entered.add(1, ordering: .relaxed)
        semaphore.wait()
    }

    /// Loaders that reached the gate.
    package var arrivals: Int { entered.load(ordering: .relaxed) }

    package func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
        semaphore.signal()
    }
}

/// Polls (1 ms real-time steps, up to 10 s) until `condition` holds.
package func eventually(_ condition: () -> Bool) async -> Bool {
    for _ in 0..<10_000 {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return condition()
}
