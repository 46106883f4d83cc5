import Foundation
import Glibc
import Magpie
import MagpieTestSupport
import Synchronization
import Testing

// The memory tier's hits take no lock (Sources/Magpie/Memory/LockFreeRead.swift). These tests race
// readers against every writer the tier has (replacements of every size, removals, evictions, large
// entries that borrow and free at once, removeAll, group removals) on real threads, and check each read
// against what the writers had completed before it began. They run in the unit suite, under Thread
// Sanitizer (`make tsan`) and under Address Sanitizer (`make asan`: a block freed while a reader still
// copies it is a heap-use-after-free report there, not a silent wrong byte).
// MAGPIE_LINEARIZABILITY_SECONDS sets the racing time (default 1.5 s).

/// A value that describes itself: key, version, length, bytes derived from them, and a checksum over all
/// of that, so a torn, foreign or stale value is recognised.
private enum Described {
    static func make(key: Int, version: Int, length: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: max(length, 22))
        withUnsafeBytes(of: UInt32(key).littleEndian) { bytes.replaceSubrange(0..<4, with: $0) }
        withUnsafeBytes(of: UInt64(version).littleEndian) { bytes.replaceSubrange(4..<12, with: $0) }
        withUnsafeBytes(of: UInt16(bytes.count).littleEndian) { bytes.replaceSubrange(12..<14, with: $0) }
        for i in 14..<(bytes.count - 8) { bytes[i] = UInt8(truncatingIfNeeded: key &* 31 &+ version &* 17 &+ i) }
        let sum = checksum(bytes[0..<(bytes.count - 8)])
        withUnsafeBytes(of: sum.littleEndian) { bytes.replaceSubrange((bytes.count - 8)..<bytes.count, with: $0) }
        return bytes
    }

    static func checksum(_ bytes: some Collection<UInt8>) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }

    /// The version of `bytes` if they are a whole, intact value of `key`; nil otherwise.
    static func version(of bytes: UnsafeRawBufferPointer, key: Int) -> Int? {
        guard bytes.count >= 22 else { return nil }
        let storedKey = Int(UInt32(littleEndian: bytes.loadUnaligned(as: UInt32.self)))
        let version = Int(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt64.self)))
        let length = Int(UInt16(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt16.self)))
        let sum = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: bytes.count - 8, as: UInt64.self))
        guard storedKey == key, length == bytes.count, sum == checksum(bytes[0..<(bytes.count - 8)]) else { return nil }
        return version
    }
}

/// Per key: the last version whose store completed, and the floor: the oldest version a read that
/// begins now may return (the last completed store's; one more once a completed removal took it).
private final class Ledger: @unchecked Sendable {
    // @unchecked Sendable invariant: the two arrays are allocated once and only accessed atomically.
    let keys: Int
    private let stored: UnsafeMutablePointer<Atomic<Int>>
    private let floors: UnsafeMutablePointer<Atomic<Int>>

    init(keys: Int) {
        self.keys = keys
        stored = UnsafeMutablePointer<Atomic<Int>>.allocate(capacity: keys)
        floors = UnsafeMutablePointer<Atomic<Int>>.allocate(capacity: keys)
        for key in 0..<keys {
            (stored + key).initialize(to: Atomic(0))
            (floors + key).initialize(to: Atomic(0))
        }
    }

    deinit {
        stored.deinitialize(count: keys)
        floors.deinitialize(count: keys)
        stored.deallocate()
        floors.deallocate()
    }

    func floor(_ key: Int) -> Int { (floors + key).pointee.load(ordering: .acquiring) }
    func lastStored(_ key: Int) -> Int { (stored + key).pointee.load(ordering: .acquiring) }

    func completedStore(_ key: Int, version: Int) {
        (stored + key).pointee.store(version, ordering: .releasing)
        raiseFloor(key, to: version)
    }

