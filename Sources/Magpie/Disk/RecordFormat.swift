// MARK: - On-disk record format (format version 1)
//
// A bucket file is a 32-byte file header followed by records, each starting on an 8-byte boundary.
// All integers are little-endian.
//
// File header (32 bytes):
//   0  u32 magic "MGPB"        4  u32 format version (1)   8  u32 bucket index   12 u32 bucket count
//   16 u64 hash seed           24 u64 checksum: XXH3-64 of bytes 0..<24
//
// Record header (56 bytes), then key, group, the optional 8-byte memory policy and payload bytes, then
// zero padding to a multiple of 8:
//   0  u32 magic "MGPR", or "DEAD" once the record is superseded or removed (see below)
//   4  u8  format version (1)
//   5  u8  kind: 1 value, 2 tombstone (deletes the key), 3 group tombstone (deletes the group's
//          records written before it; the group name is in the group field, the key is empty)
//   6  u8  codec: 0 raw, 1 zstd (one frame)
//   7  u8  flags (value records only, else 0): bit 0 = an 8-byte memory policy follows the group
//          (i64: 0 none, > 0 an absolute memory deadline in ms, < 0 minus a memory lifetime in ms; the
//          `Cache` re-applies it when it promotes the entry into memory); bit 1 = disk only (never
//          promoted into memory). Other bits 0. Records written by `DiskTier` alone have flags 0.
//   8  u16 key length          10 u16 group length         12 u32 stored (payload) length
//   16 u32 original value length (= stored for raw)         20 u32 reserved, 0
//   24 i64 expiry, milliseconds since 1970 (0 = never)      32 u64 sequence number
//   40 u64 key hash (XXH3-64 of the key with the cache's seed; picks the bucket)
//   48 u64 checksum: XXH3-64 of key ‖ group ‖ memory policy ‖ payload, seeded with XXH3-64 of header
//          bytes 4..<48
//
// Dead records. When a key's record is superseded (a newer value) or removed (remove, group removal),
// its magic is overwritten with "DEAD" in place. The checksum leaves the magic out, so a dead record
// still parses and recovery steps over it; but it is never applied. So at most one record per key is
// live in a file, and losing a later record to corruption (a tombstone, a newer value) can only lose
// that key, never bring back a removed or older value. Tombstones are still written: marking is
// best-effort (a failed mark is harmless while the tombstone survives) and covers records that are
// no longer indexed (evicted ones).
//
// A record is valid when every field is in range, it lies wholly inside the file, the checksum
// matches, its key hash is the hash of its key, and that hash belongs to the file's bucket. Within a
// bucket, a later record overrides an earlier one for the same key: file order is the truth, and the
// sequence numbers (assigned under the bucket's lock) agree with it.

/// What a record says.
enum RecordKind: UInt8 {
    case value = 1
    case tombstone = 2
    case groupTombstone = 3
}

/// Per-record flags (header byte 7), for value records.
struct RecordFlags: OptionSet, Equatable {
    var rawValue: UInt8
    /// An 8-byte memory policy sits between the group and the payload.
    static let memoryPolicy = RecordFlags(rawValue: 1)
    /// The entry lives on disk only: a read never promotes it into memory.
    static let diskOnly = RecordFlags(rawValue: 2)
    static let all: RecordFlags = [.memoryPolicy, .diskOnly]
}

/// How a record's payload is stored.
enum Codec: UInt8 {
    case raw = 0
    case zstd = 1
}

struct RecordHeader: Equatable {
    static let size = 56
    static let magic: UInt32 = 0x5250_474D  // "MGPR"
    static let deadMagic: UInt32 = 0x4441_4544  // "DEAD"
    static let formatVersion: UInt8 = 1

    var kind: RecordKind
    var codec: Codec
    var keyLength: Int
    var groupLength: Int
    var storedLength: Int
    var originalLength: Int
    var expiry: Int64
    var sequence: UInt64
    var keyHash: UInt64
    /// Whether the magic says "DEAD" (superseded or removed).
    var isDead = false
    var flags: RecordFlags = []

