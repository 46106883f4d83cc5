import Glibc

// MARK: - Reads: a record is copied out of the file (through its mapping), then verified in the copy
//
// A value read (`readValue`) copies the record whole into its thread's read scratch (reused: no
// allocation), verifies it there (header against the slot, checksum, key), and copies the payload out
// into the array it returns: for a raw value, the value itself. Verifying a copy means a check and a use
// always see the same bytes, whatever happens to the file meanwhile. A record too long for the scratch,
// and the other lookups (`find`: a contains, a removal), copy the record into an array of its own.

/// A record read for a key: its bytes and parsed header.
struct FoundRecord {
    var header: RecordHeader
    var bytes: [UInt8]
}

/// The calling thread's buffer for reading records into: ``limit`` bytes, allocated on the thread's first
/// disk read and freed when the thread exits. Per thread rather than per bucket: 256 buckets would each
/// keep one, and a thread reads one record at a time (a read never starts another on its thread).
enum ReadScratch {
    // Invariant: the thread-specific value is nil or a live allocation of `limit` bytes, owned by its
    // thread, freed once by the key's destructor when the thread exits; only its thread touches it.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { free($0) }
        return key
    }()

    /// The longest record read through the scratch: longer ones get an array of their own.
    static let limit = 16 * 1024

    /// `length` bytes of this thread's scratch (length ≤ ``limit``), or nil when memory runs out.
    static func bytes(_ length: Int) -> UnsafeMutableRawBufferPointer? {
        if let base = pthread_getspecific(key) { return UnsafeMutableRawBufferPointer(start: base, count: length) }
        guard let base = malloc(limit) else { return nil }
        pthread_setspecific(key, base)
        return UnsafeMutableRawBufferPointer(start: base, count: length)
    }
}

/// What a candidate slot holds, as far as a read can tell (the entry itself travels apart, as an
/// optional: an enum carrying it cost value-witness calls on every read, measured).
private enum Verdict {
    case value
    /// Another key's record (its tag collided), or nothing a read for this key may use.
    case otherKey
    /// A record that fails verification.
    case corrupt
}

