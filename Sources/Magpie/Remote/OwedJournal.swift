// MARK: - The journal of owed removals: what survives the process
//
// A cache with a disk tier and a remote tier keeps the removals it owes the remote store
// (OwedRemovals.swift) in `<directory>/OWED` as well as in memory, so that a process killed while the
// store is unreachable replays them when it opens the directory again. The format is the remote tier's;
// the disk tier only keeps the file's bytes within its budget (Disk/DiskTier+JournalFile.swift):
//
//   OWED:  "MGOW" (4 bytes), format (u32 LE, = 1); then entries, each:
//          length (u32 LE), payload (length bytes), checksum (u64 LE: XXH3-64 of the length and payload)
//   payload: kind (1 byte: 1 a key, 2 a group, 3 everything), the version of a key's tombstone (u64 LE;
//          0 otherwise), then the key's or group's bytes (OwedEntry)
//
// Appends reach the kernel at once (a killed process loses none; a power loss may, like every store
// until ``DiskTier/flush()``, which fsyncs this file too). A read stops at the first entry that does not
// check (a torn tail from a crash mid-append, or damage): what precedes it is returned. The whole file
// is replaced atomically when the queue is compacted, and removed when nothing is owed. An append that
// finds no room returns false: the remote tier then owes everything, one short entry.

/// Where a journal's bytes are kept: a file of the cache directory, held to a budget (the disk tier).
protocol JournalFile: Sendable {
    /// The file's bytes (empty: none).
    func readJournal() throws(MagpieError) -> [UInt8]
    /// Appends `bytes`, starting the file with `header` when it is shorter; false when they do not fit.
    func appendToJournal(_ bytes: [UInt8], header: [UInt8]) throws(MagpieError) -> Bool
    /// Replaces the file with `bytes` atomically (empty: removes it); false when they do not fit.
    func replaceJournal(with bytes: [UInt8]) throws(MagpieError) -> Bool
}

extension DiskTier: JournalFile {}

/// The journal of a remote tier's owed removals: checked entries of opaque payloads in a ``JournalFile``.
struct OwedJournal: Sendable {
    let file: any JournalFile

    init(_ file: any JournalFile) { self.file = file }

    static let magic: [UInt8] = [0x4D, 0x47, 0x4F, 0x57, 1, 0, 0, 0]

    /// Appends an entry; false when it does not fit (the tier then owes everything).
    /// - Throws: I/O errors (the entry may then be torn: a later read drops it).
    func append(_ payload: [UInt8]) throws(MagpieError) -> Bool {
        try file.appendToJournal(Self.entry(payload), header: Self.magic)
    }

    /// Replaces every entry (none: removes the journal); false (the journal unchanged) when they do not fit.
    func replace(with payloads: [[UInt8]]) throws(MagpieError) -> Bool {
        guard !payloads.isEmpty else { return try file.replaceJournal(with: []) }
        var bytes = Self.magic
        for payload in payloads { bytes += Self.entry(payload) }
        return try file.replaceJournal(with: bytes)
    }

    /// The entries' payloads (torn or damaged tail dropped); empty if there is no journal.
    func payloads() throws(MagpieError) -> [[UInt8]] {
        let bytes = try file.readJournal()
        guard bytes.count >= Self.magic.count, Array(bytes[0..<Self.magic.count]) == Self.magic else { return [] }
        var payloads: [[UInt8]] = []
        var offset = Self.magic.count
        while offset + 12 <= bytes.count {
            let length = bytes.withUnsafeBytes { Int(UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self))) }
            guard offset + 4 + length + 8 <= bytes.count else { break }
            let stored = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: offset + 4 + length, as: UInt64.self)) }
            let computed = bytes.withUnsafeBytes { KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + 4 + length)])) }
            guard stored == computed else { break }
            payloads.append(Array(bytes[(offset + 4)..<(offset + 4 + length)]))
            offset += 4 + length + 8
        }
        return payloads
    }

    private static func entry(_ payload: [UInt8]) -> [UInt8] {
        var entry = [UInt8]()
        entry.reserveCapacity(payload.count + 12)
        withUnsafeBytes(of: UInt32(truncatingIfNeeded: payload.count).littleEndian) { entry.append(contentsOf: $0) }
        entry += payload
        let checksum = entry.withUnsafeBytes { KeyHash.formatChecksum($0) }
        withUnsafeBytes(of: checksum.littleEndian) { entry.append(contentsOf: $0) }
        return entry
    }
}

/// One journal entry's payload: kind (1 byte: 1 a key, 2 a group, 3 everything), the version of a key's
/// tombstone (u64 LE; 0 otherwise), then the key's or group's bytes.
enum OwedEntry: Equatable {
    case key([UInt8], version: UInt64)
    case group(String)
    case everything

    var encoded: [UInt8] {
        var bytes = [UInt8]()
        let (kind, version, name): (UInt8, UInt64, [UInt8]) =
            switch self {
            case .key(let key, let version): (1, version, key)
            case .group(let group): (2, 0, Array(group.utf8))
            case .everything: (3, 0, [])
            }
        bytes.reserveCapacity(9 + name.count)
        bytes.append(kind)
        withUnsafeBytes(of: version.littleEndian) { bytes.append(contentsOf: $0) }
        bytes += name
        return bytes
    }

    init?(_ bytes: [UInt8]) {
        guard bytes.count >= 9 else { return nil }
        let version = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: 1, as: UInt64.self)) }
        let name = Array(bytes[9...])
        switch bytes[0] {
        case 1 where name.count <= HashedKey.maximumLength: self = .key(name, version: version)
        case 2:
            guard let group = String(validating: name, as: UTF8.self), !group.isEmpty else { return nil }
            self = .group(group)
        case 3 where name.isEmpty: self = .everything
        default: return nil
        }
    }
}
