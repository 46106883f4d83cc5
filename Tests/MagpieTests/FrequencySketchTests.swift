import Glibc
@testable import Magpie
import MagpieTestSupport
import Testing

/// Distinct key hashes, as XXH3 would give (any 64-bit values: the sketch remixes them).
private func hashes(_ count: Int, seed: UInt64) -> [UInt64] {
    var random = SeededGenerator(seed: seed)
    return (0..<count).map { _ in UInt64.random(in: .min ... .max, using: &random) }
}

@Suite("MemoryTier: the frequency sketch")
struct FrequencySketchTests {
    @Test("a key's first addition only sets its doorkeeper bit; later ones count, up to 15 + 1")
    func doorkeeperAndSaturation() throws {
        var sketch = try #require(FrequencySketch(buckets: 1024))
        defer { sketch.release() }
        let key: UInt64 = 0x1234_5678_9abc_def0
        #expect(sketch.estimate(key) == 0)
        #expect(sketch.add(key) == 1)
        #expect(sketch.estimate(key) == 1)
        for expected in 2...16 { #expect(sketch.add(key) == expected) }
        // Saturated: the counters stay at 15 (the doorkeeper bit adds one).
        for _ in 0..<20 { #expect(sketch.add(key) == FrequencySketch.counterMax + 1) }
        #expect(sketch.estimate(key) == 16)
        #expect(sketch.additions == 36)
    }

    @Test("estimates never fall below the true count before the sketch ages")
    func neverUnderestimates() throws {
        var sketch = try #require(FrequencySketch(buckets: 256))
        defer { sketch.release() }
        let keys = hashes(600, seed: 3)
        var truth = [UInt64: Int]()
        var random = SeededGenerator(seed: 4)
        for _ in 0..<(256 * FrequencySketch.samplePerBucket - 1) {
            let key = keys[Int.random(in: 0..<keys.count, using: &random) % (Bool.random(using: &random) ? 30 : 600)]
            truth[key, default: 0] += 1
            _ = sketch.add(key)
        }
        for (key, count) in truth { #expect(sketch.estimate(key) >= min(count, 16)) }
    }

    @Test("after sampleSize additions every counter halves, the doorkeeper clears and the count halves")
    func aging() throws {
        var sketch = try #require(FrequencySketch(buckets: 64))
        defer { sketch.release() }
        #expect(sketch.sampleSize == 64 * FrequencySketch.samplePerBucket)
        let hot: UInt64 = 0xfeed_beef_cafe_f00d
        for _ in 0..<11 { _ = sketch.add(hot) }  // doorkeeper + 10
        #expect(sketch.estimate(hot) == 11)
        // Other keys, each added once, until the sketch ages.
        let others = hashes(sketch.sampleSize, seed: 9)
        var added = 11
        for other in others where added < sketch.sampleSize - 1 {
            _ = sketch.add(other)
            added += 1
        }
        let before = sketch.estimate(hot)
        #expect(before >= 11)
        // The sample's last addition: the sketch ages. (It cannot raise the hot key's counters first: a
        // conservative update raises only counters at the new key's own minimum, far below 10.)
        _ = sketch.add(others.last!)
        #expect(sketch.additions == sketch.sampleSize / 2)
        // Counters ≥ 10 halve to ≥ 5; the doorkeeper bit is gone.
        let after = sketch.estimate(hot)
        #expect(after == (before - 1) / 2, "estimate \(before) before aging, \(after) after")
        #expect(after >= 5)
    }

    @Test("growing with the index keeps every estimate")
    func regrowKeepsEstimates() throws {
        var sketch = try #require(FrequencySketch(buckets: 64))
        let keys = hashes(200, seed: 11)
        for (position, key) in keys.enumerated() { for _ in 0..<(position % 7) { _ = sketch.add(key) } }
        let before = keys.map { sketch.estimate($0) }
        var larger = try #require(sketch.regrown(buckets: 512))
        sketch.release()
        defer { larger.release() }
        #expect(keys.map { larger.estimate($0) } == before)
        #expect(larger.sampleSize == 512 * FrequencySketch.samplePerBucket)
        #expect(larger.additions == keys.indices.reduce(0) { $0 + $1 % 7 })
        // And it goes on counting.
        #expect(larger.add(keys[6]) == before[6] + 1)
    }

    @Test("a sketch for fewer than 64 buckets or a count that is not a power of two is refused")
    func sizes() {
        #expect(FrequencySketch(buckets: 32) == nil)
        #expect(FrequencySketch(buckets: 96) == nil)
        #expect(FrequencySketch.bytes(buckets: 1024) == 1024 * 4)
    }
}

@Suite("MemoryTier: the admission threshold")
struct AdmissionControlTests {
    @Test("θ starts at 2; read admissions lower it, unread ones raise it, within 0.5 and 2^3.5 (about 11.3)")
    func direction() {
        var control = AdmissionControl()
        #expect(control.threshold == 2)
        for _ in 0..<200 { control.residentReached(read: true) }
        control.admittedReached(read: true)
        #expect(control.threshold < 2)
        for _ in 0..<1000 { control.admittedReached(read: true) }
        #expect(control.threshold == 0.5)
        for _ in 0..<1000 { control.admittedReached(read: false) }
        #expect(control.threshold == exp2(3.5))
    }

    @Test("θ settles where admitted keys are read 0.7 times as often as main's residents, or half the time")
    func equilibrium() {
        // Residents read 4 times in 5 (rate 0.8); admitted keys 14 times in 25 (0.56 = 0.7 × 0.8): each
        // pattern of 100 moves log2 θ by about nothing.
        var control = AdmissionControl()
        for _ in 0..<1000 { control.residentReached(read: control.residentReadRate < 0.8) }  // the rate at 0.8 first
        let start = control.log2Threshold
        for _ in 0..<100 {
            for outcome in 0..<100 {
                control.residentReached(read: outcome % 5 != 0)
                control.admittedReached(read: outcome % 25 < 14)
            }
        }
        #expect(abs(control.log2Threshold - start) < 0.3, "log2 θ \(control.log2Threshold)")
        // Read a little more often than that: θ falls to its floor; a little less: to its ceiling.
        var random = SeededGenerator(seed: 21)
        var more = control
        var less = control
        for _ in 0..<20_000 {
            more.residentReached(read: Double.random(in: 0..<1, using: &random) < 0.8)
            more.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.66)
            less.residentReached(read: Double.random(in: 0..<1, using: &random) < 0.8)
            less.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.46)
        }
        // Each ends near its bound (a random walk with a drift of 0.01 per outcome towards it).
        #expect(more.log2Threshold < -0.5, "log2 θ \(more.log2Threshold)")
        #expect(less.log2Threshold > 3, "log2 θ \(less.log2Threshold)")
        // Residents read half the time (0.7 × 0.5 = 0.35, under the floor): admitted keys read 42 % of the
        // time (above 0.35, below one half) raise θ. With no resident read, neither do keys read 30 %.
        var seldom = AdmissionControl()
        for _ in 0..<1000 { seldom.residentReached(read: Double.random(in: 0..<1, using: &random) < 0.5) }
        for _ in 0..<1500 { seldom.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.42) }
        #expect(seldom.threshold > 8, "θ \(seldom.threshold)")
        var idle = AdmissionControl()
        for _ in 0..<1000 { idle.residentReached(read: false) }
        for _ in 0..<300 { idle.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.3) }
        #expect(idle.threshold > 8, "θ \(idle.threshold)")
    }

    @Test("θ comes down from its ceiling to its start within 50 read admissions (80 with the ceiling at 32)")
    func ceilingRecovery() {
        // The way down from the ceiling is the slowest part of θ's range: admissions are rarest there, and
        // only their read outcomes lower it (ShardStorage+Admission.swift).
        var control = AdmissionControl()
        for _ in 0..<1000 { control.admittedReached(read: false) }
        #expect(control.log2Threshold == AdmissionTuning.highestLog2)
        var reads = 0
        while control.log2Threshold > AdmissionTuning.initialLog2 + 1e-9 && reads < 1000 {
            control.admittedReached(read: true)
            reads += 1
        }
        #expect(reads <= 50, "\(reads) read admissions to come down from θ \(exp2(AdmissionTuning.highestLog2))")
    }

    @Test("admission is per byte: at θ 2, a key missed once before is admitted when half the mean or less")
    func perByte() {
        let control = AdmissionControl()
        #expect(control.admits(previousMisses: 1, charge: 50, charged: 10_000, count: 100))
        #expect(!control.admits(previousMisses: 1, charge: 51, charged: 10_000, count: 100))
        #expect(control.admits(previousMisses: 2, charge: 100, charged: 10_000, count: 100))
        #expect(!control.admits(previousMisses: 2, charge: 101, charged: 10_000, count: 100))
        #expect(control.admits(previousMisses: 4, charge: 200, charged: 10_000, count: 100))
        #expect(!control.admits(previousMisses: 4, charge: 201, charged: 10_000, count: 100))
        #expect(control.admits(previousMisses: 1, charge: 100, charged: 0, count: 0) == false)
    }
}

