import Glibc

// MARK: - The remote tier's journal: owed removals that survive the process
//
// A cache with a disk tier and a remote tier keeps the removals it owes the remote store (see
// RemoteTier+Replay.swift) in `<directory>/OWED` as well as in memory, so that a process killed while
// the store is unreachable replays them when it opens the directory again. The disk tier only keeps the
// entries; what they mean is the remote tier's business.
//
//   OWED:  "MGOW" (4 bytes), format (u32 LE, = 1); then entries, each:
//          length (u32 LE), payload (length bytes), checksum (u64 LE: XXH3-64 of the length and payload)
//
// Appends are written in place with `pwrite` (they reach the kernel: a killed process loses none; a
// power loss may, like every store until ``DiskTier/flush()``, which fsyncs this file too). A read at
// open stops at the first entry that does not check (a torn tail from a crash mid-append, or damage):
// what precedes it is returned. The whole file is replaced atomically (a temporary, fsynced, renamed)
// when the remote tier compacts it; it is removed when nothing is owed.
//
// Budget: the file's bytes come from the ledger's pool (or the buckets' free room, never by evicting),
// reserved in 4 KiB steps before they are written; the file is held to `journalLimit` (1/64 of the
// budget, at most 1 MiB). An append that finds no room returns false: the remote tier then owes
// everything, one short entry. A file found at open is charged at once, whatever the tiers.

struct JournalState {
    /// The open journal (-1: none open).
    var fd: Int32 = -1
    /// Its length in bytes (0: no file).
    var size = 0
    /// Bytes of the budget held for it (≥ size, a multiple of the step).
    var reserved = 0
}

extension DiskTier {
    static let journalName = "OWED"
    static let journalMagic: [UInt8] = [0x4D, 0x47, 0x4F, 0x57, 1, 0, 0, 0]
    static let journalStep = 4096

    /// The most bytes the journal may take.
    var journalLimit: Int { min(1 << 20, configuration.budget / 64) }

    /// The size of a journal left in `directory` (0 if none): what opening the tier charges for it
    /// (rounded up to the reservation step).
    static func leftJournalSize(_ directory: CacheDirectory) -> Int {
        guard directory.kind(.root, journalName) == S_IFREG,
            let fd = try? directory.open(.root, journalName, writable: false)
        else { return 0 }
        defer { Glibc.close(fd) }
        return (try? FileIO.size(fd, path: directory.path(.root, journalName))) ?? 0
    }

    static func rounded(_ size: Int) -> Int { (size + journalStep - 1) / journalStep * journalStep }

