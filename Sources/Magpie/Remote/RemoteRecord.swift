
// What the cache keeps in its remote tier, byte by byte.
//
// Logical keys (the store puts its namespace in front): one tag byte, then the rest.
//   "k" + key         a record (below)
//   "g" + group name  the group's token: 8 bytes, little endian, never 0
//   "a"               the namespace's token: 8 bytes, little endian, never 0
//   "l" + key         the key's load lease (Tiers/RemotePolicy+Lease.swift): a token, with an expiry
//   "h" + …           the store's own (MagpieRedis: its change-feed heartbeats); the cache ignores them
//
// Every value the cache writes under "k" + key is *versioned*: it starts with the 10-byte fence the
// store compares (RemoteStore.storeIfNewer): "MV", then the version, 8 bytes big endian (a hybrid
// logical clock: wall ms in the top 48 bits, a counter in the low 16; see HybridClock.swift).
//
// A record (after the fence; integers little endian, offsets from the value's start):
//   10  "MR" (2 bytes), format version (1 byte, = 4), flags (1 byte: RecordFlags, the disk record's own
//       flags byte; here memoryPolicy, diskOnly, memoryOnly, freshness, negative, never stamp or version)
//   14  group length (u16), origin (u16: a random tag of the instance that wrote it, never 0; 0 in
//       format 3, which is read as well)
//   18  value length (u32)
//   22  hard expiry (i64, ms since 1970, 0 none)
//   30  namespace token (u64)                          38  group token (u64, 0 without a group)
//   46  group bytes, then the metadata blocks the flags announce (EntryMetadata's encoding, the same
//       bytes the disk record has after its group: memory policy i64, fresh until and loaded at i64),
//       then the value bytes
//  end  checksum (u64): XXH3-64 of the value's bytes before it (fence included), seeded with XXH3-64
//       of the logical key
//
// Format 2 (before the metadata encoding was shared with the disk record: every field at a fixed
// offset, 24 bytes more per record) is not read: such a record is foreign, a miss.
//
// A tombstone (a removal, kept for RemoteTierOptions.tombstoneLifetime): the fence, then "MT". It
// reads as a miss; its only job is to make every older write of the key refused.
//
// The checksum covers the key, so a record copied under another key is as foreign as a torn or
// corrupt one: every such record is a miss (counted), never a value. A record is current only while
// both tokens equal the ones stored under "a" and "g" + group: replacing a token removes every record
// written under the old one, in one write (see Remote/RemoteTier.swift).

enum RemoteKey {
    static let record: UInt8 = 0x6B  // "k"
    static let group: UInt8 = 0x67  // "g"
    static let namespace: UInt8 = 0x61  // "a"
    static let storeOwn: UInt8 = 0x68  // "h"
    static let lease: UInt8 = 0x6C  // "l"

    static func tagged(_ tag: UInt8, _ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var key = [UInt8]()
        key.reserveCapacity(bytes.count + 1)
        key.append(tag)
        key.append(contentsOf: bytes)
        return key
    }

    static func group(_ name: String) -> [UInt8] { [group] + Array(name.utf8) }
    static let namespaceKey: [UInt8] = [namespace]
}

struct RemoteRecord: Sendable, Equatable {
    var value: [UInt8]
    var expiresAt: Int64 = 0
    /// The entry's memory policy, freshness and tiers (``EntryMetadata``; its stamp is always 0 here: a
    /// stamp is one instance's knowledge of its own copy).
    var metadata = EntryMetadata()
    var group: String? = nil
    var namespaceToken: UInt64 = 0
    var groupToken: UInt64 = 0
    /// The write's version (the fence the store compares); 0 until the write is given one.
    var version: UInt64 = 0
    /// The writing instance's tag (``RemoteTier/originTag``), 0 when unknown.
    var origin: UInt16 = 0

    init(value: [UInt8], expiresAt: Int64 = 0, memoryPolicy: Int64 = 0, freshness: Freshness = .none,
         tiers: Tiers = .memoryAndDisk, group: String? = nil) {
        self.value = value
        self.expiresAt = expiresAt
        self.metadata = EntryMetadata(memoryPolicy: memoryPolicy, tiers: tiers, freshness: freshness)
        self.group = group
    }

    var memoryPolicy: Int64 { metadata.memoryPolicy }
    var freshness: Freshness { metadata.freshness }
    var tiers: Tiers { metadata.tiers }

    /// The fence: "MV" and the version.
    static let fenceSize = 10
    static let headerSize = fenceSize + 36
    static let version: UInt8 = 4

    /// What a versioned value under "k" + key holds.
    enum Decoded: Equatable {
        case record(RemoteRecord)
        /// A removal's tombstone, with its version.
        case tombstone(UInt64)
    }