    /// Bytes of the optional memory policy.
    var policyLength: Int { flags.contains(.memoryPolicy) ? 8 : 0 }
    var bodyLength: Int { keyLength + groupLength + policyLength + storedLength }
    /// The record's length on disk, padding included.
    var recordLength: Int { (Self.size + bodyLength + 7) & ~7 }
    var keyOffset: Int { Self.size }
    var groupOffset: Int { Self.size + keyLength }
    var groupEnd: Int { Self.size + keyLength + groupLength }
    var policyOffset: Int { groupEnd }
    var payloadOffset: Int { groupEnd + policyLength }

    /// The record length of an entry with these lengths.
    static func recordLength(key: Int, group: Int, stored: Int, policy: Int = 0) -> Int {
        (size + key + group + policy + stored + 7) & ~7
    }

    /// Writes the 48 bytes before the checksum.
    func encode(into raw: UnsafeMutableRawPointer) {
        raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
        raw.storeBytes(of: Self.formatVersion, toByteOffset: 4, as: UInt8.self)
        raw.storeBytes(of: kind.rawValue, toByteOffset: 5, as: UInt8.self)
        raw.storeBytes(of: codec.rawValue, toByteOffset: 6, as: UInt8.self)
        raw.storeBytes(of: flags.rawValue, toByteOffset: 7, as: UInt8.self)
        raw.storeBytes(of: UInt16(keyLength).littleEndian, toByteOffset: 8, as: UInt16.self)
        raw.storeBytes(of: UInt16(groupLength).littleEndian, toByteOffset: 10, as: UInt16.self)
        raw.storeBytes(of: UInt32(storedLength).littleEndian, toByteOffset: 12, as: UInt32.self)
        raw.storeBytes(of: UInt32(originalLength).littleEndian, toByteOffset: 16, as: UInt32.self)
        raw.storeBytes(of: UInt32(0), toByteOffset: 20, as: UInt32.self)
        raw.storeBytes(of: expiry.littleEndian, toByteOffset: 24, as: Int64.self)
        raw.storeBytes(of: sequence.littleEndian, toByteOffset: 32, as: UInt64.self)
        raw.storeBytes(of: keyHash.littleEndian, toByteOffset: 40, as: UInt64.self)
    }