@Suite("MemoryTier: the ghosts' window")
struct GhostWindowControlTests {
    @Test("the window starts at 1/√2 budget; read ghost admissions widen it, unread ones narrow it, up to 2")
    func direction() {
        var control = GhostWindowControl(budgetUnits: 1000)
        #expect(control.units == 707)
        control.admittedReached(read: false, target: 0.5)
        #expect(control.units == 707)
        control.admittedReached(read: true, target: 0.5)
        #expect(control.units > 707)
        for _ in 0..<1000 { control.admittedReached(read: true, target: 0.5) }
        #expect(control.units == 2000)
        for _ in 0..<1000 { control.admittedReached(read: false, target: 0.5) }
        #expect(control.units == 707)
    }

    @Test("the window settles where ghost admissions are read as often as the target asks")
    func equilibrium() {
        var random = SeededGenerator(seed: 5)
        // At the target's rate (0.6: 3 reads in 5, repeated), started mid-range, it stays near its start.
        var settled = GhostWindowControl(budgetUnits: 1000)
        for _ in 0..<12 { settled.admittedReached(read: true, target: 0.5) }  // log2 scale 0.1
        #expect(abs(settled.log2Scale - 0.1) < 1e-9)
        for _ in 0..<200 {
            for outcome in 0..<5 { settled.admittedReached(read: outcome < 3, target: 0.6) }
        }
        #expect(abs(settled.log2Scale - 0.1) < 0.2, "log2 scale \(settled.log2Scale)")
        // Read a little more or less often than asked: to either bound (a walk with a drift of 0.01 per
        // outcome towards it, about 0.1 from it on average).
        var more = settled
        var less = settled
        for _ in 0..<5000 {
            more.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.7, target: 0.6)
            less.admittedReached(read: Double.random(in: 0..<1, using: &random) < 0.5, target: 0.6)
        }
        #expect(more.log2Scale > 0.5, "log2 scale \(more.log2Scale)")
        #expect(less.log2Scale < 0, "log2 scale \(less.log2Scale)")
    }
}

