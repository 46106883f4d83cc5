/// One index slot: where a key's newest record lies. 16 bytes.
///
/// `tag` is the low 32 bits of the key hash (a hint: a match is confirmed against the record's key),
/// `offset8` the record's offset / 8, `length` its length, `expiry` its deadline in whole seconds since
/// 1970 rounded up (0 = never; the record holds the exact milliseconds).
///
/// A slot is *pending* while its record is still in one of its bucket's memtables (Disk/Memtable.swift),
/// not yet in the file: then `offset8` holds the memtable's parity in bit 31 and the record's offset in
/// it / 8 below, and `length` is the record's length there (unsealed, uncompressed).
struct DiskSlot: Equatable {
    var tag: UInt32
    var offset8: UInt32
    private var lengthAndFlags: UInt32
    var expiry: UInt32

    static let empty = DiskSlot(tag: 0, offset8: 0, lengthAndFlags: 0, expiry: 0)
    static let maximumLength = Int(Int32.max) & ~7
    /// Bit 31 of the length field: the record is in a memtable.
    private static let pendingBit: UInt32 = 1 << 31
    private static let lengthMask: UInt32 = 0x7fff_fff8
    /// The most read credits a slot holds.
    static let maximumCredits = 7

    /// The length field as stored, the credits included (for snapshots).
    var rawLength: UInt32 { lengthAndFlags }

    /// A slot from its stored fields (for snapshots).
    init(tag: UInt32, offset8: UInt32, rawLength: UInt32, expiry: UInt32) {
        self.init(tag: tag, offset8: offset8, lengthAndFlags: rawLength, expiry: expiry)
    }

    private init(tag: UInt32, offset8: UInt32, lengthAndFlags: UInt32, expiry: UInt32) {
        self.tag = tag
        self.offset8 = offset8
        self.lengthAndFlags = lengthAndFlags
        self.expiry = expiry
    }

    /// The tag of a key hash: its low 32 bits. (The bucket is chosen by the high bits, which are
    /// therefore nearly the same for every key of a bucket, and would crowd the homes together.)
    static func tag(of hash: UInt64) -> UInt32 {
        UInt32(truncatingIfNeeded: hash)
    }

    /// A slot for a record in the file at `offset`.
    init(hash: UInt64, offset: Int, length: Int, expiryMilliseconds: Int64) {
        tag = Self.tag(of: hash)
        offset8 = UInt32(offset / 8)
        lengthAndFlags = UInt32(length)
        expiry = Self.expirySeconds(expiryMilliseconds)
    }

    /// A pending slot: a record at `offset` in the memtable of `parity`.
    init(hash: UInt64, memtableParity parity: Int, offset: Int, length: Int, expiryMilliseconds: Int64) {
        tag = Self.tag(of: hash)
        offset8 = UInt32(parity) << 31 | UInt32(offset / 8)
        lengthAndFlags = UInt32(length) | Self.pendingBit
        expiry = Self.expirySeconds(expiryMilliseconds)
    }

    /// Whole seconds, rounded up without overflow (an instant near Int64.max, a far-future expiry, is valid).
    private static func expirySeconds(_ milliseconds: Int64) -> UInt32 {
        let seconds = milliseconds <= 0 ? 0 : milliseconds / 1000 + (milliseconds % 1000 == 0 ? 0 : 1)
        return UInt32(min(seconds, Int64(UInt32.max)))
    }

    /// Records are at least 64 bytes, so a zero length marks an empty slot.
    var isEmpty: Bool { lengthAndFlags == 0 }
    /// Whether the record is in a memtable, not yet in the file.
    var isPending: Bool { lengthAndFlags & Self.pendingBit != 0 }
    /// The file offset (of a slot that is not pending).
    var offset: Int { Int(offset8) * 8 }
    /// The parity of the memtable a pending slot's record is in.
    var memtableParity: Int { Int(offset8 >> 31) }
    /// The offset of a pending slot's record in its memtable.
    var memtableOffset: Int { Int(offset8 & 0x7fff_ffff) * 8 }
    /// Records are padded to multiples of 8 bytes, so the length's low three bits are free: they hold
    /// the eviction's read credits.
    var length: Int { Int(lengthAndFlags & Self.lengthMask) }
    /// The read credits, 0–7: a read adds one; a region reclaim reinserts the entry if it has enough for
    /// its size (see Disk/Bucket+Reclaim.swift), and the reinserted copy starts again from 0.
    var credits: Int {
        get { Int(lengthAndFlags & 7) }
        set { lengthAndFlags = (lengthAndFlags & ~7) | UInt32(min(Self.maximumCredits, max(0, newValue))) }
    }

    /// Points the slot at a record in the file (its credits kept): for a pending slot whose record was
    /// written, or an entry reinserted.
    mutating func place(at offset: Int, length: Int) {
        offset8 = UInt32(offset / 8)
        lengthAndFlags = UInt32(length) | (lengthAndFlags & 7)
    }

    func isExpired(nowMilliseconds: Int64) -> Bool {
        expiry != 0 && Int64(expiry) * 1000 <= nowMilliseconds
    }
}

