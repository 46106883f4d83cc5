@testable import Magpie
import MagpieTestSupport
import Testing

/// An 8-byte key.
private func key(_ i: Int) -> [UInt8] { withUnsafeBytes(of: UInt64(i).bigEndian) { Array($0) } }

/// Drives one `ShardStorage` directly, so the tests can see which queue an entry is in and where
/// `small`'s target stands.
private final class Storage {
    let pointer: UnsafeMutablePointer<ShardStorage>

    init(budget: Int) throws {
        guard let storage = ShardStorage(budget: budget, hasher: KeyHash(seed: 7), clock: .system) else {
            throw MagpieError(.invalidConfiguration, "out of memory")
        }
        pointer = .allocate(capacity: 1)
        pointer.initialize(to: storage)
    }

    deinit {
        pointer.deinitialize(count: 1)
        pointer.deallocate()
    }

    var smallTarget: Int { pointer.pointee.smallTarget }
    var indexBuckets: Int { pointer.pointee.indexMask + 1 }

    func set(_ i: Int, length: Int) {
        let bytes = [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: length)
        key(i).withUnsafeBytes { k in
            let hash = pointer.pointee.hasher.hash(k)
            bytes.withUnsafeBytes { v in _ = pointer.pointee.store(hash: hash, key: k, value: v) }
        }
    }

    func read(_ i: Int) -> Bool {
        key(i).withUnsafeBytes { k in
            let hash = pointer.pointee.hasher.hash(k)
            return pointer.pointee.lookup(hash: hash, key: k) != nil
        }
    }

    /// The queue of `i`'s entry (`EntryHeader.small` or `.main`), or nil when absent.
    func queue(_ i: Int) -> UInt8? {
        key(i).withUnsafeBytes { k in
            let hash = pointer.pointee.hasher.hash(k)
            return pointer.pointee.find(hash: hash, key: k).map {
                EntryHeader(of: $0.block).queue
            }
        }
    }

    func adapt(after hit: GhostHit, charge: Int) { pointer.pointee.adaptSmallTarget(after: hit, charge: charge) }
    func removeAll() { pointer.pointee.removeAll() }
}

/// The charge of a `key(_)` entry with a value of `length` bytes.
private func charge(_ length: Int) -> Int { 8 + length + MemoryTier.entryOverhead }

@Suite("MemoryTier: ghosts and the adaptive split")
struct MemoryPolicyTests {
    @Test("a key evicted unread from small comes back into main and grows small's target by its charge")
    func smallGhostGrowsSmall() throws {
        let s = try Storage(budget: 100 * charge(60))
        let initial = s.smallTarget
        #expect(initial == 10 * charge(60))
        for i in 0..<100 { s.set(i, length: 60) }
        s.set(100, length: 60)  // evicts key 0, unread, into the small ghost
        #expect(s.queue(0) == nil)
        s.set(0, length: 60)
        #expect(s.queue(0) == EntryHeader.main)
        #expect(s.smallTarget == initial + charge(60))
        #expect(s.queue(1) == nil)  // the unread neighbour made room, and is not in main
    }