@Suite("MemoryTier: small's share")
struct SmallShareControlTests {
    @Test("hits within small's reach move the share, by 5 % each; later ones do not; it stays within 1-25 %")
    func moves() {
        var control = SmallShareControl(budget: 100_000)
        #expect(control.share == 0.01)
        #expect(control.target == 1000)
        // Beyond small's reach: nothing.
        let moved1 = control.ghostHit(age: 11, fromMain: false, reach: 10)
        #expect(!moved1)
        let moved2 = control.ghostHit(age: 11, fromMain: true, reach: 10)
        #expect(!moved2)
        #expect(control.share == 0.01)
        // Within it: up on a small-ghost hit, down on a main-ghost hit.
        let moved3 = control.ghostHit(age: 10, fromMain: false, reach: 10)
        #expect(moved3)
        #expect(abs(control.share - 0.0105) < 1e-12)
        _ = control.ghostHit(age: 0, fromMain: false, reach: 10)
        let moved4 = control.ghostHit(age: 0, fromMain: true, reach: 10)
        #expect(moved4)
        #expect(abs(control.share - 0.01 * 1.05 * 1.05 * 0.95) < 1e-12)
        // A reach under one unit still counts a hit of age 1 (small's target below a stamp unit).
        let moved5 = control.ghostHit(age: 1, fromMain: false, reach: 0)
        #expect(moved5)
        // Bounds.
        for _ in 0..<1000 { _ = control.ghostHit(age: 0, fromMain: false, reach: 1) }
        #expect(control.share == 0.25)
        #expect(control.target == 25_000)
        for _ in 0..<1000 { _ = control.ghostHit(age: 0, fromMain: true, reach: 1) }
        #expect(control.share == 0.01)
    }