/// A bucket's index: open addressing over `DiskSlot`s with linear probing and deletion by backward
/// shift.
///
/// Why not one table with the memory tier's index (Memory/ShardStorage+Index.swift), which also probes
/// linearly and deletes by backward shift: the two share those ten lines of idea and nothing of their
/// layout, and each layout is what makes its tier cheap. The memory index packs a block address, a
/// tag and the distance from home into 8 bytes, grows by doubling (re-hashing each key from its block)
/// and may refuse an insert whose run passes 255; its home is taken from hash bits the shard did not use.
/// This index holds 16-byte slots of offset, length, clock credits and expiry that must be rebuilt from the
/// file or a snapshot without any key in memory, so a slot's home comes from its 32-bit tag alone
/// (`tag × capacity >> 32`, monotonic in the tag for any capacity), it grows by half at 3/4 load, and
/// its deletion derives distances from tags instead of storing them. A generic table over both would
/// need a slot protocol whose every requirement one of them implements differently, in the hot loop
/// of both tiers. A slot's home is `tag × capacity >> 32` (monotonic in the tag, for any capacity), so homes
/// come from tags alone and nothing is read from disk to move a slot. The table grows by half when an
/// insert would pass 3/4 load, so it stays between 1/2 and 3/4 full: 21 to 32 bytes per entry. (7/8
/// would save 3 to 5 bytes but costs 0.3 to 0.5 µs per read in longer probe runs, measured.)
struct BucketIndex {
    private(set) var slots: [DiskSlot]
    private(set) var count = 0
    /// The clock hand: the next slot the eviction sweep inspects (taken modulo the capacity).
    var hand = 0

    static let initialCapacity = 64

    init(capacity: Int = BucketIndex.initialCapacity) {
        slots = [DiskSlot](repeating: .empty, count: capacity)
    }

    /// An index from a snapshot's slots, laid out as this index lays them.
    init(slots: [DiskSlot], count: Int) {
        self.slots = slots
        self.count = count
    }

    var capacity: Int { slots.count }
    /// Where the slots are stored, and how many (a prefetch hint: Disk/BucketReadHints.swift).
    var storage: (slots: UInt, capacity: UInt) {
        slots.withUnsafeBufferPointer { (UInt(bitPattern: $0.baseAddress), UInt($0.count)) }
    }
    var bytes: Int { slots.count * MemoryLayout<DiskSlot>.stride }

    /// Where the probe for `tag` starts.
    func home(_ tag: UInt32) -> Int { Self.home(tag, capacity: slots.count) }

    static func home(_ tag: UInt32, capacity: Int) -> Int {
        Int((UInt64(tag) &* UInt64(capacity)) >> 32)
    }

    /// The position after `position`, wrapping.
    func next(_ position: Int) -> Int {
        position + 1 == slots.count ? 0 : position + 1
    }

    /// The first position from `position` on, within its probe run, whose slot carries `tag`; nil at
    /// the run's end. A probe for `tag` starts at `home(tag)` and goes on from the position after each
    /// candidate that is not the key (callers confirm the key).
    @inline(__always)
    func position(of tag: UInt32, from position: Int) -> Int? {
        var position = position
        while !slots[position].isEmpty {
            if slots[position].tag == tag { return position }
            position = next(position)
        }
        return nil
    }

    /// The positions of slots carrying `tag`, in probe order (callers confirm the key).
    func positions(tag: UInt32) -> [Int] {
        var found: [Int] = []
        var position = home(tag)
        while let next = self.position(of: tag, from: position) {
            found.append(next)
            position = self.next(next)
        }
        return found
    }

    subscript(position: Int) -> DiskSlot {
        get { slots[position] }
        set { slots[position] = newValue }
    }

    mutating func insert(_ slot: DiskSlot) {
        if (count + 1) * 4 > slots.count * 3 { rehash(capacity: slots.count + slots.count / 2) }
        var position = home(slot.tag)
        while !slots[position].isEmpty { position = next(position) }
        slots[position] = slot
        count += 1
    }

    /// Removes the slot at `position`; later slots of the run shift back into the hole.
    mutating func remove(at position: Int) {
        let capacity = slots.count
        var hole = position
        var next = position
        while true {
            next = self.next(next)
            let slot = slots[next]
            if slot.isEmpty { break }
            let home = self.home(slot.tag)
            // The slot may move into the hole unless its home lies cyclically in (hole, next].
            let fromHome = (next - home + capacity) % capacity
            let fromHole = (next - hole + capacity) % capacity
            if fromHome >= fromHole {
                slots[hole] = slot
                hole = next
            }
        }
        slots[hole] = .empty
        count -= 1
    }

    mutating func removeAll() {
        slots = [DiskSlot](repeating: .empty, count: Self.initialCapacity)
        count = 0
        hand = 0
    }

    private mutating func rehash(capacity: Int) {
        let old = slots
        slots = [DiskSlot](repeating: .empty, count: capacity)
        for slot in old where !slot.isEmpty {
            var position = home(slot.tag)
            while !slots[position].isEmpty { position = next(position) }
            slots[position] = slot
        }
        hand = 0
    }
}
