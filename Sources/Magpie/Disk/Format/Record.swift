// The record: its header's fields, parsing with range checks, and the one writer (`RecordDraft`). The
// byte layout is described once, in OnDiskFormat.swift.

/// What a record says.
package enum RecordKind: UInt8 {
    case value = 1
    case tombstone = 2
    case groupTombstone = 3
}

/// Per-record flags (header byte 7), for value records: which of the metadata blocks
/// (``EntryMetadata``'s encoding, shared with the remote record) follow the group, and the flags without
/// a block.
package struct RecordFlags: OptionSet, Equatable {
    package var rawValue: UInt8
    package init(rawValue: UInt8) { self.rawValue = rawValue }
    /// An 8-byte memory policy sits between the group and the payload.
    package static let memoryPolicy = RecordFlags(rawValue: 1)
    /// The entry lives on disk only: a read never promotes it into memory.
    package static let diskOnly = RecordFlags(rawValue: 2)
    /// A 16-byte freshness block (fresh-until and loaded-at, i64 ms each) follows the memory policy.
    package static let freshness = RecordFlags(rawValue: 4)
    /// The record remembers that the loader found no value (negative caching): the payload is empty
    /// and the key reads as absent through every API but the loader's.
    package static let negative = RecordFlags(rawValue: 8)
    /// An 8-byte coherence stamp (i64 ms: when a cache with a remote tier last knew the copy current)
    /// follows the freshness block. A cache without a remote tier ignores it.
    package static let stamp = RecordFlags(rawValue: 16)
    /// The entry lives in memory only: in remote records only (the disk tier never holds such an entry).
    package static let memoryOnly = RecordFlags(rawValue: 32)
    /// The flags a disk record may carry.
    package static let all: RecordFlags = [.memoryPolicy, .diskOnly, .freshness, .negative, .stamp]
    /// The flags a remote record may carry (never both `diskOnly` and `memoryOnly`).
    package static let remote: RecordFlags = [.memoryPolicy, .diskOnly, .memoryOnly, .freshness, .negative]
}

/// How a record's payload is stored.
package enum Codec: UInt8 {
    case raw = 0
    case zstd = 1
}

