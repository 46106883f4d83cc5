// MARK: - The on-disk format (format version 1): every file the disk tier writes, byte by byte
//
// This comment is the one description of the format; the types in this folder encode and decode it
// (Record.swift: records; this file: MANIFEST, bucket file headers, index snapshots). All integers are
// little-endian. The DocC article "The on-disk format" explains it for users.
//
//   <directory>/MANIFEST            written once, atomically, when the directory is created
//   <directory>/LOCK                empty; flock'ed by the one tier that has the directory open
//   <directory>/buckets/<NN>        a bucket file: file header, then records (append-only log)
//   <directory>/buckets/<NN>.index  an index snapshot, written by a clean close, deleted once loaded
//                                     (by the loader thread) or before the bucket file next changes
//   <directory>/buckets/SIZES       every bucket file's and snapshot's size, written last by a clean
//                                     close, deleted before any bucket file next changes
//   <directory>/buckets/<NN>.compact  a compaction's new file, renamed over <NN> when complete
// Names never derive from keys: <NN> is the bucket number in hex, two or more digits.
//
// MANIFEST (56 bytes):
//   0  16-byte magic "MAGPIE-MANIFEST\n"   16 u32 format version (1)   20 u32 bucket count
//   24 u64 hash seed                       32 i64 creation time (ms since 1970)   40 u64 reserved (0)
//   48 u64 XXH3-64 (seed 0) of bytes 0..<48
//
// Bucket file header (32 bytes):
//   0  u32 magic "MGPB"        4  u32 format version (1)   8  u32 bucket index   12 u32 bucket count
//   16 u64 hash seed           24 u64 XXH3-64 (seed 0) of bytes 0..<24
//
// Record (each starts on an 8-byte boundary): a 56-byte header, then key, group, the optional 8-byte
// memory policy, the optional 16-byte freshness block, the optional 8-byte coherence stamp and payload
// bytes, then zero padding to a multiple of 8:
//   0  u32 magic "MGPR", or "DEAD" once the record is superseded or removed (see below)
//   4  u8  format version (1)
//   5  u8  kind: 1 value, 2 tombstone (deletes the key: key set, group and payload empty), 3 group
//          tombstone (deletes the group's records written before it: the group name in the group
//          field, key and payload empty, key hash 0)
//   6  u8  codec: 0 raw, 1 zstd (one frame)
//   7  u8  flags (value records only, else 0): bit 0 = an 8-byte memory policy follows the group
//          (i64: 0 none, > 0 an absolute memory deadline in ms, < 0 minus a memory lifetime in ms; the
//          `Cache` re-applies it when it promotes the entry into memory); bit 1 = disk only (never
//          promoted into memory); bit 2 = a 16-byte freshness block follows the memory policy (i64
//          fresh-until and i64 loaded-at, ms since 1970: the loader API serves the value as fresh
//          before fresh-until, as stale after it until the expiry, and measures its age from
//          loaded-at); bit 3 = negative (the loader found no value: payload empty, codec raw; every
//          read but the loader's treats the key as absent); bit 4 = an 8-byte coherence stamp follows the
//          freshness block (i64 ms since 1970: when a cache with a remote tier last knew this copy to
//          match the shared store; such a cache serves no local copy without one, a cache without a
//          remote tier ignores it). Other bits 0. Records written by `DiskTier` alone have flags 0.
//          Bits 2, 3 and 4 came after the first release of format 1: an older reader drops such a
//          record as corrupt (a miss), never misreads it. These flags and the blocks after the group
//          are EntryMetadata's encoding (Support/EntryMetadata.swift), which the remote record shares;
//          bit 5 (memory only) exists there only, and a disk record carrying it is corrupt.
//   8  u16 key length          10 u16 group length         12 u32 stored (payload) length
//   16 u32 original value length (= stored for raw)         20 u32 reserved, 0
//   24 i64 expiry, milliseconds since 1970 (0 = never)      32 u64 sequence number (per bucket)
//   40 u64 key hash (XXH3-64 of the key with the cache's seed; picks the bucket)
//   48 u64 checksum: XXH3-64 of key ‖ group ‖ memory policy ‖ freshness ‖ stamp ‖ payload, seeded with XXH3-64 of header
//          bytes 4..<48
//
// Index snapshot (<NN>.index):
//   0  u32 magic "MGPI"   4 u32 snapshot version (2)   8 u32 bucket index   12 u32 bucket count
//   16 u64 hash seed      24 u64 bucket file size    32 u64 live bytes     40 u64 maximum sequence
//   48 u64 slot count (the index's capacity)         56 u64 live entries
//   64 slots, 16 bytes each: u32 tag (the key hash's low 32 bits), u32 record offset / 8, u32 record
//      length (a multiple of 8; bits 0–1: the clock's read credits;
//      bit 31, the reference bit of builds before 2026-11-27, is ignored), u32 expiry in whole seconds since 1970 rounded up
//   end u64 XXH3-64 (seed 0) of everything before it
//
// Sizes (SIZES), so that an open needs no system call per bucket (see Disk/DiskTier.swift, "Reopening"):
//   0  u32 magic "MGPZ"   4 u32 version (1)   8 u32 bucket count   12 u32 reserved (0)   16 u64 hash seed
//   24 per bucket, in bucket order, 16 bytes: u64 bucket file size, u64 index snapshot size (0: none)
//   end u64 XXH3-64 (seed 0) of everything before it
// Only sizes: the ledger charges them at the open; each bucket file is opened, and its size checked, at
// the bucket's load, and a snapshot is still used only if it passes its own checks.
//
// Dead records. When a key's record is superseded (a newer value) or removed (remove, group removal),
// its magic is overwritten with "DEAD" in place. The checksum leaves the magic out, so a dead record
// still parses and recovery steps over it; but it is never applied. So at most one record per key is
// live in a file, and losing a later record to corruption (a tombstone, a newer value) can only lose
// that key, never bring back a removed or older value. Tombstones are still written: marking is
// best-effort (a failed mark is harmless while the tombstone survives) and covers records that are
// no longer indexed (evicted ones).
//
// Validity. A record is valid when every field is in range, it lies wholly inside the file, the
// checksum matches, its key hash is the hash of its key, and that hash belongs to the file's bucket.
// Within a bucket, a later record overrides an earlier one for the same key: file order is the truth,
// and the sequence numbers (assigned by the bucket, under its lock) agree with it. A snapshot is used
// only if intact and naming this bucket, count, seed and the file's current size, and is never trusted
// with data: every read still verifies the record's checksum and key.

