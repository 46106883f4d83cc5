// MARK: - The on-disk format (format version 2): every file the disk tier writes, byte by byte
//
// This comment is the one description of the format; the types in this folder encode and decode it
// (Record.swift: records; this file: MANIFEST, bucket file and region headers, index snapshots, SIZES).
// All integers are little-endian. The DocC article "The on-disk format" explains it for users.
//
//   <directory>/MANIFEST            written once, atomically, when the directory is created
//   <directory>/LOCK                empty; flock'ed by the one tier that has the directory open
//   <directory>/buckets/<NN>        a bucket file: file header, then region slots
//   <directory>/buckets/<NN>.index  an index snapshot, written by a clean close, deleted once loaded
//                                     (by the loader thread) or before the bucket file next changes
//   <directory>/buckets/SIZES       every bucket file's and snapshot's size, written last by a clean
//                                     close, deleted before any bucket file next changes
// Names never derive from keys: <NN> is the bucket number in hex, two or more digits. Format 1 (2026-11:
// one append-only log per bucket, records marked "DEAD" in place, compactions) is not read: its MANIFEST
// makes the open throw `manifestMismatch`, and `DiskTier.destroy(directory:)` resets the directory.
//
// MANIFEST (56 bytes):
//   0  16-byte magic "MAGPIE-MANIFEST\n"   16 u32 format version (2)   20 u32 bucket count
//   24 u64 hash seed                       32 i64 creation time (ms since 1970)   40 u64 reserved (0)
//   48 u64 XXH3-64 (seed 0) of bytes 0..<48
//
// Bucket file (`H` = 64 bytes of header, then slots of `G` bytes, the region size):
//   0  u32 magic "MGPB"        4  u32 format version (2)   8  u32 bucket index   12 u32 bucket count
//   16 u64 hash seed           24 u32 region size G (a multiple of 8, at least 1024)   28 u32 reserved (0)
//   32 u64 closed length: the file's length when the tier closed it cleanly, or 0 (set at the close, after
//          the flush; set back to 0 before the file's next change). A file found shorter than it lost its
//          end since (a truncation: tombstones may have gone with it) and is emptied, never scanned.
//   40..<56 reserved (0)
//   56 u64 XXH3-64 (seed 0) of bytes 0..<56
//   64 slot 0, 64 + G slot 1, ...: a bucket takes H + n × G bytes of its budget (it grows and shrinks by
//      slots); the file is as long as what was written of them (its last slot may be written in part).
// A slot is free or holds a region; a region takes one slot, or m consecutive ones for a record longer
// than a slot (a "jumbo" region).
//
// Region (at the start of its first slot; its records follow from byte 64 of the region, each on an
// 8-byte boundary, none crossing the region's end):
//   0  u32 magic "MGRG"        4  u32 version (1)          8  u32 bucket index   12 u32 slots (m ≥ 1)
//   16 u64 region sequence (per bucket, increasing: the order regions were opened in)
//   24 u64 first record sequence: every record written into this region has a sequence number at least
//          this (so records a reused slot still holds from its previous region are told apart)
//   32..<56 reserved (0)
//   56 u64 XXH3-64 of bytes 0..<56, seeded with the directory's hash seed (so bytes inside a stored value
//          can never pass for a region header: forging one takes the seed, which only the MANIFEST holds)
// A region's records are the valid records from byte 64 on whose sequence numbers increase from its
// first record sequence; the first byte that does not start one ends them (a torn last write, zeros, or
// what the slot held before). A free slot's first 64 bytes never hold a valid region header: a region is
// invalidated (its header zeroed, or overwritten by the next region's) under its bucket's lock before
// anything else may happen in the bucket, and a slot past the old end of a file reads as zeros.
//
// Record (a 64-byte header, then key, group, the optional 8-byte memory policy, the optional 16-byte
// freshness block, the optional 8-byte coherence stamp and payload bytes, then zero padding to a
// multiple of 8):
//   0  u32 magic "MGPR"
//   4  u8  format version (2)
//   5  u8  kind: 1 value, 2 tombstone (removes the key: key set, group and payload empty), 3 group
//          tombstone (removes the group's values: the group name in the group field, key and payload
//          empty, key hash 0)
//   6  u8  codec: 0 raw, 1 zstd (one frame)
//   7  u8  flags (value records only, else 0): bit 0 = an 8-byte memory policy follows the group
//          (i64: 0 none, > 0 an absolute memory deadline in ms, < 0 minus a memory lifetime in ms; the
//          `Cache` re-applies it when it promotes the entry into memory); bit 1 = disk only (never
//          promoted into memory); bit 2 = a 16-byte freshness block follows the memory policy (i64
//          fresh-until and i64 loaded-at, ms since 1970: the loader API serves the value as fresh
//          before fresh-until, as stale after it until the expiry, and measures its age from
//          loaded-at); bit 3 = negative (the loader found no value: payload empty, codec raw; every
//          read but the loader's treats the key as absent); bit 4 = an 8-byte coherence stamp follows the
//          freshness block (i64: when a cache with a remote tier last knew this copy to match the shared
//          store, and the copy's partition; such a cache serves no local copy without one, a cache without
//          a remote tier ignores it); bit 6 = an 8-byte version follows the stamp (u64: the remote write
//          the copy holds). Other bits 0. Records written by `DiskTier` alone have flags 0.
//          These flags and the blocks after the group are EntryMetadata's encoding
//          (Support/EntryMetadata.swift), which the remote record shares; bit 5 (memory only) exists
//          there only, and a disk record carrying it is corrupt.
//   8  u16 key length          10 u16 group length         12 u32 stored (payload) length
//   16 u32 original value length (= stored for raw; 0 for tombstones)   20 u32 reserved, 0
//   24 i64 a value's expiry, milliseconds since 1970 (0 = never); a tombstone's or group tombstone's
//          cover (u64): it removes records of its key or group whose sequence number is lower
//   32 u64 sequence number (per bucket, assigned when the record is written to the file: increasing in
//          the order records were written, across regions in region order)
//   40 u64 key hash (XXH3-64 of the key with the directory's seed; picks the bucket)
//   48 u64 payload hash: XXH3-64 (seed 0) of the stored payload
//   56 u64 checksum: XXH3-64 (seed: XXH3-64 (seed 0) of bytes 4..<56) of key ‖ group ‖ memory policy ‖
//          freshness ‖ stamp ‖ version: everything before the payload is covered by it, the payload by its hash
//
// Tombstones. A removal of a key whose record is in the file, an overwrite of one (before the new value
// is in the file itself) and a group removal with members in the file write a tombstone at once, with a
// cover equal to its own sequence number. Every record a tombstone covers is older, so it lies in the
// same region or an older one: when the oldest region is reclaimed its tombstones go with it. A region
// reclaimed out of turn (emptied to heal damage, or to give back room) carries its tombstones forward
// into the newest region: with new sequence numbers, so that they belong there, and their old covers, so
// that they never remove a record written after them.
//
// Index snapshot (<NN>.index):
//   0  u32 magic "MGPI"   4 u32 snapshot version (3)   8 u32 bucket index   12 u32 bucket count
//   16 u64 hash seed      24 u64 bucket file size (as written)   32 u64 live bytes   40 u64 last record sequence
//   48 u64 slot count (the index's capacity)         56 u64 live entries
//   64 u32 region size    68 u32 the bucket's slots   72 u32 regions   76 u32 reserved (0)
//   80 u64 next region sequence                      88 u64 reserved (0)
//   96 regions, oldest first, 32 bytes each: u32 first slot, u32 slots, u64 region sequence, u64 first
//      record sequence, u32 bytes used (from the region's start, its header included), u32 reserved (0)
//   then slots, 16 bytes each: u32 tag (the key hash's low 32 bits), u32 record offset / 8, u32 record
//      length (a multiple of 8; bits 0–2: the eviction's read credits; bit 31 never set), u32 expiry in
//      whole seconds since 1970 rounded up
//   end u64 XXH3-64 (seed 0) of everything before it
//
// Sizes (SIZES), so that an open needs no system call per bucket (see Disk/DiskTier.swift, "Reopening"):
//   0  u32 magic "MGPZ"   4 u32 version (1)   8 u32 bucket count   12 u32 reserved (0)   16 u64 hash seed
//   24 per bucket, in bucket order, 16 bytes: u64 bucket file size, u64 index snapshot size (0: none)
//   end u64 XXH3-64 (seed 0) of everything before it
// Only sizes: the ledger charges them at the open; each bucket file is opened, and its size checked, at
// the bucket's load, and a snapshot is still used only if it passes its own checks.
//
// Validity. A record is valid when every field is in range, it lies wholly inside its region, its
// checksum and payload hash match, its key hash is the hash of its key, and that hash belongs to the
// file's bucket. Recovery applies the records of every valid region in region order, and within a region
// in file order: a value replaces the key's earlier record, a tombstone or group tombstone removes the
// records it covers. A snapshot is used only if intact and naming this bucket, count, seed, region size
// and the file's current size, and is never trusted with data: every read still verifies the record's
// checksum, payload hash and key.

