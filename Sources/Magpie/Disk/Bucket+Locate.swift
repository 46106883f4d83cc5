import Glibc

// MARK: - Locating a key's record without reading its value
//
// What a removal, an overwrite, `contains` and a group's scan need: a record's verified first bytes
// (`recordPrefix`), the index position of a key's live record (`find`, checksums verified; `position(of:)`,
// header and key only, for a store that replaces it), and the forms that must not wait
// (`containsIfImmediate`, `pendingPosition(of:)`). A value read, which also copies and checks the payload,
// is in Bucket+Read.swift.

extension BucketState {
    /// The record `slot` points at, its first bytes verified: its header and those bytes (header, key,
    /// group, metadata); nil when it does not verify (a read meeting it will drop it).
    func recordPrefix(_ slot: DiskSlot) throws(MagpieError) -> (RecordHeader, [UInt8])? {
        if slot.isPending {
            guard let memtable = memtables.memtable(parity: slot.memtableParity), slot.memtableOffset + slot.length <= memtable.count else { return nil }
            let record = memtable.bytes(at: slot.memtableOffset, length: slot.length)
            guard let header = RecordHeader.decode(record) else { return nil }
            return (header, [UInt8](UnsafeRawBufferPointer(rebasing: record[0..<header.payloadOffset])))
        }
        let head = try readBytes(min(slot.length, RecordHeader.size), at: slot.offset, mapping: layout.mapping)
        guard let header = head.withUnsafeBytes({ RecordHeader.decode($0) }), header.recordLength == slot.length else { return nil }
        let prefix = header.payloadOffset == head.count ? head : try readBytes(header.payloadOffset, at: slot.offset, mapping: layout.mapping)
        guard prefix.withUnsafeBytes({ RecordHeader.validatePrefix($0) }) != nil else { return nil }
        return (header, prefix)
    }

    /// The index position and header of `key`'s live record, its first bytes verified (a pending one is
    /// taken as it is). Corrupt candidates are dropped and their region noted for healing: the caller lets
    /// `healIfNeeded` run once it no longer needs the position.
    mutating func find(tag: UInt32, key: UnsafeRawBufferPointer) throws(MagpieError) -> (Int, RecordHeader)? {
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            position = next
            guard let (header, prefix) = try recordPrefix(index[position]), header.kind == .value else {
                dropCorrupt(at: position)  // a later slot of the run may shift into `position`: look again
                continue
            }
            let matches = prefix.withUnsafeBytes { raw in
                header.keyLength == key.count
                    && (key.isEmpty || memcmp(raw.baseAddress! + header.keyOffset, key.baseAddress!, key.count) == 0)
            }
            if matches { return (position, header) }
            position = index.next(position)
        }
        return nil
    }

    /// Whether `key` has a live value record (not expired at `now`, not a remembered absence), for a caller
    /// that must not wait (an async `contains` tried on its caller's task): nil, with nothing changed or
    /// counted, when a candidate record (in the file) is not all in the page cache, the file is not
    /// mapped, a candidate fails its checks (dropping it writes: left to ``find(tag:key:)`` on a
    /// thread that may wait, which drops and heals), or the bucket has damage left to heal.
    mutating func containsIfImmediate(_ key: HashedKey, now: Int64) throws(MagpieError) -> Bool? {
        try checkOpen()
        // Damage left to heal: `contains` retries it (`DiskTier.contains`), which writes.
        guard !damage.needsScrub, damage.known.isEmpty, damage.hidden.isEmpty else { return nil }
        let tag = DiskSlot.tag(of: key.hash)
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            position = next
            let slot = index[position]
            // The whole record's pages, as a value read checks them: its prefix's length is known only
            // from its header, and `recordPrefix` must not fault on a page the kernel has to read.
            guard slot.isPending || isResident(slot), let (header, prefix) = try recordPrefix(slot), header.kind == .value
            else { return nil }
            if prefix.withUnsafeBytes({ Self.isKey(key, in: $0, header) }) {
                return (header.expiry == 0 || header.expiry > now) && !header.flags.contains(.negative)
            }
            position = index.next(position)
        }
        return false
    }

    /// Whether every page of the file record `slot` points at is in the page cache (false when the file
    /// is not mapped): reading it cannot wait for the disk.
    func isResident(_ slot: DiskSlot) -> Bool {
        layout.mapping?.isResident(at: slot.offset, count: slot.length) ?? false
    }

    /// The index position of `key`'s record, for a store that replaces it: confirmed by the record's
    /// header and key alone (64 + key bytes, read without an allocation for keys up to a few KiB), not
    /// by its checksum, so an overwrite neither copies nor hashes the old value. Enough here: the
    /// position is only dropped from the index (with a tombstone written first when its record is in the
    /// file), which a damaged record or a stale slot cannot turn into a wrong value. A candidate whose
    /// header does not parse or match is left to the next read, which verifies it.
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

    /// ``position(of:)`` for a store that must not wait: `.wouldBlock` when a candidate slot (one of the
    /// key's tag) before the key's is in the file (comparing it would read the file; and a record of the
    /// key there needs a tombstone written), else the key's position among the memtables' records, if any.
    func pendingPosition(of key: HashedKey) -> ImmediateRead<Int?> {
        let tag = DiskSlot.tag(of: key.hash)
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            let slot = index[next]
            guard slot.isPending else { return .wouldBlock }
            if slot.length >= RecordHeader.size + key.count, memtableHolds(key, slot) { return .done(next) }
            position = index.next(next)
        }
        return .done(nil)
    }

    /// Whether the memtable record the pending `slot` points at is a value record of `key`.
    @inline(__always)
    private func memtableHolds(_ key: HashedKey, _ slot: DiskSlot) -> Bool {
        let length = RecordHeader.size + key.count
        guard let memtable = memtables.memtable(parity: slot.memtableParity), slot.memtableOffset + length <= memtable.count else { return false }
        return Self.holds(memtable.bytes(at: slot.memtableOffset, length: length), key, slot)
    }

    /// Whether the record `slot` points at is a value record of `key` (header and key compared).
    private func recordHolds(_ key: HashedKey, _ slot: DiskSlot) throws(MagpieError) -> Bool {
        let length = RecordHeader.size + key.count
        if slot.isPending { return memtableHolds(key, slot) }
        let (fd, path, mapping) = (layout.fd, context.path, layout.mapping)
        return try withUnsafeTemporaryAllocation(byteCount: length, alignment: 8) { buffer in
            Result { () throws(MagpieError) -> Bool in
                let read = try FileIO.read(fd, mapping: mapping, into: buffer, at: slot.offset, path: path)
                return read == length && Self.holds(UnsafeRawBufferPointer(buffer), key, slot)
            }
        }.get()
    }

    private static func holds(_ prefix: UnsafeRawBufferPointer, _ key: HashedKey, _ slot: DiskSlot) -> Bool {
        guard let header = RecordHeader.decode(prefix), header.kind == .value, header.recordLength == slot.length
        else { return false }
        return isKey(key, in: prefix, header)
    }
}
