/// What an entry carries besides its key, value, group and expiry, as the disk tier and the remote tier
/// store it: one model, one binary encoding.
///
/// The encoding: a flags byte (``RecordFlags``) says which fixed blocks follow, and they follow in this
/// order, each little endian, with no padding:
///
/// | flag | block | bytes |
/// |---|---|---|
/// | `memoryPolicy` | the memory policy (i64; see ``memoryPolicy``) | 8 |
/// | `freshness` | fresh until, loaded at (i64 ms each) | 16 |
/// | `stamp` | the coherence stamp (i64: when the copy was known current, and its partition) | 8 |
/// | `version` | the version of the remote write the copy holds (u64) | 8 |
///
/// `diskOnly`, `memoryOnly` and `negative` are flags without a block. The disk record puts the flags in
/// its header and the blocks after its group (Disk/Format/Record.swift); the remote record puts both in
/// the same places of its own layout (Remote/RemoteRecord.swift). A remote record never carries a
/// stamp (the stamp says when *this* instance last knew its local copy current) nor a version (its fence
/// holds it), and a disk record never carries `memoryOnly` (such an entry never reaches the disk tier):
/// each format rejects the flag it never writes.
///
/// Its fields are declared in this order so that `tiers` (one byte) lies in the bytes after `freshness`'s
/// negative mark, not in a word of its own: 48 bytes, not 56, in every entry a disk read returns and copies
/// (``DiskEntry``), the version included.
package struct EntryMetadata: Sendable, Equatable {
    /// The encoded memory policy: 0 none, > 0 an absolute memory deadline (ms), < 0 minus a lifetime (ms).
    package var memoryPolicy: Int64 = 0
    /// The loader API's freshness and negative mark.
    package var freshness = Freshness.none
    /// The tiers the entry may live in.
    package var tiers: Tiers = .memoryAndDisk
    /// A cache with a remote tier: when it last knew this copy current, and the copy's partition (0: none;
    /// see Remote/Coherence.swift).
    package var stamp: Int64 = 0
    /// A cache with a remote tier: the version of the remote write this copy holds (0: unknown), against
    /// which a change message's version is compared.
    package var version: UInt64 = 0

    package init(
        memoryPolicy: Int64 = 0, tiers: Tiers = .memoryAndDisk, freshness: Freshness = .none, stamp: Int64 = 0, version: UInt64 = 0
    ) {
        self.memoryPolicy = memoryPolicy
        self.tiers = tiers
        self.freshness = freshness
        self.stamp = stamp
        self.version = version
    }

    /// Never promote the entry into memory.
    package var diskOnly: Bool { tiers == .diskOnly }

    /// The flags that describe this metadata (and which blocks its encoding has).
    package var flags: RecordFlags {
        @inline(__always) get {
            var flags: RecordFlags = []
            if memoryPolicy != 0 { flags.insert(.memoryPolicy) }
            switch tiers {
            case .memoryAndDisk: break
            case .diskOnly: flags.insert(.diskOnly)
            case .memoryOnly: flags.insert(.memoryOnly)
            }
            if freshness.freshUntil != 0 { flags.insert(.freshness) }
            if freshness.negative { flags.insert(.negative) }
            if stamp != 0 { flags.insert(.stamp) }
            if version != 0 { flags.insert(.version) }
            return flags
        }
    }

    /// Bytes of the blocks `flags` announce: 8 for each of `memoryPolicy` (bit 0), `stamp` (bit 4) and
    /// `version` (bit 6), 16 for `freshness` (bit 2). Without branches: every read of a record computes its
    /// payload's offset from it, several times over.
    @inline(__always)
    package static func blocksLength(_ flags: RecordFlags) -> Int {
        let bits = Int(flags.rawValue)
        let words = (bits & 1) &+ ((bits &>> 1) & 2) &+ ((bits &>> 4) & 1) &+ ((bits &>> 6) & 1)
        return words &<< 3
    }

    /// Writes the blocks `flags` announce (``flags``, or fewer) at `raw`: exactly ``blocksLength(_:)`` bytes.
    @inline(__always)
    package func writeBlocks(_ flags: RecordFlags, to raw: UnsafeMutableRawPointer) {
        var offset = 0
        if flags.contains(.memoryPolicy) {
            raw.storeBytes(of: memoryPolicy.littleEndian, toByteOffset: offset, as: Int64.self)
            offset += 8
        }
        if flags.contains(.freshness) {
            raw.storeBytes(of: freshness.freshUntil.littleEndian, toByteOffset: offset, as: Int64.self)
            raw.storeBytes(of: freshness.loadedAt.littleEndian, toByteOffset: offset + 8, as: Int64.self)
            offset += 16
        }
        if flags.contains(.stamp) {
            raw.storeBytes(of: stamp.littleEndian, toByteOffset: offset, as: Int64.self)
            offset += 8
        }
        if flags.contains(.version) {
            raw.storeBytes(of: version.littleEndian, toByteOffset: offset, as: UInt64.self)
        }
    }

    /// The metadata `flags` and the blocks at `raw` describe. The caller checked that `raw` holds
    /// ``blocksLength(_:)`` bytes and that `flags` does not carry both `diskOnly` and `memoryOnly`.
    @inline(__always)
    package init(flags: RecordFlags, blocks raw: UnsafeRawPointer) {
        var offset = 0
        if flags.contains(.memoryPolicy) {
            memoryPolicy = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: Int64.self))
            offset += 8
        }
        tiers = flags.contains(.diskOnly) ? .diskOnly : flags.contains(.memoryOnly) ? .memoryOnly : .memoryAndDisk
        freshness.negative = flags.contains(.negative)
        if flags.contains(.freshness) {
            freshness.freshUntil = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: Int64.self))
            freshness.loadedAt = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: offset + 8, as: Int64.self))
            offset += 16
        }
        if flags.contains(.stamp) {
            stamp = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: Int64.self))
            offset += 8
        }
        if flags.contains(.version) {
            version = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
        }
    }
}
