import Glibc

// MARK: - The journal's file: bytes the remote tier keeps in the cache directory
//
// The remote tier journals the removals it owes its store in `<directory>/OWED` (Remote/OwedJournal.swift
// has the format and what the entries mean). The disk tier only keeps the file: reads it whole, appends
// with `pwrite` (bytes that reach the kernel: a killed process loses none; ``DiskTier/flush()`` fsyncs
// the file too), replaces it atomically (a temporary, fsynced, renamed) or removes it.
//
// Budget: the file's bytes come from the ledger's pool (or the buckets' free room, never by evicting),
// reserved in 4 KiB steps before they are written; the file is held to `journalLimit` (1/64 of the
// budget, at most 1 MiB). An append or replacement that finds no room returns false. A file found at
// open is charged at once, whatever the tiers.

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

    /// The journal's bytes (empty if there is none), at most a step past its limit.
    /// - Throws: I/O errors.
    func readJournal() throws(MagpieError) -> [UInt8] {
        try verifyDirectory()
        guard directory.kind(.root, Self.journalName) == S_IFREG,
            let fd = try directory.open(.root, Self.journalName, writable: false)
        else { return [] }
        defer { Glibc.close(fd) }
        let path = directory.path(.root, Self.journalName)
        var bytes = [UInt8](repeating: 0, count: min(try FileIO.size(fd, path: path), journalLimit + Self.journalStep))
        let read = try bytes.withUnsafeMutableBytes { buffer in
            Result { () throws(MagpieError) -> Int in try FileIO.read(fd, into: buffer, at: 0, path: path) }
        }.get()
        return Array(bytes.prefix(read))
    }

    /// Appends `bytes`; a journal shorter than `header` (none, or torn in its header) is started over
    /// with `header` first. False (nothing written) when the journal would pass its limit or no room is
    /// left for it.
    /// - Throws: I/O errors (the bytes may then be written in part).
    func appendToJournal(_ bytes: [UInt8], header: [UInt8]) throws(MagpieError) -> Bool {
        try verifyDirectory()
        return try journal.withLock { (state: inout JournalState) throws(MagpieError) -> Bool in
            let path = directory.path(.root, Self.journalName)
            if state.fd < 0 {
                // Not opened yet: a file left in the directory is appended to as it is.
                let existing = directory.kind(.root, Self.journalName) == S_IFREG
                state.fd = try directory.openOrCreate(.root, Self.journalName)
                state.size = existing ? try FileIO.size(state.fd, path: path) : 0
                if state.size < header.count {
                    guard try reserveJournal(&state, upTo: header.count) else { return false }
                    try FileIO.truncate(state.fd, to: 0, path: path)
                    try FileIO.write(state.fd, header, at: 0, path: path)
                    state.size = header.count
                }
            }
            guard state.size + bytes.count <= journalLimit, try reserveJournal(&state, upTo: state.size + bytes.count) else { return false }
            try FileIO.write(state.fd, bytes, at: state.size, path: path)
            state.size += bytes.count
            return true
        }
    }

    /// Replaces the journal with `bytes`, atomically; removes it when `bytes` is empty. False (the
    /// journal unchanged) when they do not fit.
    /// - Throws: I/O errors.
    func replaceJournal(with bytes: [UInt8]) throws(MagpieError) -> Bool {
        try verifyDirectory()
        return try journal.withLock { (state: inout JournalState) throws(MagpieError) -> Bool in
            if state.fd >= 0 {
                Glibc.close(state.fd)
                state.fd = -1
            }
            guard !bytes.isEmpty else {
                try directory.unlink(.root, Self.journalName)
                state.size = 0
                ledger.pool.give(state.reserved)
                state.reserved = 0
                return true
            }
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
}