package struct RecordHeader: Equatable {
    package static let size = 56
    package static let magic: UInt32 = 0x5250_474D  // "MGPR"
    package static let deadMagic: UInt32 = 0x4441_4544  // "DEAD"
    package static let formatVersion: UInt8 = 1

    package var kind: RecordKind
    package var codec: Codec
    package var keyLength: Int
    package var groupLength: Int
    package var storedLength: Int
    package var originalLength: Int
    package var expiry: Int64
    package var sequence: UInt64
    package var keyHash: UInt64
    /// Whether the magic says "DEAD" (superseded or removed).
    package var isDead = false
    package var flags: RecordFlags = []

    package init(
        kind: RecordKind, codec: Codec, keyLength: Int, groupLength: Int, storedLength: Int, originalLength: Int,
        expiry: Int64, sequence: UInt64, keyHash: UInt64, isDead: Bool = false, flags: RecordFlags = []
    ) {
        self.kind = kind
        self.codec = codec
        self.keyLength = keyLength
        self.groupLength = groupLength
        self.storedLength = storedLength
        self.originalLength = originalLength
        self.expiry = expiry
        self.sequence = sequence
        self.keyHash = keyHash
        self.isDead = isDead
        self.flags = flags
    }

    package var bodyLength: Int {
        @inline(__always) get { keyLength + groupLength + EntryMetadata.blocksLength(flags) + storedLength }
    }
    /// The record's length on disk, padding included.
    package var recordLength: Int {
        @inline(__always) get { (Self.size + bodyLength + 7) & ~7 }
    }
    package var keyOffset: Int { Self.size }
    package var groupOffset: Int { Self.size + keyLength }
    package var groupEnd: Int { Self.size + keyLength + groupLength }
    /// Where the metadata blocks start (``EntryMetadata``'s encoding: policy, freshness, stamp).
    package var metadataOffset: Int { groupEnd }
    package var payloadOffset: Int {
        @inline(__always) get { groupEnd + EntryMetadata.blocksLength(flags) }
    }

    /// The record length of an entry with these lengths (`policy`: the memory policy, freshness and
    /// stamp blocks together).
    package static func recordLength(key: Int, group: Int, stored: Int, policy: Int = 0) -> Int {
        (size + key + group + policy + stored + 7) & ~7
    }

    /// Writes the 48 bytes before the checksum.
    package func encode(into raw: UnsafeMutableRawPointer) {
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
    package static func decode(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
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
            if header.flags.contains(.negative) && (codec != .raw || header.storedLength != 0) { return nil }
        case .tombstone:
            if header.storedLength != 0 || header.groupLength != 0 { return nil }
        case .groupTombstone:
            if header.storedLength != 0 || header.keyLength != 0 || header.groupLength == 0 { return nil }
        }
        if codec == .zstd && header.storedLength == 0 { return nil }
        return header
    }

    /// A whole record, sealed with `header.sequence`: for tests and the fuzz harness (the tier writes
    /// records where they land, see ``RecordDraft``).
    package static func makeRecord(
        _ header: RecordHeader, key: UnsafeRawBufferPointer, group: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer, memoryPolicy: Int64 = 0, freshUntil: Int64 = 0, loadedAt: Int64 = 0, stamp: Int64 = 0
    ) -> [UInt8] {
        let metadata = EntryMetadata(
            memoryPolicy: memoryPolicy, freshness: Freshness(freshUntil: freshUntil, loadedAt: loadedAt), stamp: stamp)
        return makeRecord(header, key: key, group: group, payload: payload, metadata: metadata)
    }

    /// A whole record with `metadata`'s blocks (those `header.flags` announce).
    package static func makeRecord(
        _ header: RecordHeader, key: UnsafeRawBufferPointer, group: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer, metadata: EntryMetadata
    ) -> [UInt8] {
        RecordDraft(header: header, key: key, group: group, payload: payload, metadata: metadata).makeRecord(sequence: header.sequence)
    }

    /// The metadata of a validated value record (its flags and the blocks after its group).
    package static func metadata(of record: UnsafeRawBufferPointer, _ header: RecordHeader) -> EntryMetadata {
        EntryMetadata(flags: header.flags, blocks: record.baseAddress! + header.metadataOffset)
    }

    package static func checksum(of record: UnsafeRawBufferPointer, _ header: RecordHeader) -> UInt64 {
        KeyHash.checksum(
            header: UnsafeRawBufferPointer(rebasing: record[4..<48]),
            body: UnsafeRawBufferPointer(rebasing: record[size..<(size + header.bodyLength)]))
    }

    /// Validates the record that starts `bytes` (which may run past it): structure, bounds, checksum.
    @inline(__always)
    package static func validate(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
        guard let header = decode(bytes), size + header.bodyLength <= bytes.count else { return nil }
        let stored = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
        return checksum(of: bytes, header) == stored ? header : nil
    }
}

/// A record about to be appended: its header (the sequence number is the bucket's to assign), where its
/// key, group and payload bytes are, and its metadata (written as the header's flags say). The bucket
/// writes it where it lands (its write buffer, or a buffer for a write-through) and seals it there,
/// once: the checksum covers the sequence number, which is known only under the bucket's lock.
struct RecordDraft {
    var header: RecordHeader
    var key: UnsafeRawBufferPointer
    var group: UnsafeRawBufferPointer
    var payload: UnsafeRawBufferPointer
    var metadata = EntryMetadata()

    /// The record's length on disk.
    var length: Int { header.recordLength }

    /// Writes the sealed record, stamped with `sequence`, into `destination` (exactly ``length`` bytes):
    /// header, key, group, memory policy, freshness and stamp (when the flags say so), payload, zero padding,
    /// checksum.
    func write(into destination: UnsafeMutableRawBufferPointer, sequence: UInt64) {
        let base = destination.baseAddress!
        var header = self.header
        header.sequence = sequence
        header.encode(into: base)
        base.storeBytes(of: UInt64(0), toByteOffset: 48, as: UInt64.self)
        copyBytes(key, to: base + header.keyOffset)
        copyBytes(group, to: base + header.groupOffset)
        metadata.writeBlocks(header.flags, to: base + header.metadataOffset)
        copyBytes(payload, to: base + header.payloadOffset)
        let end = header.payloadOffset + payload.count
        (base + end).initializeMemory(as: UInt8.self, repeating: 0, count: header.recordLength - end)
        let sum = RecordHeader.checksum(of: UnsafeRawBufferPointer(destination), header)
        base.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self)
    }

    /// The sealed record in a new array.
    func makeRecord(sequence: UInt64) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            write(into: UnsafeMutableRawBufferPointer(buffer), sequence: sequence)
            initialized = length
        }
    }
}