struct Manifest: Equatable {
    static let size = 56
    static let magic = Array("MAGPIE-MANIFEST\n".utf8)
    static let formatVersion: UInt32 = 2

    var formatVersion: UInt32 = Manifest.formatVersion
    var bucketCount: Int
    var seed: UInt64
    var created: Int64

    func encoded() -> [UInt8] {
        var bytes = Self.magic + [UInt8](repeating: 0, count: Self.size - Self.magic.count)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: formatVersion.littleEndian, toByteOffset: 16, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 20, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: created.littleEndian, toByteOffset: 32, as: Int64.self)
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<48]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self)
        }
        return bytes
    }

    /// Nil when the bytes are not an intact manifest (of any version).
    static func decode(_ bytes: [UInt8]) -> Manifest? {
        guard bytes.count == size, Array(bytes[0..<16]) == magic else { return nil }
        return bytes.withUnsafeBytes { raw -> Manifest? in
            let sum = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
            guard sum == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<48])) else { return nil }
            return Manifest(
                formatVersion: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: UInt32.self)),
                bucketCount: Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 20, as: UInt32.self))),
                seed: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self)),
                created: Int64(littleEndian: raw.loadUnaligned(fromByteOffset: 32, as: Int64.self)))
        }
    }
}

/// The 64-byte header of a bucket file (layout above).
package struct BucketFileHeader: Equatable {
    package static let size = 64
    package static let magic: UInt32 = 0x4250_474D  // "MGPB"
    package static let formatVersion: UInt32 = 2

    package var bucketIndex: Int
    package var bucketCount: Int
    package var seed: UInt64
    /// The size of the file's slots.
    package var regionSize: Int
    /// The file's length at the tier's last clean close; 0 once anything may have changed it since.
    package var closedLength: Int = 0

    package func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.size)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.formatVersion.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: UInt32(regionSize).littleEndian, toByteOffset: 24, as: UInt32.self)
            raw.storeBytes(of: UInt64(closedLength).littleEndian, toByteOffset: 32, as: UInt64.self)
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<56]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 56, as: UInt64.self)
        }
        return bytes
    }

    /// Nil unless the bytes are an intact header whose region size is one this format allows.
    package static func decode(_ bytes: UnsafeRawBufferPointer) -> BucketFileHeader? {
        guard bytes.count >= size,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) == formatVersion,
            UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 56, as: UInt64.self))
                == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: bytes[0..<56]))
        else { return nil }
        let regionSize = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt32.self)))
        guard RegionHeader.isValidRegionSize(regionSize) else { return nil }
        let closedLength = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 32, as: UInt64.self))
        guard closedLength <= UInt64(Int.max) else { return nil }
        return BucketFileHeader(
            bucketIndex: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self))),
            bucketCount: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self))),
            seed: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self)), regionSize: regionSize,
            closedLength: Int(closedLength))
    }

    package init(bucketIndex: Int, bucketCount: Int, seed: UInt64, regionSize: Int, closedLength: Int = 0) {
        self.bucketIndex = bucketIndex
        self.bucketCount = bucketCount
        self.seed = seed
        self.regionSize = regionSize
        self.closedLength = closedLength
    }

    /// Whether it is `other`'s header but for the closed length.
    package func isSameFile(as other: BucketFileHeader) -> Bool {
        bucketIndex == other.bucketIndex && bucketCount == other.bucketCount && seed == other.seed && regionSize == other.regionSize
    }
}