    @Test("a key evicted unread from main comes back into main and shrinks small's target by its charge")
    func mainGhostShrinksSmall() throws {
        let s = try Storage(budget: 100 * charge(60))
        let initial = s.smallTarget
        for i in 0..<100 { s.set(i, length: 60) }
        for i in 0..<100 { #expect(s.read(i)) }
        // Room for key 100: every entry of small was read, so all move to main (frequency reset), and
        // main's oldest, key 0, unread since, is evicted into the main ghost.
        s.set(100, length: 60)
        #expect(s.queue(0) == nil)
        #expect(s.queue(1) == EntryHeader.main)
        s.set(0, length: 60)
        #expect(s.queue(0) == EntryHeader.main)
        #expect(s.smallTarget == initial - charge(60))
    }

    @Test("small's target stays within 1 % and 90 % of the budget however many ghost hits move it")
    func targetBounds() throws {
        let s = try Storage(budget: 100_000)
        for _ in 0..<1000 { s.adapt(after: .small, charge: 5000) }
        #expect(s.smallTarget == 90_000)
        for _ in 0..<1000 { s.adapt(after: .main, charge: 5000) }
        #expect(s.smallTarget == 1000)
        s.removeAll()
        #expect(s.smallTarget == 10_000)
    }

    @Test("the ghost survives the index doubling: a key evicted before growth is still remembered after")
    func ghostSurvivesGrowth() throws {
        let s = try Storage(budget: 40 * charge(1000))
        let buckets = s.indexBuckets
        for i in 0..<40 { s.set(i, length: 1000) }
        for i in 1..<40 { #expect(s.read(i)) }
        s.set(40, length: 1000)  // evicts key 0 (the only unread one) into the small ghost
        #expect(s.queue(0) == nil)
        // Small entries until the index has doubled at least once.
        var next = 1000
        while s.indexBuckets == buckets {
            s.set(next, length: 0)
            next += 1
        }
        s.set(0, length: 1000)
        #expect(s.queue(0) == EntryHeader.main, "the ghost forgot key 0 when the index grew")
    }

    @Test("a one-pass scan of new keys leaves the hot set in main and small's target where it was")
    func scanDoesNotAdapt() throws {
        let s = try Storage(budget: 100 * charge(60))
        let initial = s.smallTarget
        for i in 0..<50 { s.set(i, length: 60) }
        for i in 0..<50 { #expect(s.read(i)) }
        for i in 1000..<20_000 { s.set(i, length: 60) }
        // A false ghost hit (a fingerprint match, about 1 in 65,536 lookups) could move it by a charge.
        #expect(abs(s.smallTarget - initial) <= charge(60))
        #expect((0..<50).allSatisfy { s.queue($0) == EntryHeader.main })
    }
}

@Suite("MemoryTier: placeholders for trace replay")
struct MemoryTierPlaceholderTests {
    @Test("a placeholder is charged like its value, is a hit for replay, and is invisible to the serving API")
    func placeholders() throws {
        let tier = try MemoryTier(budget: 10 * charge(1000), shardCount: 1)
        func replay(_ i: Int, _ length: Int) -> Bool {
            key(i).withUnsafeBytes { tier.simulateRequest(forKey: $0, valueLength: length) }
        }
        #expect(!replay(1, 1000))  // a miss: stores a placeholder
        #expect(replay(1, 1000))  // a hit
        #expect(tier.chargedBytes == charge(1000))
        #expect(tier.value(forKey: key(1)) == nil)
        #expect(tier.withValue(forKey: key(1)) { $0.count } == nil)
        #expect(!tier.contains(key(1)))
        // A real value replaces it.
        #expect(try tier.set([1, 2, 3], forKey: key(1)))
        #expect(tier.value(forKey: key(1)) == [1, 2, 3])
        #expect(replay(1, 1000))  // now a real entry: a hit
        let statistics = tier.statistics
        #expect(statistics.hits == 3)  // two replay hits and one read
        #expect(statistics.misses == 3)  // the replay miss and two reads of the placeholder
        // Out-of-range lengths store nothing.
        #expect(!replay(2, -1))
        #expect(tier.count == 1)
    }

    @Test("placeholders keep the budget: a replay of many keys never charges more than the budget")
    func placeholderBudget() throws {
        let tier = try MemoryTier(budget: 64 * charge(500), shardCount: 4)
        var random = SeededGenerator(seed: 5)
        for _ in 0..<20_000 {
            let i = Int.random(in: 0..<1000, using: &random)
            let length = Int.random(in: 0..<2000, using: &random)
            key(i).withUnsafeBytes { _ = tier.simulateRequest(forKey: $0, valueLength: length) }
            #expect(tier.chargedBytes <= tier.budget)
        }
        #expect(tier.statistics.evictions > 0)
    }
}
