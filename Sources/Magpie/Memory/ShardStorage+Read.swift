// A shard's reads under its lock (lock-free hits are in LockFreeRead.swift): the look-up that counts a
// hit or a miss and drops an expired entry, for the plain reads and for the loader API (which also sees
// negative entries), and the uncounted checks.

extension ShardStorage {
    /// The value stored for `key`, counting a hit or a miss; an expired entry is removed. The bytes are
    /// valid while the lock is held, or, for a caller that pinned its thread before taking the lock
    /// (Support/ReadEpochs.swift), until it unpins.
    @inline(__always)
    mutating func lookup(hash: UInt64, key: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        // A negative entry is the loader API's alone (see `lookupEntry`).
        guard let (block, header) = lookupEntry(hash: hash, key: key, refusing: EntryHeader.negativeFlag) else { return nil }
        return Self.value(of: block, header)
    }

    /// The block of `key` and its header, counting a hit or a miss; an expired entry is removed, and a
    /// placeholder (only `simulateRequest` makes them) or an entry with a flag of `refusing` is a miss.
    /// The loader API reads through this with nothing refused, so that it sees negative entries too.
    @inline(__always)
    mutating func lookupEntry(hash: UInt64, key: UnsafeRawBufferPointer, refusing: UInt8 = 0)
        -> (UnsafeMutableRawPointer, EntryHeader)?
    {
        guard let (position, block) = find(hash: hash, key: key) else {
            counters.misses &+= 1
            return nil
        }
        let header = EntryHeader(of: block)
        if header.state & (refusing | EntryHeader.expiryFlag | EntryHeader.placeholderFlag) != 0 {
            if header.state & (refusing | EntryHeader.placeholderFlag) != 0 {
                counters.misses &+= 1
                return nil
            }
            if Self.isExpired(block, header, now: clock.now()) {
                dropExpired(position: position, block: block)
                return nil
            }
        }
        counters.hits &+= 1
        if header.frequency < Self.frequencyCap { EntryHeader.setFrequency(block, header.frequency &+ 1) }
        return (block, header)
    }

    /// A read found `block` expired: it leaves, counted as an expiration and a miss.
    @inline(__always)
    mutating func dropExpired(position: Int, block: UnsafeMutableRawPointer) {
        unlink(position: position, block: block)
        returnSurplus(keeping: 0)
        counters.expirations &+= 1
        counters.misses &+= 1
    }

    /// The value bytes of a block. Invariant: a block reachable from the index is live: header, extras,
    /// then keyLength + valueLength bytes.
    @inline(__always)
    static func value(of block: UnsafeMutableRawPointer, _ header: EntryHeader) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: block + header.keyOffset + Int(header.keyLength), count: Int(header.valueLength))
    }

    /// The coherence stamp of a block, 0 when it has none.
    @inline(__always)
    static func stamp(of block: UnsafeMutableRawPointer, _ header: EntryHeader) -> Int64 {
        header.hasStamp ? block.loadUnaligned(fromByteOffset: header.stampOffset, as: Int64.self) : 0
    }

    /// The version of the remote write a block holds a copy of, 0 when it has none.
    static func version(of block: UnsafeMutableRawPointer, _ header: EntryHeader) -> UInt64 {
        header.hasStamp ? block.loadUnaligned(fromByteOffset: header.stampOffset + 8, as: UInt64.self) : 0
    }

    /// The expiry (0 = none) and freshness of a block.
    static func metadata(of block: UnsafeMutableRawPointer, _ header: EntryHeader) -> (deadline: Int64, freshness: Freshness) {
        var freshness = Freshness(negative: header.isNegative)
        if header.hasFreshness {
            freshness.freshUntil = block.loadUnaligned(fromByteOffset: header.freshnessOffset, as: Int64.self)
            freshness.loadedAt = block.loadUnaligned(fromByteOffset: header.freshnessOffset + 8, as: Int64.self)
        }
        return (header.hasExpiry ? deadline(of: block) : 0, freshness)
    }

    /// Whether `key` is present and unexpired, without counting a read or changing its frequency.
    func contains(hash: UInt64, key: UnsafeRawBufferPointer) -> Bool {
        guard let (_, block) = find(hash: hash, key: key) else { return false }
        let header = EntryHeader(of: block)
        return !header.isPlaceholder && !header.isNegative && !(header.hasExpiry && Self.isExpired(block, header, now: clock.now()))
    }

    /// The expiry, freshness, coherence stamp and version of `key`'s live entry (negative ones included),
    /// without counting a read.
    func metadata(hash: UInt64, key: UnsafeRawBufferPointer) -> EntryMarks? {
        guard let (_, block) = find(hash: hash, key: key) else { return nil }
        let header = EntryHeader(of: block)
        guard !header.isPlaceholder, !Self.isExpired(block, header, now: clock.now()) else { return nil }
        let (deadline, freshness) = Self.metadata(of: block, header)
        return EntryMarks(deadline: deadline, freshness: freshness, stamp: Self.stamp(of: block, header), version: Self.version(of: block, header))
    }
}

/// What a memory entry carries besides its key and value: its expiry (ms since 1970, 0 none), freshness,
/// and, in a cache with a remote tier, its coherence stamp and version (0 none).
package struct EntryMarks: Sendable {
    package var deadline: Int64
    package var freshness: Freshness
    package var stamp: Int64
    package var version: UInt64
}