    func raiseFloor(_ key: Int, to version: Int) {
        var current = (floors + key).pointee.load(ordering: .relaxed)
        while current < version {
            let (exchanged, original) = (floors + key).pointee.compareExchange(
                expected: current, desired: version, ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }
}

/// Runs `body(i)` for i in 0..<count, each on a thread of its own, and waits for all.
private func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let done = DispatchSemaphore(value: 0)
    for index in 0..<count {
        let thread = Thread {
            body(index)
            done.signal()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    for _ in 0..<count { done.wait() }
}

private let racingSeconds: Double = {
    ProcessInfo.processInfo.environment["MAGPIE_LINEARIZABILITY_SECONDS"].flatMap(Double.init) ?? 1.5
}()

@Suite("MemoryTier: lock-free hits")
struct MemoryLockFreeReadTests {
    /// One run: `writers` threads own the keys (key % writers), storing new versions (lengths from 22 bytes
    /// to a few KiB, so replacements change size and some entries are large), removing some; one thread
    /// removes all and removes groups; `readers` threads read every key, copying and in place, and check
    /// that each value is whole, belongs to its key and is not older than the floor taken before the read.
    private func race(
        budget: Int, shards: Int, keys: Int, writers: Int, readers: Int, largeEvery: Int
    ) throws -> (reads: Int, hits: Int, wrong: Int, stale: Int, tier: MemoryTier) {
        let tier = try MemoryTier(budget: budget, shardCount: shards, hashSeed: 99)
        let ledger = Ledger(keys: keys)
        let tally = Tally()
        let deadline = Date().addingTimeInterval(racingSeconds)
        let flags = StopFlag()
        onThreads(writers + 1 + readers) { role in
            var random = SeededGenerator(seed: UInt64(role) &* 0x9e37_79b9 &+ 1)
            if role < writers {
                var versions = [Int](repeating: 0, count: keys)
                var step = 0
                while !flags.stopped {
                    step += 1
                    let key = Int.random(in: 0..<(keys / writers), using: &random) * writers + role
                    if Int.random(in: 0..<10, using: &random) == 0 {
                        // A removal: once it completes, the version it took is gone.
                        tier.removeValue(forKey: keyBytes(key))
                        ledger.raiseFloor(key, to: versions[key] + 1)
                        continue
                    }
                    versions[key] += 1
                    let length =
                        step % largeEvery == 0
                        ? Int.random(in: 2048...6000, using: &random) : Int.random(in: 22...400, using: &random)
                    let value = Described.make(key: key, version: versions[key], length: length)
                    _ = try? tier.set(value, forKey: keyBytes(key), group: "g\(key % 4)")
                    ledger.completedStore(key, version: versions[key])
                    if step % 256 == 0 && Date() > deadline { flags.stop() }
                }
            } else if role == writers {
                // Bulk removals: what was stored before one began is gone once it returns.
                var round = 0
                var evicted = tier.statistics.evictions
                while !flags.stopped {
                    round += 1
                    usleep(10_000)  // time enough for the writers to fill the budget again, and evict
                    // ...and longer on a loaded machine (under ASan, beside the other suites, 10 ms once let
                    // the writers evict nothing all run): the next removal waits for an eviction.
                    while !flags.stopped && tier.statistics.evictions == evicted { usleep(1_000) }
                    evicted = tier.statistics.evictions
                    let group = round % 5 == 0 ? nil : Int.random(in: 0..<4, using: &random)
                    let before = (0..<keys).map { ledger.lastStored($0) }
                    if let group {
                        tier.removeAll(inGroup: "g\(group)")
                    } else {
                        tier.removeAll()
                    }
                    for key in 0..<keys where group == nil || key % 4 == group! {
                        ledger.raiseFloor(key, to: before[key] + 1)
                    }
                }
            } else {
                var count = 0
                var found = 0
                while !flags.stopped {
                    let key = Int.random(in: 0..<keys, using: &random)
                    let floor = ledger.floor(key)
                    count += 1
                    let version: Int??
                    if count % 2 == 0 {
                        version = tier.value(forKey: keyBytes(key)).map { value in
                            value.withUnsafeBytes { Described.version(of: $0, key: key) }
                        }
                    } else {
                        version = tier.withValue(forKey: keyBytes(key)) { Described.version(of: $0, key: key) }
                    }
                    guard let version else { continue }
                    found += 1
                    guard let version else {
                        tally.wrong.add(1, ordering: .relaxed)
                        continue
                    }
                    if version < floor { tally.stale.add(1, ordering: .relaxed) }
                }
                tally.reads.add(count, ordering: .relaxed)
                tally.hits.add(found, ordering: .relaxed)
            }
        }
        return (
            tally.reads.load(ordering: .relaxed), tally.hits.load(ordering: .relaxed),
            tally.wrong.load(ordering: .relaxed), tally.stale.load(ordering: .relaxed), tier
        )
    }

    @Test("readers racing replacements, removals, evictions, large entries and bulk removals: never a torn, foreign, stale or freed value")
    func linearisable() throws {
        // 1,024 keys of 200 B on average: about 4 × the budget, so the writers evict soon after every bulk removal.
        let run = try race(budget: 48 * 1024, shards: 4, keys: 1024, writers: 2, readers: 3, largeEvery: 50)
        #expect(run.wrong == 0)
        #expect(run.stale == 0)
        #expect(run.reads > 1000)
        #expect(run.hits > 100)
        let statistics = run.tier.statistics
        #expect(statistics.evictions > 0)
        #expect(run.tier.chargedBytes <= run.tier.budget)
        #expect(statistics.entries == Int(statistics.inserts) - Int(statistics.removals) - Int(statistics.evictions) - Int(statistics.expirations))
        // Every read was counted once, lock-free or under the lock.
        #expect(statistics.hits + statistics.misses == UInt64(run.reads))
        // With no reader left, a bulk removal frees everything retired.
        #expect(settled(run.tier))
    }

    @Test("readers racing index growth and removeAll on few shards with room for everything: every key stored and not removed is found")
    func growth() throws {
        // Room for everything: nothing is evicted, so a read of a key whose store completed and that no one
        // removed must hit, even while the index doubles under it (a miss there is confirmed under the lock).
        let tier = try MemoryTier(budget: 64 << 20, shardCount: 1, hashSeed: 5)
        let keys = 20_000
        let tally = Tally()  // reads: keys published; wrong: reads that missed or found another value
        let flags = StopFlag()
        onThreads(3) { role in
            if role == 0 {
                for key in 0..<keys {
                    _ = try? tier.set(Described.make(key: key, version: 1, length: 40), forKey: keyBytes(key))
                    tally.reads.store(key + 1, ordering: .releasing)
                }
                flags.stop()
            } else {
                var random = SeededGenerator(seed: UInt64(role))
                while !flags.stopped {
                    let known = tally.reads.load(ordering: .acquiring)
                    guard known > 0 else { continue }
                    let key = Int.random(in: 0..<known, using: &random)
                    let version = tier.withValue(forKey: keyBytes(key)) { Described.version(of: $0, key: key) }
                    if version != .some(.some(1)) { tally.wrong.add(1, ordering: .relaxed) }
                }
            }
        }
        #expect(tally.wrong.load(ordering: .relaxed) == 0)
        #expect(tier.count == keys)
    }

    @Test("a read inside a read (withValue's body reading again, and storing) neither deadlocks nor frees what the outer read holds")
    func nested() throws {
        let tier = try MemoryTier(budget: 8 * 1024, shardCount: 1, hashSeed: 3)
        try tier.set(Described.make(key: 1, version: 1, length: 100), forKey: keyBytes(1))
        let outer = tier.withValue(forKey: keyBytes(1)) { bytes -> Int? in
            // Replace and evict the entry the outer read holds, many times over, from inside its body.
            for version in 2..<200 {
                _ = try? tier.set(Described.make(key: 1, version: version, length: 100), forKey: keyBytes(1))
                for other in 2..<10 { _ = try? tier.set(Described.make(key: other, version: version, length: 500), forKey: keyBytes(other)) }
                _ = tier.value(forKey: keyBytes(1))
            }
            // The outer read's bytes are still the value it found.
            return Described.version(of: bytes, key: 1)
        }
        #expect(outer == .some(.some(1)))
        #expect(tier.statistics.unreclaimedBytes > 0)  // held back while the outer read ran
        #expect(settled(tier))
    }
}

/// Empties `tier` until nothing retired is left unfreed. The read epochs are the process's: a thread
/// reading another tier (a test running beside this one) may be pinned at an older epoch during one
/// pass; it moves on within microseconds, so a later pass frees the rest. False after 2 s.
private func settled(_ tier: MemoryTier) -> Bool {
    for _ in 0..<2000 {
        tier.removeAll()
        if tier.statistics.unreclaimedBytes == 0 { return true }
        usleep(1000)
    }
    return false
}

/// What the racing threads count.
private final class Tally: Sendable {
    let reads = Atomic<Int>(0)
    let hits = Atomic<Int>(0)
    let wrong = Atomic<Int>(0)
    let stale = Atomic<Int>(0)
}

/// A stop flag the racing threads poll.
private final class StopFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var stopped: Bool { flag.load(ordering: .relaxed) }
    func stop() { flag.store(true, ordering: .relaxed) }
}
