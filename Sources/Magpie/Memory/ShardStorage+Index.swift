import Glibc
import Synchronization

// The open-addressing index from hash to entry block. See "Index" in ShardStorage.swift.
// Bucket = tag (hash >> 56) << 56 | distance from home << 48 | block address; 0 is empty.
// Buckets are atomic words: lock-free readers load them (Memory/LockFreeRead.swift) while the shard's
// writer, holding the lock, stores them (release: a block is written before its bucket points to it).

private let addressMask: UInt64 = (1 << 48) - 1
private let distanceMask: UInt64 = 0xff << 48
private let maximumDistance = 255

extension ShardStorage {
    /// The bucket at `position` (the writer's view: relaxed, as only the lock holder stores buckets).
    @inline(__always)
    func bucket(_ position: Int) -> UInt64 {
        (index + position).pointee.load(ordering: .relaxed)
    }

    @inline(__always)
    func setBucket(_ position: Int, _ bucket: UInt64) {
        (index + position).pointee.store(bucket, ordering: .releasing)
    }

    @inline(__always)
    func home(_ hash: UInt64, mask: Int) -> Int {
        Int(truncatingIfNeeded: hash &>> 12) & mask
    }

    @inline(__always)
    static func block(in bucket: UInt64) -> UnsafeMutableRawPointer {
        // Invariant: a non-empty bucket holds the 48-bit address of a live block.
        UnsafeMutableRawPointer(bitPattern: UInt(bucket & addressMask)).unsafelyUnwrapped
    }

    /// The bucket position and block of `key`, or nil.
    @inline(__always)
    func find(hash: UInt64, key: UnsafeRawBufferPointer) -> (position: Int, block: UnsafeMutableRawPointer)? {
        let tag = hash &>> 56
        var position = home(hash, mask: indexMask)
        while true {
            let bucket = bucket(position)
            if bucket == 0 { return nil }
            if bucket &>> 56 == tag {
                let block = Self.block(in: bucket)
                if Self.keyEquals(block, EntryHeader(of: block), key) { return (position, block) }
            }
            position = (position &+ 1) & indexMask
        }
    }

    /// Whether `block`, whose header is `header`, holds `key` (length, then bytes). Reads only the block's immutable bytes, so the
    /// lock-free read uses it too.
    @inline(__always)
    static func keyEquals(_ block: UnsafeMutableRawPointer, _ header: EntryHeader, _ key: UnsafeRawBufferPointer) -> Bool {
        guard Int(header.keyLength) == key.count else { return false }
        guard let base = key.baseAddress, key.count > 0 else { return true }
        return memcmp(block + header.keyOffset, base, key.count) == 0
    }

    /// Indexes `block` under `hash`. Precondition: `ensureIndexRoom()` returned true and the key is
    /// not indexed yet. False only when a run grew too long and the table could not grow.
    mutating func indexInsert(hash: UInt64, block: UnsafeMutableRawPointer) -> Bool {
        while true {
            if Self.place(hash: hash, block: block, in: index, mask: indexMask) { return true }
            guard grow() else { return false }
        }
    }

    /// Linear-probes from home to the first empty bucket; false when that is over 255 away.
    @inline(__always)
    private static func place(
        hash: UInt64, block: UnsafeMutableRawPointer, in table: UnsafeMutablePointer<Atomic<UInt64>>, mask: Int
    ) -> Bool {
        var position = Int(truncatingIfNeeded: hash &>> 12) & mask
        var distance = 0
        while (table + position).pointee.load(ordering: .relaxed) != 0 {
            position = (position &+ 1) & mask
            distance += 1
            if distance > maximumDistance { return false }
        }
        (table + position).pointee.store(
            (hash &>> 56) &<< 56 | UInt64(distance) &<< 48 | UInt64(UInt(bitPattern: block)), ordering: .releasing)
        return true
    }

    /// Deletes the bucket at `position`, shifting later buckets of the run back (no tombstones).
    mutating func indexDelete(at position: Int) {
        var hole = position
        var next = position
        while true {
            next = (next &+ 1) & indexMask
            let bucket = bucket(next)
            if bucket == 0 { break }
            let distance = Int((bucket & distanceMask) &>> 48)
            let gap = (next &- hole) & indexMask
            // The bucket may move into the hole unless its home lies cyclically in (hole, next].
            if distance >= gap {
                setBucket(hole, (bucket & ~distanceMask) | UInt64(distance - gap) &<< 48)
                hole = next
            }
        }
        setBucket(hole, 0)
    }

    /// The bucket position of `block`, whose key hashes to `hash`; nil if it is not indexed.
    func indexPosition(hash: UInt64, block: UnsafeMutableRawPointer) -> Int? {
        let address = UInt64(UInt(bitPattern: block))
        var position = home(hash, mask: indexMask)
        while true {
            let bucket = bucket(position)
            if bucket == 0 { return nil }
            if bucket & addressMask == address { return position }
            position = (position &+ 1) & indexMask
        }
    }

    /// Deletes the bucket of `block`, whose key hashes to `hash`.
    mutating func indexDelete(hash: UInt64, block: UnsafeMutableRawPointer) {
        // A live block is always indexed; if not, there is nothing to delete.
        if let position = indexPosition(hash: hash, block: block) { indexDelete(at: position) }
    }

    /// Makes sure one more entry keeps the load at or under 3/4. False when memory runs out.
    mutating func ensureIndexRoom() -> Bool {
        (count + 1) * 4 <= (indexMask + 1) * 3 || grow()
    }

    /// Doubles the table (and the ghost and the sketch with it), re-hashing each key once. The new table is published
    /// whole; the old one is retired (a reader may still be probing it: what it finds there is what the
    /// shard held when the new one was published).
    private mutating func grow() -> Bool {
        var buckets = (indexMask + 1) * 2
        while buckets <= 1 << 40 {
            guard let newTable = IndexTable.allocate(buckets: buckets) else { return false }
            let table = IndexTable.buckets(newTable)
            let mask = buckets - 1
            var placedAll = true
            for old in 0...indexMask where bucket(old) != 0 {
                let block = Self.block(in: bucket(old))
                if !Self.place(hash: hashOf(block), block: block, in: table, mask: mask) {
                    placedAll = false
                    break
                }
            }
            guard placedAll else {
                free(newTable)
                buckets *= 2
                continue
            }
            guard let newGhost = allocateZeroed(UInt32.self, buckets) else {
                free(newTable)
                return false
            }
            guard let newSketch = sketch.regrown(buckets: buckets) else {
                free(newTable); free(newGhost)
                return false
            }
            Self.regrowGhost(ghost, oldMask: indexMask, into: newGhost, buckets: buckets)
            replaceTable(with: newTable)
            free(ghost)
            ghost = newGhost
            sketch.release()
            sketch = newSketch
            return true
        }
        return false
    }

    /// Publishes `newTable` (filled) as the index and retires the current one.
    mutating func replaceTable(with newTable: UnsafeMutableRawPointer) {
        published.pointee.store(UInt(bitPattern: newTable), ordering: .releasing)
        retired.retire(table, bytes: 0)
        table = newTable
        index = IndexTable.buckets(newTable)
        indexMask = IndexTable.mask(newTable)
    }

    /// The key hash of a block, recomputed from its key bytes (buckets keep 8 bits of it).
    @inline(__always)
    func hashOf(_ block: UnsafeMutableRawPointer) -> UInt64 {
        let header = EntryHeader(of: block)
        return hasher.hash(UnsafeRawBufferPointer(start: block + header.keyOffset, count: Int(header.keyLength)))
    }
}
