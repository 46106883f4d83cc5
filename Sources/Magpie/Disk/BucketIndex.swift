/// One index slot: where a key's newest record lies in its bucket file. 16 bytes.
///
/// `tag` is the high 32 bits of the key hash (a hint: a match is confirmed against the record's key),
/// `offset8` the record's offset / 8, `length` its length on disk, `expiry` its deadline in whole
/// seconds since 1970 rounded up (0 = never; the record holds the exact milliseconds).
struct DiskSlot: Equatable {
    var tag: UInt32
    var offset8: UInt32
    private var lengthAndReference: UInt32
    var expiry: UInt32

    static let empty = DiskSlot(tag: 0, offset8: 0, lengthAndReference: 0, expiry: 0)
    static let maximumLength = Int(Int32.max)

    /// The length field as stored, clock bit included (for snapshots).
    var rawLength: UInt32 { lengthAndReference }

    /// A slot from its stored fields (for snapshots).
    init(tag: UInt32, offset8: UInt32, rawLength: UInt32, expiry: UInt32) {
        self.init(tag: tag, offset8: offset8, lengthAndReference: rawLength, expiry: expiry)
    }

    private init(tag: UInt32, offset8: UInt32, lengthAndReference: UInt32, expiry: UInt32) {
        self.tag = tag
        self.offset8 = offset8
        self.lengthAndReference = lengthAndReference
        self.expiry = expiry
    }

    init(hash: UInt64, offset: Int, length: Int, expiryMilliseconds: Int64) {
        tag = UInt32(truncatingIfNeeded: hash >> 32)
        offset8 = UInt32(offset / 8)
        lengthAndReference = UInt32(length)
        let seconds = expiryMilliseconds <= 0 ? 0 : (expiryMilliseconds + 999) / 1000
        expiry = UInt32(min(seconds, Int64(UInt32.max)))
    }

    /// Records are at least 56 bytes, so a zero length marks an empty slot.
    var isEmpty: Bool { lengthAndReference == 0 }
    var offset: Int { Int(offset8) * 8 }
    var length: Int { Int(lengthAndReference & 0x7fff_ffff) }
    /// The clock bit: set by a read, cleared by a passing eviction hand.
    var referenced: Bool {
        get { lengthAndReference & 0x8000_0000 != 0 }
        set { lengthAndReference = newValue ? lengthAndReference | 0x8000_0000 : lengthAndReference & 0x7fff_ffff }
    }

    func isExpired(nowMilliseconds: Int64) -> Bool {
        expiry != 0 && Int64(expiry) * 1000 <= nowMilliseconds
    }
}

/// A bucket's index: open addressing over `DiskSlot`s, home = tag & mask, linear probing, deletion by
/// backward shift (the home comes from the tag, so nothing is read from disk to move a slot). Grows
/// x2 past 3/4 load: between 21 and 43 bytes per entry, 16 at a full table.
struct BucketIndex {
    private(set) var slots: [DiskSlot]
    private(set) var count = 0
    /// The clock hand: the next slot the eviction sweep inspects.
    var hand = 0

    init(capacity: Int = 64) {
        slots = [DiskSlot](repeating: .empty, count: capacity)
    }

    /// An index from a snapshot's slots (a power of two of them, laid out as this index lays them).
    init(slots: [DiskSlot], count: Int) {
        self.slots = slots
        self.count = count
    }

    var mask: Int { slots.count - 1 }

    /// Where the probe for `tag` starts.
    func home(_ tag: UInt32) -> Int { Int(tag) & mask }
    var bytes: Int { slots.count * MemoryLayout<DiskSlot>.stride }

    /// The positions of slots carrying `tag`, in probe order (callers confirm the key).
    func positions(tag: UInt32) -> [Int] {
        var found: [Int] = []
        var position = Int(tag) & mask
        while !slots[position].isEmpty {
            if slots[position].tag == tag { found.append(position) }
            position = (position + 1) & mask
        }
        return found
    }

    subscript(position: Int) -> DiskSlot {
        get { slots[position] }
        set { slots[position] = newValue }
    }

    mutating func insert(_ slot: DiskSlot) {
        if (count + 1) * 4 > slots.count * 3 { rehash(capacity: slots.count * 2) }
        var position = Int(slot.tag) & mask
        while !slots[position].isEmpty { position = (position + 1) & mask }
        slots[position] = slot
        count += 1
    }

    /// Removes the slot at `position`; later slots of the run shift back into the hole.
    mutating func remove(at position: Int) {
        var hole = position
        var next = position
        while true {
            next = (next + 1) & mask
            let slot = slots[next]
            if slot.isEmpty { break }
            let home = Int(slot.tag) & mask
            // The slot may move into the hole unless its home lies cyclically in (hole, next].
            if (next - home) & mask >= (next - hole) & mask {
                slots[hole] = slot
                hole = next
            }
        }
        slots[hole] = .empty
        count -= 1
    }

    mutating func removeAll() {
        slots = [DiskSlot](repeating: .empty, count: 64)
        count = 0
        hand = 0
    }

    private mutating func rehash(capacity: Int) {
        let old = slots
        slots = [DiskSlot](repeating: .empty, count: capacity)
        let mask = capacity - 1
        for slot in old where !slot.isEmpty {
            var position = Int(slot.tag) & mask
            while !slots[position].isEmpty { position = (position + 1) & mask }
            slots[position] = slot
        }
        hand = 0
    }
}
