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
    /// An 8-byte version (u64: the remote write a cache with a remote tier holds a copy of) follows the
    /// stamp. A cache without a remote tier ignores it.
    package static let version = RecordFlags(rawValue: 64)
    /// The flags a disk record may carry.
    package static let all: RecordFlags = [.memoryPolicy, .diskOnly, .freshness, .negative, .stamp, .version]
    /// The flags a remote record may carry (never both `diskOnly` and `memoryOnly`).
    package static let remote: RecordFlags = [.memoryPolicy, .diskOnly, .memoryOnly, .freshness, .negative]
}

/// How a record's payload is stored.
package enum Codec: UInt8 {
    case raw = 0
    case zstd = 1
}

/// A record's 64-byte header (layout in OnDiskFormat.swift).
///
/// Two checks protect a record: the *payload hash* (XXH3-64 of the stored payload, in the header) and the
/// *checksum* (XXH3-64 of the key, group and metadata blocks, seeded with XXH3-64 of header bytes 4..<56,
/// which include the payload hash). So the part a lookup needs — header, key, group, metadata — verifies
/// on its own, without the payload; a read copies the payload once, straight into the array it returns,
/// and hashes that copy; and a record re-stamped with a new sequence number (when its bucket writes it, or
/// reinserts it into a newer region) costs one hash of its first bytes, not of its payload.
package struct RecordHeader: Equatable {
    package static let size = 64
    package static let magic: UInt32 = 0x5250_474D  // "MGPR"
    package static let formatVersion: UInt8 = 2

    package var kind: RecordKind
    package var codec: Codec
    package var keyLength: Int
    package var groupLength: Int
    package var storedLength: Int
    package var originalLength: Int
    /// For a value: its deadline in ms since 1970 (0: never). For a tombstone or group tombstone: the
    /// sequence number below which it removes records (see OnDiskFormat.swift, "Tombstones").
    package var expiry: Int64
    package var sequence: UInt64
    package var keyHash: UInt64
    /// XXH3-64 (seed 0) of the stored payload.
    package var payloadHash: UInt64 = 0
    package var flags: RecordFlags = []

    package init(
        kind: RecordKind, codec: Codec, keyLength: Int, groupLength: Int, storedLength: Int, originalLength: Int,
        expiry: Int64, sequence: UInt64, keyHash: UInt64, payloadHash: UInt64 = 0, flags: RecordFlags = []
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
        self.payloadHash = payloadHash
        self.flags = flags
    }

    /// Key, group, metadata blocks and payload.
    // (Wrapping sums: each length is at most a u32 field's, so none can overflow, and the checks cost every
    // read of a record a few instructions each time an offset is computed.)
    package var bodyLength: Int {
        @inline(__always) get { keyLength &+ groupLength &+ EntryMetadata.blocksLength(flags) &+ storedLength }
    }
    /// The record's length on disk, padding included.
    package var recordLength: Int {
        @inline(__always) get { (Self.size &+ bodyLength &+ 7) & ~7 }
    }
    package var keyOffset: Int { Self.size }
    package var groupOffset: Int { Self.size &+ keyLength }
    package var groupEnd: Int { Self.size &+ keyLength &+ groupLength }
    /// Where the metadata blocks start (``EntryMetadata``'s encoding: policy, freshness, stamp).
    package var metadataOffset: Int { groupEnd }
    /// Where the payload starts: the header, key, group and metadata before it are what the checksum
    /// covers.
    package var payloadOffset: Int {
        @inline(__always) get { groupEnd &+ EntryMetadata.blocksLength(flags) }
    }
    /// For a tombstone or group tombstone: the sequence number below which it removes records.
    package var covers: UInt64 { UInt64(bitPattern: expiry) }

    /// The record length of an entry with these lengths (`policy`: the memory policy, freshness and
    /// stamp blocks together).
    package static func recordLength(key: Int, group: Int, stored: Int, policy: Int = 0) -> Int {
        (size + key + group + policy + stored + 7) & ~7
    }

    /// Writes bytes 0..<56 (everything before the checksum).
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
        raw.storeBytes(of: payloadHash.littleEndian, toByteOffset: 48, as: UInt64.self)
    }

    /// Parses and range-checks a header (neither the checksum nor the payload hash). Nil when any field is
    /// out of range.
    package static func decode(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
        guard bytes.count >= size, UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic,
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
            payloadHash: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 48, as: UInt64.self)),
            flags: RecordFlags(rawValue: bytes[7]))
        if kind != .value && !header.flags.isEmpty { return nil }
        switch kind {
        case .value:
            if codec == .raw && header.storedLength != header.originalLength { return nil }
            if header.flags.contains(.negative) && (codec != .raw || header.storedLength != 0) { return nil }
        case .tombstone:
            if header.storedLength != 0 || header.groupLength != 0 || header.originalLength != 0 { return nil }
        case .groupTombstone:
            if header.storedLength != 0 || header.keyLength != 0 || header.groupLength == 0 || header.originalLength != 0 {
                return nil
            }
        }
        if codec == .zstd && header.storedLength == 0 { return nil }
        return header
    }

    /// Whole records, sealed: for tests and the fuzz harness (the tier writes records where they go, see
    /// ``RecordDraft``).
    package static func makeRecord(
        _ header: RecordHeader, key: UnsafeRawBufferPointer, group: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer, memoryPolicy: Int64 = 0, freshUntil: Int64 = 0, loadedAt: Int64 = 0, stamp: Int64 = 0
    ) -> [UInt8] {
        let metadata = EntryMetadata(
            memoryPolicy: memoryPolicy, freshness: Freshness(freshUntil: freshUntil, loadedAt: loadedAt), stamp: stamp)
        return makeRecord(header, key: key, group: group, payload: payload, metadata: metadata)
    }

    /// A whole record with `metadata`'s blocks (those `header.flags` announce), sealed with
    /// `header.sequence` (its payload hash computed here).
    package static func makeRecord(
        _ header: RecordHeader, key: UnsafeRawBufferPointer, group: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer, metadata: EntryMetadata
    ) -> [UInt8] {
        var record = RecordDraft(header: header, key: key, group: group, payload: payload, metadata: metadata).makeUnsealed()
        record.withUnsafeMutableBytes { raw in
            sealPayload(raw)
            seal(raw, sequence: header.sequence)
        }
        return record
    }

    /// The metadata of a validated value record (its flags and the blocks after its group).
    package static func metadata(of record: UnsafeRawBufferPointer, _ header: RecordHeader) -> EntryMetadata {
        EntryMetadata(flags: header.flags, blocks: record.baseAddress! + header.metadataOffset)
    }

    /// The checksum of a record whose first `header.payloadOffset` bytes are `prefix` (see the type's
    /// comment): header bytes 4..<56 seed a hash of key, group and metadata.
    @inline(__always)
    package static func checksum(ofPrefix prefix: UnsafeRawBufferPointer, _ header: RecordHeader) -> UInt64 {
        KeyHash.checksum(
            header: UnsafeRawBufferPointer(rebasing: prefix[4..<56]),
            body: UnsafeRawBufferPointer(rebasing: prefix[size..<header.payloadOffset]))
    }

    /// Validates the part of a record before its payload: structure and checksum. `prefix` holds at
    /// least the header; nil when it holds less than `header.payloadOffset` bytes. The payload is checked
    /// apart (``payloadMatches(_:_:)``).
    @inline(__always)
    package static func validatePrefix(_ prefix: UnsafeRawBufferPointer) -> RecordHeader? {
        guard let header = decode(prefix), header.payloadOffset <= prefix.count else { return nil }
        let stored = UInt64(littleEndian: prefix.loadUnaligned(fromByteOffset: 56, as: UInt64.self))
        return checksum(ofPrefix: prefix, header) == stored ? header : nil
    }

    /// Whether `payload` is the payload `header` describes (its length and hash).
    @inline(__always)
    package static func payloadMatches(_ payload: UnsafeRawBufferPointer, _ header: RecordHeader) -> Bool {
        payload.count == header.storedLength && KeyHash.payloadHash(payload) == header.payloadHash
    }

    /// Validates the record that starts `bytes` (which may run past it): structure, bounds, checksum and
    /// payload hash.
    @inline(__always)
    package static func validate(_ bytes: UnsafeRawBufferPointer) -> RecordHeader? {
        guard let header = validatePrefix(bytes), size + header.bodyLength <= bytes.count else { return nil }
        let payload = UnsafeRawBufferPointer(rebasing: bytes[header.payloadOffset..<(header.payloadOffset + header.storedLength)])
        return payloadMatches(payload, header) ? header : nil
    }

    /// Sets the payload hash of an unsealed record (`record` holds it whole, its header already encoded).
    package static func sealPayload(_ record: UnsafeMutableRawBufferPointer) {
        let stored = Int(UInt32(littleEndian: record.loadUnaligned(fromByteOffset: 12, as: UInt32.self)))
        let flags = RecordFlags(rawValue: record[7])
        let keyLength = Int(UInt16(littleEndian: record.loadUnaligned(fromByteOffset: 8, as: UInt16.self)))
        let groupLength = Int(UInt16(littleEndian: record.loadUnaligned(fromByteOffset: 10, as: UInt16.self)))
        let start = size + keyLength + groupLength + EntryMetadata.blocksLength(flags)
        let hash = KeyHash.payloadHash(UnsafeRawBufferPointer(rebasing: record[start..<(start + stored)]))
        record.storeBytes(of: hash.littleEndian, toByteOffset: 48, as: UInt64.self)
    }

    /// Stamps a record whose payload hash is set with `sequence` (for a tombstone or group tombstone
    /// whose cover is 0, also as its cover) and writes its checksum: the record's first bytes are hashed,
    /// never its payload. `record` holds at least the part before the payload.
    package static func seal(_ record: UnsafeMutableRawBufferPointer, sequence: UInt64) {
        record.storeBytes(of: sequence.littleEndian, toByteOffset: 32, as: UInt64.self)
        if record[5] != RecordKind.value.rawValue && record.loadUnaligned(fromByteOffset: 24, as: UInt64.self) == 0 {
            record.storeBytes(of: sequence.littleEndian, toByteOffset: 24, as: UInt64.self)
        }
        let flags = RecordFlags(rawValue: record[7])
        let keyLength = Int(UInt16(littleEndian: record.loadUnaligned(fromByteOffset: 8, as: UInt16.self)))
        let groupLength = Int(UInt16(littleEndian: record.loadUnaligned(fromByteOffset: 10, as: UInt16.self)))
        let end = size + keyLength + groupLength + EntryMetadata.blocksLength(flags)
        let sum = KeyHash.checksum(
            header: UnsafeRawBufferPointer(rebasing: record[4..<56]), body: UnsafeRawBufferPointer(rebasing: record[size..<end]))
        record.storeBytes(of: sum.littleEndian, toByteOffset: 56, as: UInt64.self)
    }
}