    @Test("the size draw's generator is uniform over [0, 1)")
    func sizeDraw() {
        var draw = SizeDraw()
        var below = 0
        for _ in 0..<100_000 where draw.next() < 0.25 { below += 1 }
        #expect((24_000...26_000).contains(below), "\(below) of 100,000 draws under 0.25")
        var range = (low: 1.0, high: 0.0)
        for _ in 0..<10_000 {
            let x = draw.next()
            range = (min(range.low, x), max(range.high, x))
        }
        #expect(range.low >= 0 && range.low < 0.01 && range.high < 1 && range.high > 0.99)
    }
}

@Suite("MemoryTier: the main ring's tag")
struct EntryRingTagTests {
    /// Block i's tag: each of the three, in turn.
    static func tag(_ i: Int) -> RingTag { [RingTag.admittedByMisses, .admittedByGhost, .none][i % 3] }

    @Test("a slot's tag survives growth, removal's shifting and compaction; blocks come back untagged")
    func tags() throws {
        var ring = try #require(EntryRing(capacity: 4))
        defer { ring.release() }
        var blocks = [UnsafeMutableRawPointer]()
        // The dead blocks go to `retired` at compaction, which frees them; the test frees the others.
        defer { for (index, block) in blocks.enumerated() where index % 4 != 3 { free(block) } }
        for i in 0..<40 {
            let block = try #require(malloc(64))
            // Every fourth block dead, for compaction.
            EntryHeader(valueLength: 0, keyLength: 0, frequency: 0, state: i % 4 == 3 ? EntryHeader.deadFlag : 0)
                .write(to: block)
            blocks.append(block)
            let pushed = ring.push(block, tag: Self.tag(i))  // grows from 4 to 64 slots on the way
            #expect(pushed)
            if i % 4 == 3 { ring.dead += 1 }
        }
        let removedOld = ring.remove(blocks[1])  // near the head: the older side shifts
        let removedNew = ring.remove(blocks[37])  // near the tail: the newer side shifts
        #expect(removedOld && removedNew)
        var retired = RetiredBlocks()
        _ = ring.compact(retiringInto: &retired)  // releases the 10 dead blocks (not freed: retired)
        var seen = [Int]()
        ring.forEach { block in seen.append(blocks.firstIndex(of: block) ?? -1) }
        let live = (0..<40).filter { $0 % 4 != 3 && $0 != 1 && $0 != 37 }
        #expect(seen == live)
        for index in live {
            let (block, tag) = ring.popFirstTagged()
            #expect(block == blocks[index])
            #expect(tag == Self.tag(index), "block \(index)")
        }
        #expect(ring.count == 0)
        retired.freeAll()
    }
}
