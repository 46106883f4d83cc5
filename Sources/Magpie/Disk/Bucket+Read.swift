import Glibc

// MARK: - Reads: a record is copied out of the file (through its mapping), then verified in the copy
//
// A read copies the record whole into a fresh array (from the file's mapping, see FileMapping.swift,
// or with `pread`), verifies it there (header, checksum, key), and hands the array on: the caller trims
// it to the value in place (raw) or decompresses from it (zstd), outside the bucket's lock. Verifying
// the copy means a check and a use always see the same bytes, whatever happens to the file meanwhile.
// The array is the only allocation of a raw read, and usually the block `malloc` just got back from the
// previous read's value, still in the cache: cheaper than a reused per-bucket buffer, which is cold by
// the time its bucket is read again.

/// A record read for a key: its bytes and parsed header.
struct FoundRecord {
    var header: RecordHeader
    var bytes: [UInt8]
}

extension BucketState {
    /// The newest live record for `key`, or nil. Corrupt records met on the way are counted and dropped
    /// from the index (and the file is healed once the read is done); expired ones are dropped too.
    mutating func read(tag: UInt32, key: UnsafeRawBufferPointer, now: Int64) throws(MagpieError) -> FoundRecord? {
        try checkOpen()
        defer { healIfNeeded() }
        guard let (position, found) = try find(tag: tag, key: key) else {
            counters.misses += 1
            return nil
        }
        if found.header.expiry != 0 && found.header.expiry <= now {
            drop(at: position)
            counters.expired += 1
            counters.misses += 1
            return nil
        }
        index[position].referenced = true
        counters.hits += 1
        return found
    }

    /// The index position and record of `key`. Verifies each candidate's checksum and key. Corrupt
    /// candidates are dropped and the file is marked for healing: the caller calls `healIfNeeded()` once
    /// it no longer needs the position (a compaction may move slots).
    mutating func find(tag: UInt32, key: UnsafeRawBufferPointer) throws(MagpieError) -> (Int, FoundRecord)? {
        var position = index.home(tag)
        while !index[position].isEmpty {
            let slot = index[position]
            guard slot.tag == tag else {
                position = index.next(position)
                continue
            }
            let bytes = try readRecord(slot)
            guard let header = bytes.withUnsafeBytes({ RecordHeader.validate($0) }), header.kind == .value,
                !header.isDead, header.recordLength == slot.length
            else {
                counters.corruptRecords += 1
                context.logger?.warning(
                    "magpie: corrupt record dropped from the index",
                    metadata: ["path": "\(context.path)", "offset": "\(slot.offset)"])
                drop(at: position)  // a later slot of the run may shift into `position`: look again
                needsHealing = true
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
        while !index[position].isEmpty {
            let slot = index[position]
            if slot.tag == tag, slot.length >= RecordHeader.size + key.count, try recordHolds(key, slot) { return position }
            position = index.next(position)
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
