import Glibc

// The open-addressing index from hash to entry block. See "Index" in ShardStorage.swift.
// Bucket = tag (hash >> 56) << 56 | distance from home << 48 | block address; 0 is empty.

private let addressMask: UInt64 = (1 << 48) - 1
private let distanceMask: UInt64 = 0xff << 48
private let maximumDistance = 255

extension ShardStorage {
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
            let bucket = index[position]
            if bucket == 0 { return nil }
            if bucket &>> 56 == tag {
                let block = Self.block(in: bucket)
                if keyEquals(block, key) { return (position, block) }
            }
            position = (position &+ 1) & indexMask
        }
    }

    @inline(__always)
    func keyEquals(_ block: UnsafeMutableRawPointer, _ key: UnsafeRawBufferPointer) -> Bool {
        let header = block.assumingMemoryBound(to: EntryHeader.self).pointee
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
        hash: UInt64, block: UnsafeMutableRawPointer, in table: UnsafeMutablePointer<UInt64>, mask: Int
    ) -> Bool {
        var position = Int(truncatingIfNeeded: hash &>> 12) & mask
        var distance = 0
        while table[position] != 0 {
            position = (position &+ 1) & mask
            distance += 1
            if distance > maximumDistance { return false }
        }
        table[position] = (hash &>> 56) &<< 56 | UInt64(distance) &<< 48 | UInt64(UInt(bitPattern: block))
        return true
    }

    /// Deletes the bucket at `position`, shifting later buckets of the run back (no tombstones).
    mutating func indexDelete(at position: Int) {
        var hole = position
        var next = position
        while true {
            next = (next &+ 1) & indexMask
            let bucket = index[next]
            if bucket == 0 { break }
            let distance = Int((bucket & distanceMask) &>> 48)
            let gap = (next &- hole) & indexMask
            // The bucket may move into the hole unless its home lies cyclically in (hole, next].
            if distance >= gap {
                index[hole] = (bucket & ~distanceMask) | UInt64(distance - gap) &<< 48
                hole = next
            }
        }
        index[hole] = 0
    }

    /// The bucket position of `block`, whose key hashes to `hash`; nil if it is not indexed.
    func indexPosition(hash: UInt64, block: UnsafeMutableRawPointer) -> Int? {
        let address = UInt64(UInt(bitPattern: block))
        var position = home(hash, mask: indexMask)
        while true {
            let bucket = index[position]
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

    /// Doubles the table (and the ghost with it), re-hashing each key once.
    private mutating func grow() -> Bool {
        var buckets = (indexMask + 1) * 2
        while buckets <= 1 << 40 {
            guard let table = allocateZeroed(UInt64.self, buckets) else { return false }
            let mask = buckets - 1
            var placedAll = true
            for old in 0...indexMask where index[old] != 0 {
                let block = Self.block(in: index[old])
                if !Self.place(hash: hashOf(block), block: block, in: table, mask: mask) {
                    placedAll = false
                    break
                }
            }
            guard placedAll else {
                free(table)
                buckets *= 2
                continue
            }
            guard let newGhost = allocateZeroed(UInt32.self, buckets) else {
                free(table)
                return false
            }
            Self.regrowGhost(ghost, oldMask: indexMask, into: newGhost, buckets: buckets)
            free(index)
            index = table
            indexMask = mask
            free(ghost)
            ghost = newGhost
            return true
        }
        return false
    }

    /// The key hash of a block, recomputed from its key bytes (buckets keep 8 bits of it).
    @inline(__always)
    func hashOf(_ block: UnsafeMutableRawPointer) -> UInt64 {
        let header = block.assumingMemoryBound(to: EntryHeader.self).pointee
        return hasher.hash(UnsafeRawBufferPointer(start: block + header.keyOffset, count: Int(header.keyLength)))
    }
}