/// The MANIFEST: what a directory was created with (layout above).
struct Manifest: Equatable {
    static let size = 56
    static let magic = Array("MAGPIE-MANIFEST\n".utf8)
    static let formatVersion: UInt32 = 1

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

/// The 32-byte header of a bucket file (layout above).
package struct BucketFileHeader: Equatable {
    package static let size = 32
    package static let magic: UInt32 = 0x4250_474D  // "MGPB"
    package static let formatVersion: UInt32 = 1

    package var bucketIndex: Int
    package var bucketCount: Int
    package var seed: UInt64

    package func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.size)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.formatVersion.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<24]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 24, as: UInt64.self)
        }
        return bytes
    }

    package static func decode(_ bytes: UnsafeRawBufferPointer) -> BucketFileHeader? {
        guard bytes.count >= size,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) == formatVersion,
            UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
                == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: bytes[0..<24]))
        else { return nil }
        return BucketFileHeader(
            bucketIndex: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self))),
            bucketCount: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self))),
            seed: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self)))
    }
    package init(bucketIndex: Int, bucketCount: Int, seed: UInt64) {
        self.bucketIndex = bucketIndex
        self.bucketCount = bucketCount
        self.seed = seed
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

/// An index snapshot (layout above): a bucket's index and what it was taken against.
struct IndexSnapshot {
    static let magic: UInt32 = 0x4950_474D  // "MGPI"
    static let headerSize = 64
    /// 2: tags are the key hash's low 32 bits.
    static let version: UInt32 = 2

    var bucketIndex: Int
    var bucketCount: Int
    var seed: UInt64
    var fileSize: Int
    var liveBytes: Int
    var maximumSequence: UInt64
    var slots: [DiskSlot]
    var liveCount: Int

    /// The encoded length of a snapshot of `slotCount` slots.
    static func length(slotCount: Int) -> Int { headerSize + slotCount * 16 + 8 }

    func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.length(slotCount: slots.count))
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.version.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: UInt64(fileSize).littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: UInt64(liveBytes).littleEndian, toByteOffset: 32, as: UInt64.self)
            raw.storeBytes(of: maximumSequence.littleEndian, toByteOffset: 40, as: UInt64.self)
            raw.storeBytes(of: UInt64(slots.count).littleEndian, toByteOffset: 48, as: UInt64.self)
            raw.storeBytes(of: UInt64(liveCount).littleEndian, toByteOffset: 56, as: UInt64.self)
            for (n, slot) in slots.enumerated() {
                let at = Self.headerSize + n * 16
                raw.storeBytes(of: slot.tag.littleEndian, toByteOffset: at, as: UInt32.self)
                raw.storeBytes(of: slot.offset8.littleEndian, toByteOffset: at + 4, as: UInt32.self)
                raw.storeBytes(of: slot.rawLength.littleEndian, toByteOffset: at + 8, as: UInt32.self)
                raw.storeBytes(of: slot.expiry.littleEndian, toByteOffset: at + 12, as: UInt32.self)
            }
            let end = raw.count - 8
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
        }
        return bytes
    }

    /// Nil unless the bytes are an intact snapshot whose counts agree with its slots, every live slot
    /// lying inside a file of the recorded size.
    static func decode(_ bytes: [UInt8]) -> IndexSnapshot? {
        bytes.withUnsafeBytes { raw -> IndexSnapshot? in
            guard raw.count >= headerSize + 8 else { return nil }
            func u32(_ at: Int) -> UInt32 { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)) }
            func u64(_ at: Int) -> UInt64 { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)) }
            let end = raw.count - 8
            // Counts are read with a bound before any conversion: a hostile snapshot with a valid checksum
            // must not make `Int(_:)` trap.
            guard u64(end) == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end])),
                u32(0) == magic, u32(4) == version, u64(24) <= UInt64(UInt32.max) * 8,
                u64(48) >= 1, u64(48) == UInt64((end - headerSize) / 16), (end - headerSize) % 16 == 0,
                u64(56) <= u64(48), u64(32) <= u64(24)
            else { return nil }
            let fileSize = Int(u64(24))
            let slotCount = Int(u64(48))
            var slots = [DiskSlot](repeating: .empty, count: slotCount)
            var live = 0
            var liveBytes = 0
            for n in 0..<slotCount {
                let at = headerSize + n * 16
                // Bit 31 (an older build's reference bit) cleared: it means nothing now.
                let slot = DiskSlot(tag: u32(at), offset8: u32(at + 4), rawLength: u32(at + 8) & 0x7fff_ffff, expiry: u32(at + 12))
                if slot.isEmpty { continue }
                // Every slot must point inside the file at something a record's length long (its low
                // bits, the clock's credits, may say anything); the rest is checked on each read.
                guard slot.offset >= BucketFileHeader.size, slot.length >= RecordHeader.size, slot.offset + slot.length <= fileSize
                else { return nil }
                slots[n] = slot
                live += 1
                liveBytes += slot.length
            }
            guard live == Int(u64(56)), liveBytes == Int(u64(32)) else { return nil }
            return IndexSnapshot(
                bucketIndex: Int(u32(8)), bucketCount: Int(u32(12)), seed: u64(16), fileSize: fileSize,
                liveBytes: liveBytes, maximumSequence: u64(40), slots: slots, liveCount: live)
        }
    }
}