    /// The record's bytes for `key` (the logical key it is stored under), its fence first.
    func encoded(key: [UInt8]) -> [UInt8] {
        let groupBytes = Array((group ?? "").utf8)
        let flags = metadata.flags.intersection(.remote)
        let blocks = EntryMetadata.blocksLength(flags)
        var bytes = [UInt8]()
        bytes.reserveCapacity(Self.headerSize + groupBytes.count + blocks + value.count + 8)
        Self.appendFence(version, to: &bytes)
        bytes += [0x4D, 0x52, Self.version, flags.rawValue]
        Self.append(UInt16(truncatingIfNeeded: groupBytes.count), to: &bytes)
        Self.append(origin, to: &bytes)
        Self.append(UInt32(truncatingIfNeeded: value.count), to: &bytes)
        Self.append(expiresAt, to: &bytes)
        Self.append(namespaceToken, to: &bytes)
        Self.append(groupToken, to: &bytes)
        bytes += groupBytes
        let blocksAt = bytes.count
        bytes += repeatElement(0, count: blocks)
        bytes.withUnsafeMutableBytes { metadata.writeBlocks(flags, to: $0.baseAddress! + blocksAt) }
        bytes += value
        Self.append(Self.checksum(bytes, key: key), to: &bytes)
        return bytes
    }

    /// A tombstone of version `version`.
    static func tombstone(version: UInt64) -> [UInt8] {
        var bytes = [UInt8]()
        bytes.reserveCapacity(fenceSize + 2)
        appendFence(version, to: &bytes)
        bytes += [0x4D, 0x54]
        return bytes
    }

    /// The version in a versioned value's fence, nil for bytes that carry none.
    static func fenceVersion(_ bytes: [UInt8]) -> UInt64? {
        guard bytes.count >= fenceSize, bytes[0] == 0x4D, bytes[1] == 0x56 else { return nil }
        return bytes.withUnsafeBytes { UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 2, as: UInt64.self)) }
    }

    /// What `bytes` stored under `key` hold, or nil when they are neither a record nor a tombstone: too
    /// short or long, another format or version, unknown flags (or both one-tier flags), lengths that do
    /// not add up, a group name that is not UTF-8, or a checksum that does not match (torn, corrupt, or
    /// copied from another key).
    static func decode(_ bytes: [UInt8], key: [UInt8]) -> Decoded? {
        guard let version = fenceVersion(bytes) else { return nil }
        if bytes.count == fenceSize + 2 {
            return bytes[fenceSize] == 0x4D && bytes[fenceSize + 1] == 0x54 ? .tombstone(version) : nil
        }
        let base = fenceSize
        guard bytes.count >= headerSize + 8, bytes[base] == 0x4D, bytes[base + 1] == 0x52,
            bytes[base + 2] == Self.version || bytes[base + 2] == 3
        else { return nil }
        let flags = RecordFlags(rawValue: bytes[base + 3])
        guard RecordFlags.remote.isSuperset(of: flags), !flags.isSuperset(of: [.diskOnly, .memoryOnly]) else { return nil }
        let groupLength = Int(load(UInt16.self, bytes, base + 4))
        let valueLength = Int(load(UInt32.self, bytes, base + 8))
        let blocks = EntryMetadata.blocksLength(flags)
        let origin = load(UInt16.self, bytes, base + 6)
        guard bytes[base + 2] == Self.version || origin == 0, headerSize + groupLength + blocks + valueLength + 8 == bytes.count
        else { return nil }
        let end = bytes.count - 8
        guard load(UInt64.self, bytes, end) == bytes.withUnsafeBytes({ checksum(UnsafeRawBufferPointer(rebasing: $0[..<end]), key: key) })
        else { return nil }
        let blocksAt = headerSize + groupLength
        var record = RemoteRecord(value: Array(bytes[(blocksAt + blocks)..<end]))
        if groupLength > 0 {
            guard let name = String(validating: bytes[headerSize..<blocksAt], as: UTF8.self) else { return nil }
            record.group = name
        }
        record.version = version
        record.origin = origin
        record.expiresAt = load(Int64.self, bytes, base + 12)
        record.metadata = bytes.withUnsafeBytes { EntryMetadata(flags: flags, blocks: $0.baseAddress! + blocksAt) }
        record.namespaceToken = load(UInt64.self, bytes, base + 20)
        record.groupToken = load(UInt64.self, bytes, base + 28)
        return .record(record)
    }

    private static func appendFence(_ version: UInt64, to bytes: inout [UInt8]) {
        bytes += [0x4D, 0x56]
        withUnsafeBytes(of: version.bigEndian) { bytes.append(contentsOf: $0) }
    }

    /// A token stored under "a" or "g" + name: exactly 8 bytes, never 0 (anything else: no token).
    static func token(_ bytes: [UInt8]?) -> UInt64 {
        guard let bytes, bytes.count == 8 else { return 0 }
        return load(UInt64.self, bytes, 0)
    }

    static func tokenBytes(_ token: UInt64) -> [UInt8] {
        var bytes = [UInt8]()
        append(token, to: &bytes)
        return bytes
    }

    /// A fresh token: random, never 0.
    static func newToken() -> UInt64 { UInt64.random(in: 1...UInt64.max) }

    private static func checksum(_ bytes: [UInt8], key: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { checksum($0, key: key) }
    }

    private static func checksum(_ body: UnsafeRawBufferPointer, key: [UInt8]) -> UInt64 {
        key.withUnsafeBytes { KeyHash.checksum(header: $0, body: body) }
    }

    private static func append<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    /// The integer at `offset` (the caller checked that `bytes` holds it).
    private static func load<T: FixedWidthInteger>(_ type: T.Type, _ bytes: [UInt8], _ offset: Int) -> T {
        bytes.withUnsafeBytes { T(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: T.self)) }
    }
}
