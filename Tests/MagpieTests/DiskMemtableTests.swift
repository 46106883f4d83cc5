import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import Magpie

/// The disk tier's memtables (Disk/Memtable.swift, Disk/Bucket+Seal.swift): what is in the file when,
/// what a crash keeps, what a failed write loses.
@Suite("DiskTier: memtables")
struct DiskMemtableTests {
    /// One bucket, so that every record goes through the same memtables.
    static func configuration(_ path: String, buffer: Int = 64 << 10) -> DiskTier.Configuration {
        var configuration = DiskTier.Configuration(
            directory: path, budget: 4 << 20, bucketCount: 1, compressionLevel: nil, hashSeed: 17)
        configuration.writeBufferSize = buffer
        return configuration
    }

    static func fileSize(_ path: String) -> Int {
        let file = DiskMappedReadTests.bucketFiles(path)[0]
        return (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? -1
    }

    /// What a SIGKILL would leave: the files as the kernel has them now, copied while the tier is open.
    /// With `tier` (the tier open on `path`), copied holding every bucket's lock (`holdingEveryBucket`), so
    /// that the copy is one instant of the files, as a crash leaves them.
    static func crashImage(of path: String, to copy: String, holding tier: DiskTier? = nil) throws {
        if let tier { return try tier.holdingEveryBucket { try crashImage(of: path, to: copy) } }
        try FileManager.default.createDirectory(atPath: copy + "/buckets", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: path + "/MANIFEST", toPath: copy + "/MANIFEST")
        for file in DiskMappedReadTests.bucketFiles(path) {
            try FileManager.default.copyItem(atPath: file, toPath: copy + "/buckets/" + (file as NSString).lastPathComponent)
        }
    }

    @Test("stores are served from the memtable before they reach the file, and reach it in the background or on flush")
    func servedFromMemtable() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path))
        _ = tier.statistics  // every bucket loaded
        for i in 0..<10 { try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i)) }
        #expect(tier.statistics.bytesWritten == 0, "a store reached the file before its memtable filled")
        #expect(tier.statistics.bufferedBytes > 10_000)
        for i in 0..<10 { #expect(try tier.value(forKey: keyBytes(i)) == selfDescribingValue(key: i, version: 1, length: 1000)) }
        // Replacing a value still in the memtable writes nothing: the replaced record is never written.
        try tier.set(selfDescribingValue(key: 3, version: 2, length: 500), forKey: keyBytes(3))
        #expect(tier.statistics.bytesWritten == 0)
        // Filling memtables: the background thread writes them; at most two are held at once.
        for i in 10..<300 {
            try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i))
            #expect(tier.statistics.bufferedBytes <= 2 * (64 << 10))
        }
        var statistics = tier.statistics
        for _ in 0..<500 where statistics.bufferedBytes > 64 << 10 {  // the sealer catches up
            usleep(2_000)
            statistics = tier.statistics
        }
        #expect(statistics.bytesWritten > 200 * 1000)
        #expect(statistics.bufferedBytes <= 64 << 10)
        #expect(Self.fileSize(directory.path) <= statistics.bytesOnDisk)  // its last slot may be written in part
        try tier.flush()
        #expect(tier.statistics.bufferedBytes == 0)
        try tier.close()
        let reopened = try DiskTier(Self.configuration(directory.path))
        for i in 0..<300 {
            let expected = i == 3 ? selfDescribingValue(key: 3, version: 2, length: 500) : selfDescribingValue(key: i, version: 1, length: 1000)
            #expect(try reopened.value(forKey: keyBytes(i)) == expected)
        }
        #expect(reopened.statistics.corruptRecords == 0)
        try reopened.close()
    }

    @Test("after a crash: stores still in a memtable are misses, never the values they replaced; removals are kept")
    func crashKeepsRemovals() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path))
        for i in 0..<20 { try tier.set(selfDescribingValue(key: i, version: 1, length: 700), forKey: keyBytes(i)) }
        try tier.flush()
        let written = tier.statistics.bytesWritten
        // Overwrites of values in the file: each writes a tombstone at once, its new value waits.
        for i in 0..<10 { try tier.set(selfDescribingValue(key: i, version: 2, length: 700), forKey: keyBytes(i)) }
        #expect(tier.statistics.bytesWritten > written, "an overwrite of a value in the file wrote no tombstone")
        #expect(try tier.removeValue(forKey: keyBytes(15)))  // in the file: a tombstone, written at once
        #expect(tier.statistics.bufferedBytes > 10 * 700, "a removal wrote the memtable")
        for i in 0..<5 { try tier.set(selfDescribingValue(key: i, version: 3, length: 700), forKey: keyBytes(i)) }
        try tier.set(selfDescribingValue(key: 16, version: 3, length: 700), forKey: keyBytes(16))
        #expect(try tier.removeValue(forKey: keyBytes(17)))
        try tier.set(selfDescribingValue(key: 18, version: 3, length: 700), forKey: keyBytes(18))
        let pendingOnly = tier.statistics.bytesWritten
        try tier.set(selfDescribingValue(key: 30, version: 1, length: 700), forKey: keyBytes(30))
        #expect(try tier.removeValue(forKey: keyBytes(30)))  // only ever in the memtable: nothing to write
        #expect(tier.statistics.bytesWritten == pendingOnly)
        let image = directory.child("crash")
        try Self.crashImage(of: directory.path, to: image, holding: tier)
        let recovered = try DiskTier(Self.configuration(image))
        for i in 0..<20 {
            let got = try recovered.value(forKey: keyBytes(i))
            switch i {
            case 0..<10, 16, 18: #expect(got == nil, "key \(i): its store was lost, and the value it replaced must not come back")
            case 15, 17: #expect(got == nil, "key \(i): a removal was undone by a crash")
            default: #expect(got == selfDescribingValue(key: i, version: 1, length: 700), "key \(i)")
            }
        }
        #expect(try recovered.value(forKey: keyBytes(30)) == nil)
        #expect(recovered.statistics.corruptRecords == 0)
        try recovered.close()
        // The tier itself still has every value.
        for i in 0..<5 { #expect(try tier.value(forKey: keyBytes(i)) == selfDescribingValue(key: i, version: 3, length: 700)) }
        try tier.close()
    }

    @Test("a failed memtable write: its stores become counted misses, the next store or flush throws, the tier goes on")
    func failedMemtableWrite() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path, buffer: 16 << 10))
        for i in 0..<30 { try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i)) }
        try tier.flush()
        FileIOFaults.set(under: directory.path) { call, _ in call == "pwrite" ? ENOSPC : nil }
        // 5 is in the file: its overwrite must write a tombstone first, which fails: the store throws, and
        // 5 keeps its value.
        #expect(throws: MagpieError.self) { try tier.set(selfDescribingValue(key: 5, version: 2, length: 1000), forKey: keyBytes(5)) }
        // New keys go to memtables, which the background thread fails to write: the stores returned, and
        // are lost; the next store after each failure learns of it (it throws, and stores nothing).
        var returned: [Int] = []
        var thrown = 0
        for i in 30..<100 {
            do {
                try tier.set(selfDescribingValue(key: i, version: 1, length: 1000), forKey: keyBytes(i))
                returned.append(i)
            } catch {
                #expect(error.code == .noSpace)
                thrown += 1
            }
            usleep(200)  // lets the background thread fail in between
        }
        #expect(thrown >= 1, "no store learned that the stores before it were lost")
        let buffered = tier.statistics.bufferedBytes
        var failure: MagpieError? = nil
        do { try tier.flush() } catch { failure = error }
        #expect(failure?.code == .noSpace || (buffered == 0 && thrown >= 1), "flush returned although stores were lost")
        FileIOFaults.set(under: directory.path, nil)
        func expected(_ i: Int) -> [UInt8]? { i < 30 ? selfDescribingValue(key: i, version: 1, length: 1000) : nil }
        for i in 0..<100 { #expect(try tier.value(forKey: keyBytes(i)) == expected(i), "key \(i)") }
        #expect(tier.statistics.lostBufferedStores == UInt64(returned.count))
        #expect(tier.statistics.bufferedBytes == 0)
        try tier.flush()  // each failure was reported once
        try tier.set([1, 2, 3], forKey: "after")
        try tier.close()
        let reopened = try DiskTier(Self.configuration(directory.path))
        #expect(try reopened.value(forKey: "after") == [1, 2, 3])
        for i in 0..<100 { #expect(try reopened.value(forKey: keyBytes(i)) == expected(i), "key \(i) after reopen") }
        #expect(reopened.statistics.corruptRecords == 0)
        try reopened.close()
    }

    @Test("reclaims and memtables together: the file stays within its budget, no older value is ever read")
    func reclaimsWithMemtables() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        var configuration = Self.configuration(directory.path)
        configuration.budget = 256 << 10  // one bucket of 256 KiB: memtables of 32 KiB
        let tier = try DiskTier(configuration)
        var latest: [Int: [UInt8]] = [:]
        var generator = SeededGenerator(seed: 8)
        for step in 0..<2000 {
            let key = Int.random(in: 0..<60, using: &generator)
            latest[key] = selfDescribingValue(key: key, version: step, length: Int.random(in: 100..<3000, using: &generator))
            try tier.set(latest[key]!, forKey: keyBytes(key))
            #expect(Self.fileSize(directory.path) <= 256 << 10)
            if step % 7 == 0 {
                let probe = Int.random(in: 0..<60, using: &generator)
                let got = try tier.value(forKey: keyBytes(probe))
                #expect(got == nil || got == latest[probe], "key \(probe) read an older value")
            }
        }
        #expect(tier.statistics.regionsReclaimed > 5)
        for key in 0..<60 {
            let got = try tier.value(forKey: keyBytes(key))
            #expect(got == nil || got == latest[key], "key \(key) read an older value")
        }
        #expect(tier.statistics.corruptRecords == 0 && tier.statistics.lostBufferedStores == 0)
        try tier.close()
        let reopened = try DiskTier(configuration)
        for key in 0..<60 {
            let got = try reopened.value(forKey: keyBytes(key))
            #expect(got == nil || got == latest[key], "key \(key) read an older value after reopen")
        }
        try reopened.close()
    }

    @Test("a Cache writes its disk buffers to the kernel every diskBufferWriteInterval; without it they wait")
    func cacheWritesBuffers() async throws {
        for interval in [Duration.milliseconds(50), nil] {
            let directory = TemporaryDirectory()
            defer { directory.cleanup() }
            var configuration = Cache.Configuration(directory: directory.path, memoryBudget: 1 << 20, diskBudget: 4 << 20)
            configuration.disk?.bucketCount = 1
            configuration.hashSeed = 3
            configuration.metrics = nil
            configuration.diskBufferWriteInterval = interval
            let cache = try Cache(configuration)
            let value = selfDescribingValue(key: 1, version: 1, length: 3000)
            try await cache.async.set(value, forKey: "k")
            var buffered = cache.statistics.disk?.bufferedBytes ?? -1
            for _ in 0..<(interval == nil ? 15 : 100) where buffered != 0 {  // up to 0.3 s (6 intervals) or 2 s
                try await Task.sleep(for: .milliseconds(20))
                buffered = cache.statistics.disk?.bufferedBytes ?? -1
            }
            if interval == nil {
                #expect(buffered > 0, "without the periodic write the store stays buffered")
            } else {
                #expect(buffered == 0, "the periodic write did not run")
                // What a SIGKILL would leave now holds the store.
                let image = directory.child("crash")
                try Self.crashImage(of: directory.path, to: image)
                let recovered = try DiskTier(.init(directory: image, budget: 4 << 20))
                #expect(try recovered.value(forKey: "k") == value)
                try recovered.close()
            }
            try cache.close()
        }
    }

    /// Holds the sealer thread's next `pwrite` under a directory (an injected fault, which the caller
    /// removes) until `release` is signalled; it then goes ahead, or fails with `errno`.
    final class HeldSealerWrite: Sendable {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        private let armed = Locked(true)

        init(under path: String, failingWith errno: Int32? = nil) {
            FileIOFaults.set(under: path) { [self] call, _ in
                guard call == "pwrite", IOThreadPool.currentThreadName == "magpie-io-sealer",
                    armed.withLock({ let was = $0; $0 = false; return was })
                else { return nil }
                entered.signal()
                _ = release.wait(timeout: .now() + 20)
                return errno
            }
        }

        /// Waits until the sealer thread is in the held write; records an issue (and lets it go) if it
        /// never gets there.
        func waitUntilHeld() -> Bool {
            guard entered.wait(timeout: .now() + 10) == .success else {
                Issue.record("the sealer never wrote the memtable")
                release.signal()
                return false
            }
            return true
        }
    }

    /// What `writeOutsideTheLock` does to a record of the held write: each one lands the write, so each
    /// runs alone (a second one would find the records in the file already).
    enum HeldChange: String, CaseIterable, Sendable {
        case removal, overwrite, groupRemoval
    }

    @Test(
        "a memtable's write holds no lock: stores and reads of its bucket go on meanwhile; what they remove or replace in it stays so after a crash",
        arguments: HeldChange.allCases)
    func writeOutsideTheLock(_ change: HeldChange) throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path, buffer: 16 << 10))
        @Sendable func value(_ i: Int, _ version: Int) -> [UInt8] { selfDescribingValue(key: i, version: version, length: 1000) }
        for i in 0..<5 { try tier.set(value(i, 1), forKey: keyBytes(i)) }
        try tier.flush()  // the region is open: the next seal's only `pwrite` is its records'
        let held = HeldSealerWrite(under: directory.path)  // the sealer thread's next `pwrite` waits for the test
        defer { FileIOFaults.set(under: directory.path, nil) }
        // 16 records of 1 KB fill a 16 KiB memtable: the 16th detaches it, and the sealer writes it.
        for i in 100..<116 { try tier.set(value(i, 1), forKey: keyBytes(i), group: i == 104 ? "held" : nil) }
        guard held.waitUntilHeld() else { return }
        // While its write is held: a store into the bucket, reads of the memtable's records and of the file's.
        let during = DispatchSemaphore(value: 0)
        let results = Locked<[String]>([])
        Thread.detachNewThread {
            do {
                try tier.set(value(200, 1), forKey: keyBytes(200))
                let inFlight = try tier.value(forKey: keyBytes(103))
                let inFile = try tier.value(forKey: keyBytes(2))
                results.withLock { $0.append(inFlight == value(103, 1) && inFile == value(2, 1) ? "ok" : "wrong bytes") }
            } catch {
                results.withLock { $0.append("\(error)") }
            }
            during.signal()
        }
        let waited = during.wait(timeout: .now() + 5)
        #expect(waited == .success, "a store or a read waited for the memtable's write")
        // A removal, an overwrite or a group removal of a record in the held write: it waits for the write
        // (the record is about to be in the file), then writes its tombstone behind it.
        let after = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            do {
                var done = true
                switch change {
                case .removal: done = try tier.removeValue(forKey: keyBytes(104))
                case .overwrite: try tier.set(value(104, 2), forKey: keyBytes(104))
                case .groupRemoval: done = try tier.removeAll(inGroup: "held") == 1
                }
                results.withLock { $0.append(done ? "ok" : "104 was not there") }
            } catch {
                results.withLock { $0.append("\(error)") }
            }
            after.signal()
        }
        usleep(20_000)
        held.release.signal()
        if waited != .success { _ = during.wait(timeout: .now() + 10) }
        #expect(after.wait(timeout: .now() + 10) == .success)
        #expect(results.withLock { $0 } == ["ok", "ok"])
        #expect(try tier.value(forKey: keyBytes(104)) == (change == .overwrite ? value(104, 2) : nil))
        // A crash now: the removal stays, the replaced value never comes back (its new one was buffered).
        let image = directory.child("crash")
        try Self.crashImage(of: directory.path, to: image, holding: tier)
        let recovered = try DiskTier(Self.configuration(image))
        #expect(try recovered.value(forKey: keyBytes(104)) == nil, "\(change) of a record in a memtable's write: undone by a crash")
        for i in [0, 1, 2, 3, 4, 100, 103, 110] {  // (the last stores went into the next memtable)
            #expect(try recovered.value(forKey: keyBytes(i)) == value(i, 1), "key \(i)")
        }
        #expect(recovered.statistics.corruptRecords == 0)
        try recovered.close()
        #expect(tier.statistics.corruptRecords == 0 && tier.statistics.lostBufferedStores == 0)
        try tier.close()
    }

    @Test("a memtable write that fails while removeAll empties the bucket: it lost no store, so no later store or flush throws")
    func failedWriteDuringRemoveAll() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let tier = try DiskTier(Self.configuration(directory.path, buffer: 16 << 10))
        @Sendable func value(_ i: Int) -> [UInt8] { selfDescribingValue(key: i, version: 1, length: 1000) }
        for i in 0..<5 { try tier.set(value(i), forKey: keyBytes(i)) }
        try tier.flush()
        let held = HeldSealerWrite(under: directory.path, failingWith: ENOSPC)  // waits, then fails
        defer { FileIOFaults.set(under: directory.path, nil) }
        for i in 100..<116 { try tier.set(value(i), forKey: keyBytes(i)) }
        guard held.waitUntilHeld() else { return }
        // `removeAll` waits for the held write (it changes the file), which then fails: the stores it held are
        // removed anyway.
        let emptied = DispatchSemaphore(value: 0)
        let failure = Locked<String?>(nil)
        Thread.detachNewThread {
            do { try tier.removeAll() } catch { failure.withLock { $0 = "\(error)" } }
            emptied.signal()
        }
        usleep(50_000)
        held.release.signal()
        #expect(emptied.wait(timeout: .now() + 10) == .success)
        #expect(failure.withLock { $0 } == nil)
        FileIOFaults.set(under: directory.path, nil)
        var statistics = tier.statistics
        for _ in 0..<500 where statistics.bufferedBytes > 0 {  // the sealer thread finishes its seal
            usleep(2_000)
            statistics = tier.statistics
        }
        try tier.set(value(300), forKey: keyBytes(300))  // threw the failure of a write that lost nothing
        try tier.flush()
        #expect(try tier.value(forKey: keyBytes(300)) == value(300))
        for i in [0, 4, 100, 115] { #expect(try tier.value(forKey: keyBytes(i)) == nil, "key \(i)") }
        #expect(tier.statistics.lostBufferedStores == 0 && tier.statistics.corruptRecords == 0)
        try tier.close()
    }

    @Test("the sealer thread calls its work at the same stack depth at its 2,000th seal as at its first")
    func sealerWorkDoesNotGrow() {
        // A closure stored as `Locked`'s bare generic state gained two reabstraction thunks per read, so each
        // seal ran one call deeper than the one before (and slower, until the stack overflowed): the depth of
        // the work's frame, seal after seal, shows it.
        let sealer = Sealer(bucketCount: 1)
        let depths = Locked<(lowest: UInt, highest: UInt)>((.max, 0))
        sealer.setWork { _ in
            var local = 0
            let address = withUnsafeMutablePointer(to: &local) { UInt(bitPattern: $0) }
            depths.withLock { $0 = (min($0.lowest, address), max($0.highest, address)) }
            sealer.noteCompleted()
        }
        for _ in 0..<2_000 {
            let before = sealer.completed
            sealer.enqueue(0)
            sealer.waitForCompletion(after: before)
        }
        sealer.stop()
        sealer.setWork(nil)
        let (lowest, highest) = depths.withLock { $0 }
        #expect(highest >= lowest && highest - lowest < 1024, "the work's frame moved \(highest &- lowest) bytes over 2,000 seals")
    }

    /// Waits (up to 5 s, polling) until `sealer` has finished more than `count` seals; whether it has.
    static func sealed(_ sealer: Sealer, after count: UInt64) -> Bool {
        for _ in 0..<5_000 {
            if sealer.completed > count { return true }
            usleep(1_000)
        }
        return false
    }

    @Test("a bucket queued while the sealer thread is parked is sealed, with nothing but the queueing to wake it")
    func parkedSealerWakes() {
        // Stores hand over without a system call while the thread is awake; once idle, it parks, and then
        // only `enqueue`'s wake-up brings it back: no flush, no waiter, nothing else signals it.
        let sealer = Sealer(bucketCount: 4)
        sealer.setWork { _ in sealer.noteCompleted() }
        for round in 0..<5 {
            let before = sealer.completed
            sealer.enqueue(round % 4)
            #expect(Self.sealed(sealer, after: before), "round \(round): the awake thread took the bucket")
            // Idle past every look at the empty queue: the thread parks.
            var parked = false
            for _ in 0..<2_000 where !parked {
                usleep(1_000)
                parked = sealer.isParked
            }
            #expect(parked, "round \(round): the thread parks once idle")
            let again = sealer.completed
            sealer.enqueue((round + 1) % 4)
            let woken = Self.sealed(sealer, after: again)
            #expect(woken, "round \(round): the queueing woke the parked thread")
            if !woken { break }
        }
        sealer.stop()
        sealer.setWork(nil)
    }

    @Test("buckets queued by racing threads around the moment the sealer parks are every one sealed")
    func racingHandOversAroundParking() {
        // Each round lets the thread go idle for a time spread over 0.5–4 ms, around the 1.6 ms (and the
        // timer slack beyond) its looks at an empty queue take before it parks, then four threads queue
        // their buckets at once. A wake-up lost between the thread's last look and its wait would leave a
        // bucket unsealed. (It rarely hits that instant: `racingHandOverAtParking` holds it open.) Spells
        // over twice the looks' span come in pairs only now and then here, so most rounds look first; after
        // a pair, the next round parks at once and races its queueing threads against that.
        let sealer = Sealer(bucketCount: 8)
        let sealedBuckets = Locked<[Int]>([])
        sealer.setWork { bucket in
            sealedBuckets.withLock { $0.append(bucket) }
            sealer.noteCompleted()
        }
        for round in 0..<60 {
            let before = sealer.completed
            usleep(UInt32(500 + (round * 7) % 15 * 250))
            DispatchQueue.concurrentPerform(iterations: 4) { thread in sealer.enqueue((round * 4 + thread) % 8) }
            var done = false
            for _ in 0..<5_000 where !done {
                done = sealer.completed >= before + 4
                if !done { usleep(1_000) }
            }
            #expect(done, "round \(round): \(sealer.completed - before) of 4 buckets sealed")
            if !done { break }
        }
        sealer.stop()
        sealer.setWork(nil)
        #expect(sealedBuckets.withLock { $0.count } >= 240)
    }

    @Test("the sealer thread runs as batch work (SCHED_BATCH): its wake-ups do not preempt a storing thread")
    func sealerRunsAsBatchWork() {
        // Read on the thread itself, in the work it runs. Without the call at the thread's start the policy
        // is SCHED_OTHER (0) and this fails (checked). Where the machine refuses the call (gVisor, a seccomp
        // filter) the thread must have tried, and then keeps the policy it started with.
        let sealer = Sealer(bucketCount: 1)
        let policy = Atomic<Int32>(-1)
        sealer.setWork { _ in
            policy.store(sched_getscheduler(0), ordering: .relaxed)
            sealer.noteCompleted()
        }
        let before = sealer.completed
        sealer.enqueue(0)
        #expect(Self.sealed(sealer, after: before))
        let result = sealer.batchScheduling
        #expect(result >= 0, "the thread asked for the policy")
        if result == 0 {
            #expect(policy.load(ordering: .relaxed) == Sealer.schedBatch | Sealer.schedResetOnFork)
        } else {
            #expect(policy.load(ordering: .relaxed) == sched_getscheduler(0), "refused (errno \(result)): the creator's policy")
        }
        sealer.stop()
        sealer.setWork(nil)
    }

    @Test("a bucket queued between the parking sealer's last look at the queue and its wait is sealed")
    func racingHandOverAtParking() {
        // The window a lost wake-up would need, held open: right after the thread's look before parking
        // found the queue empty, another thread queues a bucket, and the parking thread gives it 20 ms
        // before it goes on to wait. The queueing thread must see `parked` and wake it. With `parked` set
        // after that look instead of before, it does not, and the bucket waits forever: the test fails
        // (checked); so it does without the wake in `enqueue`, or with a signal that skips `condition`.
        let sealer = Sealer(bucketCount: 2)
        sealer.setWork { _ in sealer.noteCompleted() }
        let probes = Atomic<Int>(0)
        sealer.setParkingProbe { _ in
            guard probes.add(1, ordering: .relaxed).newValue == 1 else { return }
            let queueing = Thread { sealer.enqueue(1) }
            queueing.start()
            usleep(20_000)
        }
        let before = sealer.completed
        sealer.enqueue(0)
        #expect(Self.sealed(sealer, after: before))
        for _ in 0..<2_000 where probes.load(ordering: .relaxed) == 0 { usleep(1_000) }
        #expect(probes.load(ordering: .relaxed) >= 1, "the thread went to park")
        #expect(Self.sealed(sealer, after: before + 1), "the bucket queued as the thread parked was sealed")
        sealer.stop()
        sealer.setWork(nil)
        sealer.setParkingProbe(nil)
    }

    @Test("the sealer's looks at an empty queue stop at a trickle of hand-overs and come back with a quick one")
    func looksFollowTheHandOverRate() {
        // At a trickle each idle spell outlasts the looks, which then only cost timer wake-ups: after two such
        // spells, the next park at once. Without that, each round below adds five looks (checked).
        var policy = Sealer.LookPolicy()
        let long = 2 * Sealer.lookSpan + 1
        policy.spellEndedParked(idle: long)
        #expect(policy.looking, "one long spell: a burst after a single long gap still finds the looks")
        policy.spellEndedParked(idle: long)
        #expect(!policy.looking, "two long spells in a row: park at once")
        policy.spellEndedParked(idle: 2 * Sealer.lookSpan)
        #expect(policy.looking, "a spell within twice the span brings the looks back")
        policy.spellEndedParked(idle: long)
        policy.spellEndedParked(idle: long)
        policy.spellEndedInLook()
        #expect(policy.looking, "so does a spell that ended in a look")
        let sealer = Sealer(bucketCount: 4)
        sealer.setWork { _ in sealer.noteCompleted() }
        func handOverAfterParking(_ bucket: Int) -> Bool {
            for _ in 0..<2_000 where !sealer.isParked { usleep(1_000) }
            guard sealer.isParked else { return false }
            usleep(5_000)  // the spell lasts well past twice the looks' span
            let before = sealer.completed
            sealer.enqueue(bucket)
            return Self.sealed(sealer, after: before)
        }
        let first = sealer.completed
        sealer.enqueue(0)
        #expect(Self.sealed(sealer, after: first))
        #expect(handOverAfterParking(1), "a long spell")
        #expect(handOverAfterParking(2), "a second long spell: the next park at once")
        let looks = sealer.looks
        for round in 0..<4 { #expect(handOverAfterParking(round % 4), "round \(round)") }
        for _ in 0..<2_000 where !sealer.isParked { usleep(1_000) }
        #expect(sealer.looks == looks, "\(sealer.looks - looks) looks taken at a trickle")
        // A hand-over right after a seal (a spell shorter than the span, woken from the parked state at
        // once) brings the looks back. A test thread delayed past twice the span on a loaded machine makes
        // a long spell instead: up to 20 tries.
        var resumed = false
        for _ in 0..<20 where !resumed {
            let before = sealer.completed
            sealer.enqueue(2)
            guard Self.sealed(sealer, after: before) else { break }
            let quick = sealer.completed
            let looksBefore = sealer.looks
            sealer.enqueue(3)
            guard Self.sealed(sealer, after: quick) else { break }
            for _ in 0..<2_000 where !sealer.isParked { usleep(1_000) }
            resumed = sealer.looks > looksBefore
        }
        #expect(resumed, "a quick hand-over brought the looks back")
        sealer.stop()
        sealer.setWork(nil)
    }

    @Test("stop() returns promptly whether the sealer thread is looking at an empty queue or parked")
    func stopWhileIdle() {
        for parkFirst in [false, true] {
            let sealer = Sealer(bucketCount: 1)
            sealer.setWork { _ in sealer.noteCompleted() }
            let before = sealer.completed
            sealer.enqueue(0)
            #expect(Self.sealed(sealer, after: before))
            if parkFirst {
                for _ in 0..<2_000 where !sealer.isParked { usleep(1_000) }
                #expect(sealer.isParked)
            }
            let start = DispatchTime.now().uptimeNanoseconds
            sealer.stop()
            let elapsed = DispatchTime.now().uptimeNanoseconds - start
            #expect(elapsed < 1_000_000_000, "stop took \(elapsed) ns (parked first: \(parkFirst))")
            sealer.setWork(nil)
        }
    }
}
