import Foundation
import MagpieTestSupport
import Testing

@testable import Magpie

/// Writes `byte(i)` at every offset i and records what it saw.
private struct Pattern: ByteFiller {
    var seed: UInt8
    var calls = 0
    var lengths: [Int] = []

    static func byte(_ index: Int, _ seed: UInt8) -> UInt8 { UInt8(truncatingIfNeeded: index &* 31) ^ seed }

    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        calls += 1
        lengths.append(buffer.count)
        for index in 0..<buffer.count { buffer[index] = Self.byte(index, seed) }
    }
}

/// Fails after writing half: the failure stays in the filler, the buffer is written whole.
private struct FailingHalfway: ByteFiller {
    var failed = false
    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        buffer.initializeMemory(as: UInt8.self, repeating: 0)
        for index in 0..<(buffer.count / 2) { buffer[index] = 0xAB }
        failed = true
    }
}

@Suite("Byte arrays written in place (the disk tier's read path)")
struct ByteArrayFillTests {
    @Test("the array holds exactly what the filler wrote, filled once, at every size", arguments: [0, 1, 7, 64, 4096, 65_537, 1 << 20])
    func exactBytes(count: Int) {
        var filler = Pattern(seed: 0x5C)
        let bytes = [UInt8](count: count, filledBy: &filler)
        #expect(bytes.count == count)
        #expect(filler.calls == 1)
        #expect(filler.lengths == [count])
        #expect(bytes.indices.allSatisfy { bytes[$0] == Pattern.byte($0, 0x5C) })
        // A new array each time, never storage shared with an earlier one.
        var second = Pattern(seed: 0x11)
        let other = [UInt8](count: count, filledBy: &second)
        #expect(bytes.indices.allSatisfy { bytes[$0] == Pattern.byte($0, 0x5C) })
        #expect(other.indices.allSatisfy { other[$0] == Pattern.byte($0, 0x11) })
    }

    @Test("a filler's failure reaches the caller through the filler")
    func failureKept() {
        var filler = FailingHalfway()
        let bytes = [UInt8](count: 100, filledBy: &filler)
        #expect(filler.failed)
        #expect(bytes.count == 100)
    }

    @Test("FilledBytes hands the filler only a buffer of its own count; any other is zeroed and left unfilled")
    func otherBuffersRefused() {
        var filler = Pattern(seed: 1)
        var ran = false
        withUnsafeMutablePointer(to: &filler) { fillerPointer in
            withUnsafeMutablePointer(to: &ran) { ranPointer in
                let collection = FilledBytes(count: 16, filler: fillerPointer, ran: ranPointer)
                let short = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 8)
                defer { short.deallocate() }
                short.initialize(repeating: 0xEE)
                let (_, written) = collection._copyContents(initializing: short)
                #expect(written == 8)
                #expect(short.allSatisfy { $0 == 0 })
                #expect(!ranPointer.pointee)
                // Iterated instead of copied: zeros, never bytes a filler was asked for.
                #expect(Array(collection.makeIterator()) == [UInt8](repeating: 0, count: 16))
            }
        }
        #expect(filler.calls == 0)
    }
}

@Suite("Thread contexts: one per thread, handed on when a thread ends")
struct ThreadContextsTests {
    final class Counter: @unchecked Sendable {
        let serial: Int
        init(_ serial: Int) { self.serial = serial }
    }