/// The 64-byte header that opens a region (layout above).
package struct RegionHeader: Equatable {
    package static let size = 64
    package static let magic: UInt32 = 0x4752_474D  // "MGRG"
    package static let version: UInt32 = 1
    /// The smallest and largest region sizes (slots) a bucket file may have.
    package static let minimumRegionSize = 1024
    package static let maximumRegionSize = 1 << 26

    package var bucketIndex: Int
    /// Consecutive slots the region takes (1, or more for a record longer than a slot).
    package var slots: Int
    package var sequence: UInt64
    package var firstRecordSequence: UInt64

    package static func isValidRegionSize(_ size: Int) -> Bool {
        size >= minimumRegionSize && size <= maximumRegionSize && size % 8 == 0
    }

    package func encoded(hasher: KeyHash) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.size)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.version.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(slots).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: sequence.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: firstRecordSequence.littleEndian, toByteOffset: 24, as: UInt64.self)
            let sum = hasher.sealedChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<56]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 56, as: UInt64.self)
        }
        return bytes
    }

    /// Nil unless the bytes start with an intact region header sealed with `hasher`'s seed.
    package static func decode(_ bytes: UnsafeRawBufferPointer, hasher: KeyHash) -> RegionHeader? {
        guard bytes.count >= size,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) == version,
            UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 56, as: UInt64.self))
                == hasher.sealedChecksum(UnsafeRawBufferPointer(rebasing: bytes[0..<56]))
        else { return nil }
        let slots = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self)))
        guard slots >= 1 else { return nil }
        return RegionHeader(
            bucketIndex: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self))), slots: slots,
            sequence: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self)),
            firstRecordSequence: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self)))
    }

    package init(bucketIndex: Int, slots: Int, sequence: UInt64, firstRecordSequence: UInt64) {
        self.bucketIndex = bucketIndex
        self.slots = slots
        self.sequence = sequence
        self.firstRecordSequence = firstRecordSequence
    }
}

