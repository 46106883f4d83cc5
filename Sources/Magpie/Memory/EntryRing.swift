import Glibc

/// Why an entry entered `main` when that is still to be judged (see ``EntryRing``).
enum RingTag: UInt {
    case none = 0
    /// Admitted by its miss count (ShardStorage+Admission.swift).
    case admittedByMisses = 1
    /// Admitted by a ghost hit (ShardStorage+Ghost.swift).
    case admittedByGhost = 2
}

/// A FIFO of entry blocks (one S3-FIFO queue) in a power-of-two ring buffer of pointers, including
/// dead blocks: entries removed while queued, freed when popped or when the ring is compacted.
///
/// A plain struct over malloc'd memory, owned by ``ShardStorage``, which calls ``release()`` once.
///
/// A slot holds a block's address with a 2-bit tag in bits 0-1 (blocks come from malloc: 16-byte
/// aligned, so those bits of an address are always 0): `main` tags an entry admitted by its miss count
/// (ShardStorage+Admission.swift) or by a ghost hit (ShardStorage+Ghost.swift) until the hand first
/// reaches it. Only ``push(_:tag:)`` and ``popFirstTagged()`` see the tag; every other method strips it.
struct EntryRing {
    private var buffer: UnsafeMutablePointer<UInt>
    private var mask: Int
    private var head = 0
    /// Blocks in the ring, live and dead.
    private(set) var count = 0
    /// How many of `count` are dead.
    var dead = 0

    init?(capacity: Int) {
        guard let raw = malloc(capacity * MemoryLayout<UInt>.stride) else { return nil }
        buffer = raw.bindMemory(to: UInt.self, capacity: capacity)
        mask = capacity - 1
    }

    /// The bits of a slot that hold its tag: every block pushed has them clear (see ``push(_:tag:)``).
    static let tagMask: UInt = 3

    /// The block a slot holds. Invariant: every slot was written by `push` from a non-nil block pointer
    /// whose bits 0-1 are 0 (malloc's alignment; the store checks it), so clearing the tag gives that
    /// pointer back.
    @inline(__always)
    private static func block(_ slot: UInt) -> UnsafeMutableRawPointer {
        UnsafeMutableRawPointer(bitPattern: slot & ~tagMask).unsafelyUnwrapped
    }

    /// Frees the ring's own buffer (not the blocks).
    func release() { free(buffer) }

    /// Frees every block in the ring, live or dead, at once: only when no reader can hold one (the tier
    /// is being destroyed). The ring still lists them: call `removeAll()` next.
    func freeAllBlocks() {
        for offset in 0..<count { free(Self.block(buffer[(head + offset) & mask])) }
    }

    /// Retires every block in the ring (all out of the index already). The ring still lists them: call
    /// `removeAll()` next.
    func retireAllBlocks(into retired: inout RetiredBlocks) {
        for offset in 0..<count {
            let block = Self.block(buffer[(head + offset) & mask])
            retired.retire(block, bytes: ShardStorage.charge(storedLength: EntryHeader(of: block).storedLength))
        }
    }

    mutating func removeAll() {
        head = 0
        count = 0
        dead = 0
    }

    /// Appends `block` (bits 0-1 of its address clear) with `tag`; false when the ring had to grow and
    /// memory ran out.
    @inline(__always)
    mutating func push(_ block: UnsafeMutableRawPointer, tag: RingTag = .none) -> Bool {
        if count > mask, !grow() { return false }
        buffer[(head + count) & mask] = UInt(bitPattern: block) | tag.rawValue
        count += 1
        return true
    }

    /// Removes and returns the oldest block. Precondition (callers check it): `count > 0`.
    /// Halves the buffer when it falls to a quarter full (the small queue holds every entry while the
    /// cache fills, then a tenth of them; without this its buffer would stay at its peak size).
    @inline(__always)
    mutating func popFirst() -> UnsafeMutableRawPointer {
        popFirstTagged().block
    }

    /// ``popFirst()``, with the tag the block was pushed with.
    @inline(__always)
    mutating func popFirstTagged() -> (block: UnsafeMutableRawPointer, tag: RingTag) {
        let slot = buffer[head]
        head = (head + 1) & mask
        count -= 1
        if count * 4 < mask && mask >= 1024 { resize(to: (mask + 1) / 2) }
        return (Self.block(slot), RingTag(rawValue: slot & Self.tagMask) ?? .none)
    }

    /// Calls `body` with every block in the ring, oldest first, dead ones included.
    func forEach(_ body: (UnsafeMutableRawPointer) -> Void) {
        for offset in 0..<count { body(Self.block(buffer[(head + offset) & mask])) }
    }

    /// Takes `block` out of the ring, keeping the others in order; false when it is not there. Costs a
    /// scan of the ring's pointers from the newest (no block is read) and moving the shorter side by one.
    mutating func remove(_ block: UnsafeMutableRawPointer) -> Bool {
        var offset = count - 1
        while offset >= 0 && Self.block(buffer[(head + offset) & mask]) != block { offset -= 1 }
        guard offset >= 0 else { return false }
        if offset < count / 2 {
            for older in stride(from: offset, to: 0, by: -1) {
                buffer[(head + older) & mask] = buffer[(head + older - 1) & mask]
            }
            head = (head + 1) & mask
        } else {
            for newer in offset..<(count - 1) { buffer[(head + newer) & mask] = buffer[(head + newer + 1) & mask] }
        }
        count -= 1
        return true
    }

    /// Worth compacting: dead blocks are the majority and there are more than a few.
    var needsCompaction: Bool { dead > 32 && dead * 2 > count }

    /// Releases every dead block (to `retired`), keeping live ones in order. Returns the charge released.
    mutating func compact(retiringInto retired: inout RetiredBlocks) -> Int {
        var kept = 0
        var freed = 0
        for offset in 0..<count {
            let slot = buffer[(head + offset) & mask]
            let block = Self.block(slot)
            let header = EntryHeader(of: block)
            if header.isDead {
                let charge = ShardStorage.charge(storedLength: header.storedLength)
                freed += charge
                retired.retire(block, bytes: charge)
            } else {
                buffer[(head + kept) & mask] = slot
                kept += 1
            }
        }
        count = kept
        dead = 0
        return freed
    }

    private mutating func grow() -> Bool {
        resize(to: (mask + 1) * 2)
    }

    /// Moves the blocks, in order, to a buffer of `capacity` (a power of two ≥ count). False, with the
    /// ring unchanged, when memory runs out (shrinking then simply does not happen).
    @discardableResult
    private mutating func resize(to capacity: Int) -> Bool {
        guard let raw = malloc(capacity * MemoryLayout<UInt>.stride) else { return false }
        let moved = raw.bindMemory(to: UInt.self, capacity: capacity)
        for offset in 0..<count { moved[offset] = buffer[(head + offset) & mask] }
        free(buffer)
        buffer = moved
        mask = capacity - 1
        head = 0
        return true
    }
}
