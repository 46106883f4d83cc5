import Glibc

// MARK: - How often a key was missed: a count-min sketch with a doorkeeper, and aging
//
// One per memory-tier shard, under the shard's lock (never touched by a hit). It counts the stores of
// keys the shard did not hold: in a cache filled on a miss (a get that misses, then a set; a disk hit
// promoted; a loader's value), one per miss. ``ShardStorage`` uses the estimate to admit a new key
// straight into `main` (see "Admission" in ShardStorage+Admission.swift).
//
// ### Layout (sized by the shard's index: `buckets`, a power of two ≥ 64)
//
// buckets / 4 blocks of 16 bytes, aligned (malloc's 16): a counter word, then a doorkeeper word. A key's
// block is (mix >> 24) & blockMask, so one addition reads and writes one cache line.
//
//   counters   the counter word: sixteen 4-bit counters. Row r (0...3) owns nibbles 4r...4r+3 and the
//              key takes nibble 4r + ((mix >> 2r) & 3): four counters, one per row (a blocked count-min:
//              two keys of one block share all four counters only when their 8 choice bits agree, 1 in
//              256).
//   doorkeeper the doorkeeper word: a one-probe Bloom filter, bit (mix >> 40) & 63. A key's first
//              occurrence since the last aging only sets its bit; the counters count the later ones, so
//              most one-time keys never reach them.
//
// 4 bytes per bucket (4 counters, 16 doorkeeper bits): with the index at most 3/4 full, 5.3 bytes per
// entry at its fullest (10.7 just after it doubles, like the index's own headroom), charged as 6 of
// ``MemoryTier/entryOverhead``'s bytes. Sizes chosen by replay (docs/lab-notes/eviction.md):
// the doorkeeper's size is what matters. With one doorkeeper bit per bucket the shared trace at 10 %
// replayed 0.7358 against 0.7278 (θ then started at 1, no floor); with 12 counters per bucket instead of
// 4 every miss ratio came out the same to four digits; counters and doorkeeper in two arrays (8 counters
// and 16 bits per bucket, two cache lines per addition) replayed within ±0.004 of this layout and cost
// 5.8 % of the default memory scenario's time in `perf`.
//
// ### Estimate, saturation, aging, false positives
//
// estimate = min of the key's four counters + its doorkeeper bit: an overestimate (other keys' counts
// add to shared counters), never an underestimate since the last aging. Counters saturate at 15; an
// addition increments only those of the four equal to their minimum (conservative update: the others
// already count more than this key's occurrences). After `sampleSize` additions (32 per bucket: a long
// memory, which the shared trace needs at small budgets) every counter is halved, the doorkeeper
// cleared and the addition count halved.
//
// Between agings a doorkeeper word sees up to 128 keys in its 64 bits, so it fills: a key never seen
// finds its bit set by another key about as often as the filter is full, and its first miss then counts
// as a second. One-time keys are thus sometimes admitted to `main`, and a scan of more than about ten
// times a shard's entries can flush an idle hot set that S3-FIFO alone would keep (MemoryTierTests;
// a hot set still requested during the scan stays: MemoryPolicyTests). An exact doorkeeper was tried
// (two probes, cleared at an eighth full; θ then started at 1): 14 admissions from a 19,000-key scan
// through a 100-entry shard against 230, but every trace replayed worse (the shared trace 0.8190 /
// 0.7297 against 0.8149 / 0.7271 at 1 % / 10 %), a key's first miss being forgotten too soon.
//
// Growth: when the index doubles, so does the sketch; block j of the larger one starts as a copy of block
// j & oldMask (the blocks a key maps to before and after agree on the low bits), so no estimate falls.

struct FrequencySketch {
    /// Blocks of `blockWords` words: the counter words, then the doorkeeper word.
    private var words: UnsafeMutablePointer<UInt64>
    private var blockMask: Int
    /// Additions since the last aging (halved by each aging).
    private(set) var additions = 0
    /// Additions after which the sketch ages.
    private(set) var sampleSize: Int

    /// The largest value of a counter.
    static let counterMax = 15
    /// Additions per index bucket between two agings.
    static let samplePerBucket = 32
    /// Words per block: the counter word, then the doorkeeper word.
    static let blockWords = 2

    /// An empty sketch for an index of `buckets` (a power of two ≥ 64); nil when memory runs out.
    init?(buckets: Int) {
        guard buckets >= 64, buckets & (buckets - 1) == 0 else { return nil }
        guard let words = allocateZeroed(UInt64.self, Self.blockCount(buckets) * Self.blockWords) else { return nil }
        self.words = words
        blockMask = Self.blockCount(buckets) - 1
        sampleSize = buckets * Self.samplePerBucket
    }

    private static func blockCount(_ buckets: Int) -> Int { buckets / 4 }

    /// Bytes the sketch holds for an index of `buckets`.
    static func bytes(buckets: Int) -> Int { blockCount(buckets) * blockWords * 8 }

    /// Frees the array; the owner calls it once.
    func release() {
        free(words)
    }