    /// The entries of the journal left in the directory (torn or damaged tail dropped); empty if none.
    /// - Throws: I/O errors.
    func journalEntries() throws(MagpieError) -> [[UInt8]] {
        try verifyDirectory()
        guard directory.kind(.root, Self.journalName) == S_IFREG,
            let fd = try directory.open(.root, Self.journalName, writable: false)
        else { return [] }
        defer { Glibc.close(fd) }
        let path = directory.path(.root, Self.journalName)
        let size = min(try FileIO.size(fd, path: path), journalLimit + Self.journalStep)
        var bytes = [UInt8](repeating: 0, count: size)
        let read = try bytes.withUnsafeMutableBytes { buffer in
            Result { () throws(MagpieError) -> Int in try FileIO.read(fd, into: buffer, at: 0, path: path) }
        }.get()
        guard read >= Self.journalMagic.count, Array(bytes[0..<Self.journalMagic.count]) == Self.journalMagic else { return [] }
        var entries: [[UInt8]] = []
        var offset = Self.journalMagic.count
        while offset + 12 <= read {
            let length = bytes.withUnsafeBytes { Int(UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self))) }
            guard offset + 4 + length + 8 <= read else { break }
            let stored = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: offset + 4 + length, as: UInt64.self)) }
            let computed = bytes.withUnsafeBytes { KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + 4 + length)])) }
            guard stored == computed else { break }
            entries.append(Array(bytes[(offset + 4)..<(offset + 4 + length)]))
            offset += 4 + length + 8
        }
        return entries
    }

    /// Appends one entry; false (nothing written) when the journal would pass its limit or no room is
    /// left for it.
    /// - Throws: I/O errors (the entry may then be torn: a later read drops it).
    func appendToJournal(_ payload: [UInt8]) throws(MagpieError) -> Bool {
        try verifyDirectory()
        return try journal.withLock { (state: inout JournalState) throws(MagpieError) -> Bool in
            if state.fd < 0 {
                // No file (or not opened yet): start one (an existing one is rewritten with the entry
                // appended, below, only through `replaceJournal`; here it is opened as it is).
                let existing = directory.kind(.root, Self.journalName) == S_IFREG
                state.fd = try directory.openOrCreate(.root, Self.journalName)
                let path = directory.path(.root, Self.journalName)
                state.size = existing ? try FileIO.size(state.fd, path: path) : 0
                if state.size < Self.journalMagic.count {
                    guard try reserveJournal(&state, upTo: Self.journalMagic.count) else { return false }
                    try FileIO.truncate(state.fd, to: 0, path: path)
                    try FileIO.write(state.fd, Self.journalMagic, at: 0, path: path)
                    state.size = Self.journalMagic.count
                }
            }
            let entry = Self.journalEntry(payload)
            guard state.size + entry.count <= journalLimit, try reserveJournal(&state, upTo: state.size + entry.count) else { return false }
            try FileIO.write(state.fd, entry, at: state.size, path: directory.path(.root, Self.journalName))
            state.size += entry.count
            return true
        }
    }

    /// Replaces the journal with `payloads`, atomically; removes it when `payloads` is empty. False
    /// (the journal unchanged) when they do not fit.
    /// - Throws: I/O errors.
    func replaceJournal(with payloads: [[UInt8]]) throws(MagpieError) -> Bool {
        try verifyDirectory()
        return try journal.withLock { (state: inout JournalState) throws(MagpieError) -> Bool in
            if state.fd >= 0 {
                Glibc.close(state.fd)
                state.fd = -1
            }
            guard !payloads.isEmpty else {
                try directory.unlink(.root, Self.journalName)
                state.size = 0
                ledger.pool.give(state.reserved)
                state.reserved = 0
                return true
            }
            var bytes = Self.journalMagic
            for payload in payloads { bytes += Self.journalEntry(payload) }
            guard bytes.count <= journalLimit else { return false }
            // The old file and the new one both exist until the rename: room for both.
            let old = (state.size, state.reserved)
            state.size += bytes.count
            guard try reserveJournal(&state, upTo: state.size) else {
                state.size = old.0
                return false
            }
            try directory.writeAtomically(.root, Self.journalName, bytes)
            state.size = bytes.count
            let keep = Self.rounded(bytes.count)
            ledger.pool.give(state.reserved - keep)
            state.reserved = keep
            return true
        }
    }

    /// fsync of the journal, if one is open (part of ``flush()``).
    func syncJournal() throws(MagpieError) {
        try journal.withLock { (state: inout JournalState) throws(MagpieError) in
            if state.fd >= 0 { try FileIO.sync(state.fd, path: directory.path(.root, Self.journalName)) }
        }
    }

    /// Closes the journal's file (it stays, charged, for the next open).
    func closeJournal() {
        journal.withLock { state in
            if state.fd >= 0 { Glibc.close(state.fd) }
            state.fd = -1
        }
    }

    /// The journal's bytes now (what a close leaves in the directory).
    var journalSize: Int { journal.withLock { $0.size } }

    /// Holds at least `bytes` of the budget for the journal: from the pool, then lent by the buckets
    /// (never by evicting). False, holding what it held before, when there is no such room.
    private func reserveJournal(_ state: inout JournalState, upTo bytes: Int) throws(MagpieError) -> Bool {
        let wanted = Self.rounded(bytes) - state.reserved
        guard wanted > 0 else { return true }
        var taken = ledger.pool.take(upTo: wanted)
        if taken < wanted {
            taken += bucketSet.gatherRoom(wanted - taken, for: 0, evicting: false, now: configuration.clock.now())
            taken += ledger.pool.take(upTo: wanted - taken)
        }
        guard taken == wanted else {
            ledger.pool.give(taken)
            return false
        }
        state.reserved += wanted
        return true
    }

    private static func journalEntry(_ payload: [UInt8]) -> [UInt8] {
        var entry = [UInt8]()
        entry.reserveCapacity(payload.count + 12)
        withUnsafeBytes(of: UInt32(truncatingIfNeeded: payload.count).littleEndian) { entry.append(contentsOf: $0) }
        entry += payload
        let checksum = entry.withUnsafeBytes { KeyHash.formatChecksum($0) }
        withUnsafeBytes(of: checksum.littleEndian) { entry.append(contentsOf: $0) }
        return entry
    }
}