/// SIZES (layout above): what a clean close left in `buckets/`, read by the next open instead of
/// opening and measuring every bucket file.
package struct BucketSizes: Equatable {
    package static let fileName = "SIZES"
    static let magic: UInt32 = 0x5A50_474D  // "MGPZ"
    static let version: UInt32 = 1
    static let headerSize = 24

    var seed: UInt64
    /// Per bucket: its file's size and its snapshot's (0: none).
    var files: [Int]
    var snapshots: [Int]

    static func length(bucketCount: Int) -> Int { headerSize + bucketCount * 16 + 8 }

    /// `bytes` followed by their checksum: a SIZES with any content that passes the checksum (for the fuzz
    /// target, which must reach the checks after it).
    package static func sealed(_ bytes: [UInt8]) -> [UInt8] {
        let sum = bytes.withUnsafeBytes { KeyHash.formatChecksum($0) }
        return bytes + withUnsafeBytes(of: sum.littleEndian) { Array($0) }
    }

    func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.length(bucketCount: files.count))
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.version.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(files.count).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            for n in files.indices {
                raw.storeBytes(of: UInt64(files[n]).littleEndian, toByteOffset: Self.headerSize + n * 16, as: UInt64.self)
                raw.storeBytes(of: UInt64(snapshots[n]).littleEndian, toByteOffset: Self.headerSize + n * 16 + 8, as: UInt64.self)
            }
            let end = raw.count - 8
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
        }
        return bytes
    }

    /// Nil unless the bytes are intact sizes for `bucketCount` buckets and `seed`, every size within
    /// what a bucket file (``DiskTier/maximumBucketBudget``) or a snapshot of its index can hold.
    static func decode(_ bytes: [UInt8], bucketCount: Int, seed: UInt64) -> BucketSizes? {
        guard bytes.count == length(bucketCount: bucketCount) else { return nil }
        return bytes.withUnsafeBytes { raw -> BucketSizes? in
            func u32(_ at: Int) -> UInt32 { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)) }
            func u64(_ at: Int) -> UInt64 { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)) }
            let end = raw.count - 8
            guard u64(end) == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end])), u32(0) == magic,
                u32(4) == version, u32(8) == UInt32(bucketCount), u32(12) == 0, u64(16) == seed
            else { return nil }
            // Bounded before any conversion, so that no value can make `Int(_:)` trap or a sum overflow.
            let largest = UInt64(DiskTier.maximumBucketBudget)
            var sizes = BucketSizes(seed: seed, files: [], snapshots: [])
            sizes.files.reserveCapacity(bucketCount)
            sizes.snapshots.reserveCapacity(bucketCount)
            for n in 0..<bucketCount {
                let file = u64(headerSize + n * 16)
                let snapshot = u64(headerSize + n * 16 + 8)
                guard file <= largest, snapshot <= largest else { return nil }
                sizes.files.append(Int(file))
                sizes.snapshots.append(Int(snapshot))
            }
            return sizes
        }
    }
}