/// A record about to be stored: its header (the sequence number and the payload hash are filled in
/// when the bucket writes it to its file), where its key, group and payload bytes are, and its metadata
/// (written as the header's flags say). A store writes it, unsealed, into its bucket's memtable
/// (Disk/Memtable.swift); the bucket seals it when it writes it (Disk/Bucket+Seal.swift).
struct RecordDraft {
    var header: RecordHeader
    var key: UnsafeRawBufferPointer
    var group: UnsafeRawBufferPointer
    var payload: UnsafeRawBufferPointer
    var metadata = EntryMetadata()

    /// The record's length.
    var length: Int { header.recordLength }

    /// Writes the record, unsealed (sequence, payload hash and checksum as `header` has them, normally
    /// 0), into `destination` (exactly ``length`` bytes): header, key, group, memory policy, freshness
    /// and stamp (when the flags say so), payload, zero padding.
    func write(into destination: UnsafeMutableRawBufferPointer) {
        let base = destination.baseAddress!
        header.encode(into: base)
        base.storeBytes(of: UInt64(0), toByteOffset: 56, as: UInt64.self)
        copyBytes(key, to: base + header.keyOffset)
        copyBytes(group, to: base + header.groupOffset)
        metadata.writeBlocks(header.flags, to: base + header.metadataOffset)
        copyBytes(payload, to: base + header.payloadOffset)
        let end = header.payloadOffset + payload.count
        (base + end).initializeMemory(as: UInt8.self, repeating: 0, count: header.recordLength - end)
    }

    /// The unsealed record in a new array.
    func makeUnsealed() -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            write(into: UnsafeMutableRawBufferPointer(buffer))
            initialized = length
        }
    }
}