    /// The key hash, remixed so that the sketch's bits do not follow the index's or the ghost's.
    @inline(__always)
    private static func mix(_ hash: UInt64) -> UInt64 {
        let mixed = (hash ^ (hash &>> 31)) &* 0x9E37_79B9_7F4A_7C15
        return mixed ^ (mixed &>> 29)
    }

    /// The key's counter word and doorkeeper word (indexes into `words`), and its doorkeeper bit.
    @inline(__always)
    private func positions(_ mix: UInt64) -> (word: Int, doorWord: Int, bit: UInt64) {
        let block = (Int(truncatingIfNeeded: mix &>> 24) & blockMask) &* Self.blockWords
        return (block, block &+ 1, 1 &<< ((mix &>> 40) & 63))
    }

    /// The four counters' bit offsets in the key's word.
    @inline(__always)
    private static func shifts(_ mix: UInt64) -> (UInt64, UInt64, UInt64, UInt64) {
        (
            UInt64(mix & 3) &* 4, (4 &+ UInt64((mix &>> 2) & 3)) &* 4, (8 &+ UInt64((mix &>> 4) & 3)) &* 4,
            (12 &+ UInt64((mix &>> 6) & 3)) &* 4
        )
    }

    /// The smallest of the key's four counters in `word`.
    @inline(__always)
    private static func minimum(_ word: UInt64, _ s: (UInt64, UInt64, UInt64, UInt64)) -> UInt64 {
        min(min((word &>> s.0) & 15, (word &>> s.1) & 15), min((word &>> s.2) & 15, (word &>> s.3) & 15))
    }

    /// How often `hash` was added since the last aging, about (an overestimate at most, see above).
    func estimate(_ hash: UInt64) -> Int {
        let mix = Self.mix(hash)
        let (word, doorWord, bit) = positions(mix)
        let seen = words[doorWord] & bit != 0 ? 1 : 0
        return Int(Self.minimum(words[word], Self.shifts(mix))) + seen
    }

    /// Where `hash` lives in the sketch and the two words there, read early: a store reads them before
    /// it looks the key up, so that their cache misses overlap the index's instead of following them.
    /// Valid until the sketch next changes (an addition, aging, growth or reset).
    struct Peek {
        fileprivate let mix: UInt64
        fileprivate let index: Int
        fileprivate let doorWord: Int
        fileprivate let bit: UInt64
        fileprivate let word: UInt64
        fileprivate let door: UInt64
    }

    @inline(__always)
    func peek(_ hash: UInt64) -> Peek {
        let mix = Self.mix(hash)
        let (index, doorWord, bit) = positions(mix)
        return Peek(mix: mix, index: index, doorWord: doorWord, bit: bit, word: words[index], door: words[doorWord])
    }

    /// Adds one occurrence of `hash` and returns its estimate, this one included. Ages the sketch after
    /// every `sampleSize` additions.
    mutating func add(_ hash: UInt64) -> Int {
        add(peek(hash))
    }

    /// ``add(_:)`` of the key ``peek(_:)`` read, the sketch unchanged since.
    @inline(__always)
    mutating func add(_ peeked: Peek) -> Int {
        let (index, doorWord, bit) = (peeked.index, peeked.doorWord, peeked.bit)
        var word = peeked.word
        let shifts = Self.shifts(peeked.mix)
        let least = Self.minimum(word, shifts)
        let estimate: Int
        if peeked.door & bit == 0 {
            words[doorWord] = peeked.door | bit
            estimate = Int(least) + 1
        } else if least < UInt64(Self.counterMax) {
            // Conservative update: only the counters at the minimum go up.
            if (word &>> shifts.0) & 15 == least { word &+= 1 &<< shifts.0 }
            if (word &>> shifts.1) & 15 == least { word &+= 1 &<< shifts.1 }
            if (word &>> shifts.2) & 15 == least { word &+= 1 &<< shifts.2 }
            if (word &>> shifts.3) & 15 == least { word &+= 1 &<< shifts.3 }
            words[index] = word
            estimate = Int(least) + 2
        } else {
            estimate = Self.counterMax + 1
        }
        additions += 1
        if additions >= sampleSize { age() }
        return estimate
    }

    /// Halves every counter, clears the doorkeeper and halves the addition count.
    mutating func age() {
        for block in 0...blockMask {
            let base = block &* Self.blockWords
            words[base] = (words[base] &>> 1) & 0x7777_7777_7777_7777
            words[base + 1] = 0
        }
        additions /= 2
    }

    /// Clears every count (the shard was emptied).
    mutating func reset() {
        memset(words, 0, (blockMask + 1) * Self.blockWords * 8)
        additions = 0
    }

    /// A sketch for an index of `buckets` (a power of two ≥ the current one) that keeps every estimate:
    /// each block is copied to the positions of the larger array that map back to it. Nil when memory
    /// runs out (this one is then unchanged).
    func regrown(buckets: Int) -> FrequencySketch? {
        guard Self.blockCount(buckets) > blockMask, var larger = FrequencySketch(buckets: buckets) else { return nil }
        for block in 0...larger.blockMask {
            let from = (block & blockMask) &* Self.blockWords
            let to = block &* Self.blockWords
            for offset in 0..<Self.blockWords { larger.words[to + offset] = words[from + offset] }
        }
        larger.additions = additions
        return larger
    }
}