    /// Runs `body(i)` for i in 0..<count, each on a new thread, and joins them all: when it returns, every
    /// thread has ended and run its keys' destructors (glibc runs them before a thread can be joined).
    static func onJoinedThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
        final class Work: @unchecked Sendable {
            let run: () -> Void
            init(_ run: @escaping () -> Void) { self.run = run }
        }
        var threads: [pthread_t] = []
        for index in 0..<count {
            var thread = pthread_t()
            let work = Unmanaged.passRetained(Work { body(index) }).toOpaque()
            let created = pthread_create(&thread, nil, { work in
                Unmanaged<Work>.fromOpaque(work!).takeRetainedValue().run()
                return nil
            }, work)
            precondition(created == 0, "pthread_create failed")
            threads.append(thread)
        }
        for thread in threads { pthread_join(thread, nil) }
    }

    @Test("a thread keeps its context; a new thread takes an ended thread's; beyond the limit an ended thread's is dropped")
    func handedOn() throws {
        let made = Locked(0)
        let contexts = ThreadContexts<Counter>(spareLimit: 2) { () throws(MagpieError) in
            Counter(made.withLock { count in
                count += 1
                return count
            })
        }
        // One thread: the same context on every call.
        let seen = Locked<[Int]>([])
        Self.onJoinedThreads(1) { _ in
            for _ in 0..<5 { _ = try? contexts.withContext { context in seen.withLock { $0.append(context.serial) } } }
        }
        #expect(seen.withLock { $0 } == [1, 1, 1, 1, 1])
        #expect(contexts.spareCount == 1)
        // The next thread takes that context instead of making one.
        let second = Locked(0)
        Self.onJoinedThreads(1) { _ in _ = try? contexts.withContext { context in second.withLock { $0 = context.serial } } }
        #expect(second.withLock { $0 } == 1)
        #expect(made.withLock { $0 } == 1)
        // Four threads at once, each holding its context until all four have one: four contexts in use.
        let holding = DispatchGroup()
        for _ in 0..<4 { holding.enter() }
        let release = DispatchSemaphore(value: 0)
        let allHeld = DispatchSemaphore(value: 0)
        let waiter = Thread {
            holding.wait()
            allHeld.signal()
            for _ in 0..<4 { release.signal() }
        }
        waiter.start()
        Self.onJoinedThreads(4) { _ in
            _ = try? contexts.withContext { _ in holding.leave() }
            release.wait()
        }
        allHeld.wait()
        #expect(made.withLock { $0 } == 4)  // the spare one, and three made
        // Four ended threads, two spare places: the limit holds.
        #expect(contexts.spareCount == 2)
    }

    @Test("a failure to make a context is the caller's error, and the next call tries again")
    func makeFails() {
        let attempts = Locked(0)
        let contexts = ThreadContexts<Counter>(spareLimit: 1) { () throws(MagpieError) in
            let attempt = attempts.withLock { count in
                count += 1
                return count
            }
            if attempt == 1 { throw MagpieError(.decompressionFailed, "no memory (test)") }
            return Counter(attempt)
        }
        let outcomes = Locked<[String]>([])
        Self.onJoinedThreads(1) { _ in
            for _ in 0..<2 {
                do throws(MagpieError) {
                    let serial = try contexts.withContext { $0.serial }
                    outcomes.withLock { $0.append("context \(serial)") }
                } catch {
                    outcomes.withLock { $0.append("\(error.code)") }
                }
            }
        }
        #expect(outcomes.withLock { $0 } == ["decompressionFailed", "context 2"])
    }

    @Test("compressed values read from many threads at once, each with its own context: every byte right")
    func compressedReadsFromThreads() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(DiskTier.Configuration(directory: directory.path, budget: 64 << 20, bucketCount: 8, hashSeed: 5))
        @Sendable func value(_ key: Int) -> [UInt8] {
            let line = Array(#"{"user":"magpie","items":[1,2,3],"active":true}"#.utf8)
            return (0..<(1000 + key * 13 % 3000)).map { line[($0 + key) % line.count] }
        }
        for key in 0..<300 { try tier.set(value(key), forKey: keyBytes(key)) }
        try tier.flush()
        #expect(tier.statistics.storedValueBytes < tier.statistics.originalValueBytes / 2)  // compressed on disk
        let wrong = Locked(0)
        Self.onJoinedThreads(6) { reader in
            for round in 0..<400 {
                let key = (round * 7 + reader * 31) % 300
                if (try? tier.value(forKey: keyBytes(key))) != value(key) { wrong.withLock { $0 += 1 } }
            }
        }
        #expect(wrong.withLock { $0 } == 0)
        try tier.close()
    }
}