extension BucketState {
    /// The live value record of `key`, or nil. Corrupt records of the key met on the way are counted
    /// and dropped from the index (and the file is healed once the read is done); an expired one is
    /// dropped too. The clock is read only for a record that has an expiry.
    mutating func readValue(_ key: HashedKey) throws(MagpieError) -> DiskEntry? {
        try checkOpen()
        defer { healIfNeeded() }
        let tag = DiskSlot.tag(of: key.hash)
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            position = next
            let slot = index[position]
            var verdict = Verdict.corrupt
            let found = try candidate(slot, key, &verdict)
            switch verdict {
            case .otherKey:
                position = index.next(position)
            case .corrupt:
                dropCorrupt(at: position)  // a later slot of the run may shift into `position`: look again
            case .value:
                let expiry = found.unsafelyUnwrapped.expiry  // set with this verdict
                if expiry != 0 && expiry <= context.clock.now() {
                    drop(at: position)
                    counters.expired += 1
                    counters.misses += 1
                    return nil
                }
                index[position].credits += 1
                counters.hits += 1
                return found
            }
        }
        counters.misses += 1
        return nil
    }

    /// Reads the record `slot` points at as a value of `key` (see the top of this file); the entry when
    /// `verdict` says `.value`.
    private func candidate(_ slot: DiskSlot, _ key: HashedKey, _ verdict: inout Verdict) throws(MagpieError) -> DiskEntry? {
        guard slot.length <= ReadScratch.limit, let record = ReadScratch.bytes(slot.length) else {
            let bytes = try readRecord(slot)
            return bytes.withUnsafeBytes { Self.entry(in: $0, slot, key, &verdict) }
        }
        guard try copyOut(slot, from: 0, into: record) else { return nil }
        return Self.entry(in: UnsafeRawBufferPointer(record), slot, key, &verdict)
    }

    /// The entry in a copied record, after verifying it (see the top of this file).
    private static func entry(in bytes: UnsafeRawBufferPointer, _ slot: DiskSlot, _ key: HashedKey, _ verdict: inout Verdict)
        -> DiskEntry?
    {
        guard let header = RecordHeader.validate(bytes), header.kind == .value, !header.isDead,
            header.recordLength == slot.length
        else { return nil }
        guard header.keyHash == key.hash, header.keyLength == key.count,
            key.count == 0 || memcmp(bytes.baseAddress! + header.keyOffset, key.bytes.baseAddress!, key.count) == 0
        else {
            verdict = .otherKey
            return nil
        }
        verdict = .value
        let group = header.groupLength == 0 ? nil
            : String(decoding: UnsafeRawBufferPointer(rebasing: bytes[header.groupOffset..<header.groupEnd]), as: UTF8.self)
        let metadata = RecordHeader.metadata(of: bytes, header)
        // One copy out of the verified bytes, through the specialised array initialiser.
        let payload = [UInt8](UnsafeRawBufferPointer(rebasing: bytes[header.payloadOffset..<(header.payloadOffset + header.storedLength)]))
        return DiskEntry(
            value: payload, expiry: header.expiry, placement: metadata,
            group: group, compressedLength: header.codec == .zstd ? header.originalLength : nil)
    }

    /// Copies `destination.count` bytes of the record `slot` points at, from byte `start` of it: out of
    /// the write buffer, the file's mapping, or with `pread`. False when the log ends first.
    private func copyOut(_ slot: DiskSlot, from start: Int, into destination: UnsafeMutableRawBufferPointer) throws(MagpieError)
        -> Bool
    {
        if destination.isEmpty { return true }
        if slot.offset >= written {
            return buffer.withBytes { bytes in
                let from = slot.offset - written + start
                guard from + destination.count <= bytes.count else { return false }
                destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[from..<(from + destination.count)]))
                return true
            }
        }
        let mapping = slot.offset + slot.length <= written ? self.mapping : nil  // never map-read past the records
        return try FileIO.read(fd, mapping: mapping, into: destination, at: slot.offset + start, path: context.path)
            == destination.count
    }

    /// Counts and logs a corrupt record met by a read, drops its slot, and marks the file for healing.
    mutating func dropCorrupt(at position: Int) {
        counters.corruptRecords += 1
        context.logs.corruptRecord.record(metadata: ["path": "\(context.path)", "offset": "\(index[position].offset)"])
        drop(at: position)
        needsHealing = true
    }

    /// The index position and record of `key`. Verifies each candidate's checksum and key. Corrupt
    /// candidates are dropped and the file is marked for healing: the caller calls `healIfNeeded()` once
    /// it no longer needs the position (a compaction may move slots).
    mutating func find(tag: UInt32, key: UnsafeRawBufferPointer) throws(MagpieError) -> (Int, FoundRecord)? {
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            position = next
            let slot = index[position]
            let bytes = try readRecord(slot)
            guard let header = bytes.withUnsafeBytes({ RecordHeader.validate($0) }), header.kind == .value,
                !header.isDead, header.recordLength == slot.length
            else {
                dropCorrupt(at: position)  // a later slot of the run may shift into `position`: look again
                continue
            }
            let matches = bytes.withUnsafeBytes { raw in
                header.keyLength == key.count
                    && (key.isEmpty || memcmp(raw.baseAddress! + header.keyOffset, key.baseAddress!, key.count) == 0)
            }
            if matches { return (position, FoundRecord(header: header, bytes: bytes)) }
            position = index.next(position)
        }
        return nil
    }

    /// The index position of `key`'s record, for a store that replaces it: confirmed by the record's
    /// header and key alone (56 + key bytes, read without an allocation for keys up to a few KiB), not
    /// by its checksum, so an overwrite neither copies nor hashes the old value. Enough here: the
    /// position is only dropped from the index and its record marked dead, which a damaged record
    /// (that a full read would have dropped anyway) or a stale slot cannot turn into a wrong value. A
    /// candidate whose header does not parse or match is left to the next read, which verifies it.
    mutating func position(of key: HashedKey) throws(MagpieError) -> Int? {
        let tag = DiskSlot.tag(of: key.hash)
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            let slot = index[next]
            if slot.length >= RecordHeader.size + key.count, try recordHolds(key, slot) { return next }
            position = index.next(next)
        }
        return nil
    }

    /// Whether the record `slot` points at is a live value record of `key` (header and key compared).
    private func recordHolds(_ key: HashedKey, _ slot: DiskSlot) throws(MagpieError) -> Bool {
        let length = RecordHeader.size + key.count
        if slot.offset >= written {
            return buffer.withBytes { bytes in
                let start = slot.offset - written
                guard start + length <= bytes.count else { return false }
                return Self.holds(UnsafeRawBufferPointer(rebasing: bytes[start..<(start + length)]), key, slot)
            }
        }
        let mapping = slot.offset + slot.length <= written ? self.mapping : nil
        let (fd, path) = (self.fd, context.path)
        return try withUnsafeTemporaryAllocation(byteCount: length, alignment: 8) { buffer in
            Result { () throws(MagpieError) -> Bool in
                let read = try FileIO.read(fd, mapping: mapping, into: buffer, at: slot.offset, path: path)
                return read == length && Self.holds(UnsafeRawBufferPointer(buffer), key, slot)
            }
        }.get()
    }

    private static func holds(_ prefix: UnsafeRawBufferPointer, _ key: HashedKey, _ slot: DiskSlot) -> Bool {
        guard let header = RecordHeader.decode(prefix), header.kind == .value, !header.isDead,
            header.keyHash == key.hash, header.keyLength == key.count, header.recordLength == slot.length
        else { return false }
        return key.count == 0 || memcmp(prefix.baseAddress! + header.keyOffset, key.bytes.baseAddress!, key.count) == 0
    }

    /// The bytes of the record `slot` points at: from the write buffer if it is still there, from the
    /// file's mapping when there is one and the record lies in the written part of the file, else with
    /// `pread`. Fewer than the slot's length only if the file ends early (which fails validation).
    func readRecord(_ slot: DiskSlot) throws(MagpieError) -> [UInt8] {
        let written = self.written
        if slot.offset >= written { return pendingRecord(slot) }
        let mapping = slot.offset + slot.length <= written ? self.mapping : nil  // never map-read past the records
        return try readBytes(slot.length, at: slot.offset, mapping: mapping)
    }

    /// Up to `count` bytes of the file from `offset` (through `mapping` if given): fewer only at the end
    /// of the file.
    func readBytes(_ count: Int, at offset: Int, mapping: FileMapping? = nil) throws(MagpieError) -> [UInt8] {
        // init(unsafeUninitializedCapacity:) with a zero capacity writes into the stdlib's shared
        // empty-array storage, a (benign) race that Thread Sanitizer reports: an empty file reads as [].
        if count <= 0 { return [] }
        let fd = self.fd
        let path = context.path
        var failure: MagpieError? = nil
        // Only the bytes read are counted as initialised.
        let bytes = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            do throws(MagpieError) {
                initialized = try FileIO.read(
                    fd, mapping: mapping, into: UnsafeMutableRawBufferPointer(buffer), at: offset, path: path)
            } catch {
                failure = error
                initialized = 0
            }
        }
        if let failure { throw failure }
        return bytes
    }
}