    /// Parses and range-checks a header (not the checksum). Nil when any field is out of range.
    static func decode(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
        let recordMagic = bytes.count >= size ? UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) : 0
        guard recordMagic == magic || recordMagic == deadMagic,
            bytes[4] == formatVersion, RecordFlags.all.isSuperset(of: RecordFlags(rawValue: bytes[7])),
            bytes.loadUnaligned(fromByteOffset: 20, as: UInt32.self) == 0,
            let kind = RecordKind(rawValue: bytes[5]), let codec = Codec(rawValue: bytes[6])
        else { return nil }
        let header = RecordHeader(
            kind: kind, codec: codec,
            keyLength: Int(UInt16(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt16.self))),
            groupLength: Int(UInt16(littleEndian: bytes.loadUnaligned(fromByteOffset: 10, as: UInt16.self))),
            storedLength: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self))),
            originalLength: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt32.self))),
            expiry: Int64(littleEndian: bytes.loadUnaligned(fromByteOffset: 24, as: Int64.self)),
            sequence: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 32, as: UInt64.self)),
            keyHash: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 40, as: UInt64.self)),
            isDead: recordMagic == deadMagic, flags: RecordFlags(rawValue: bytes[7]))
        if kind != .value && !header.flags.isEmpty { return nil }
        switch kind {
        case .value:
            if codec == .raw && header.storedLength != header.originalLength { return nil }
        case .tombstone:
            if header.storedLength != 0 || header.groupLength != 0 { return nil }
        case .groupTombstone:
            if header.storedLength != 0 || header.keyLength != 0 || header.groupLength == 0 { return nil }
        }
        if codec == .zstd && header.storedLength == 0 { return nil }
        return header
    }

    /// Builds a whole record: header, key, group, memory policy (when the flags say so), payload,
    /// padding, and, when `sealed`, the checksum. The disk tier's writes pass `sealed: false`: the
    /// append stamps the sequence number and seals then (one checksum per write, not two); the
    /// checksum field is zero until then.
    static func makeRecord(
        _ header: RecordHeader, key: UnsafeRawBufferPointer, group: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer, memoryPolicy: Int64 = 0, sealed: Bool = true
    ) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: header.recordLength) { buffer, initialized in
            let raw = UnsafeMutableRawBufferPointer(buffer)
            // Zero all but the payload (which is copied over): header gaps, checksum field, padding.
            let payloadEnd = header.payloadOffset + payload.count
            UnsafeMutableRawBufferPointer(rebasing: raw[..<header.payloadOffset]).initializeMemory(as: UInt8.self, repeating: 0)
            UnsafeMutableRawBufferPointer(rebasing: raw[payloadEnd...]).initializeMemory(as: UInt8.self, repeating: 0)
            header.encode(into: raw.baseAddress!)
            if !key.isEmpty { (raw.baseAddress! + header.keyOffset).copyMemory(from: key.baseAddress!, byteCount: key.count) }
            if !group.isEmpty {
                (raw.baseAddress! + header.groupOffset).copyMemory(from: group.baseAddress!, byteCount: group.count)
            }
            if header.policyLength != 0 {
                raw.storeBytes(of: memoryPolicy.littleEndian, toByteOffset: header.policyOffset, as: Int64.self)
            }
            if !payload.isEmpty {
                (raw.baseAddress! + header.payloadOffset).copyMemory(from: payload.baseAddress!, byteCount: payload.count)
            }
            initialized = header.recordLength
            if sealed { sealChecksum(UnsafeMutableRawBufferPointer(rebasing: raw[..<header.recordLength]), header) }
        }
    }

    /// Stores `sequence` into an encoded record and recomputes its checksum.
    static func setSequence(_ sequence: UInt64, in record: UnsafeMutableRawBufferPointer, _ header: RecordHeader) {
        record.storeBytes(of: sequence.littleEndian, toByteOffset: 32, as: UInt64.self)
        sealChecksum(record, header)
    }

    private static func sealChecksum(_ record: UnsafeMutableRawBufferPointer, _ header: RecordHeader) {
        let sum = checksum(of: UnsafeRawBufferPointer(record), header)
        record.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self)
    }

    static func checksum(of record: UnsafeRawBufferPointer, _ header: RecordHeader) -> UInt64 {
        KeyHash.checksum(
            header: UnsafeRawBufferPointer(rebasing: record[4..<48]),
            body: UnsafeRawBufferPointer(rebasing: record[size..<(size + header.bodyLength)]))
    }

    /// Validates the record that starts `bytes` (which may run past it): structure, bounds, checksum.
    static func validate(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
        guard let header = decode(bytes), size + header.bodyLength <= bytes.count else { return nil }
        let stored = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
        return checksum(of: bytes, header) == stored ? header : nil
    }
}

/// The 32-byte header of a bucket file.
struct BucketFileHeader: Equatable {
    static let size = 32
    static let magic: UInt32 = 0x4250_474D  // "MGPB"
    static let formatVersion: UInt32 = 1

    var bucketIndex: Int
    var bucketCount: Int
    var seed: UInt64

    func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.size)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.formatVersion.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            let sum = KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: raw[0..<24]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 24, as: UInt64.self)
        }
        return bytes
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) -> BucketFileHeader? {
        guard bytes.count >= size,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic,
            UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) == formatVersion,
            UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
                == KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: bytes[0..<24]))
        else { return nil }
        return BucketFileHeader(
            bucketIndex: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self))),
            bucketCount: Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self))),
            seed: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self)))
    }
}
