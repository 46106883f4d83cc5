import Glibc

// MARK: - Reads: a record's first bytes verified in a copy, its payload copied once and hashed
//
// A value read (`readValue`) first asks the CPU for all of the record's lines (`FileMapping.prefetch`),
// then copies the record's first bytes — header, key, group, metadata — into its thread's read scratch
// (reused: no allocation), verifies them there (header against the slot, checksum, key), then copies the
// payload once, out of the file's mapping (or with `pread`) straight into the array it returns, and
// checks that copy against the payload hash. Verifying copies means a check and a use always see the
// same bytes, whatever happens to the file meanwhile. A compressed payload (a zstd frame) is copied into
// the scratch instead, behind the prefix, checked there, and decompressed from there outside the lock by
// the same thread (DiskTier+Entries.swift), before anything else can use the scratch; only a frame too
// long for the scratch gets an array.
//
// A pending slot's record is in a memtable (Disk/Memtable.swift), which this process wrote and nothing
// else can: it is read without hashes (it has none yet).

/// The calling thread's buffer for reading records' first bytes into: ``limit`` bytes, allocated on the
/// thread's first disk read and freed when the thread exits. Per thread rather than per bucket: 256
/// buckets would each keep one, and a thread reads one record at a time. Only `candidate` writes it;
/// a zstd frame it leaves there is read once more, by ``DiskTier/entry(_:)`` on the same thread right
/// after the read, before any other read can overwrite it.
enum ReadScratch {
    // Invariant: the thread-specific value is nil or a live allocation of `limit` bytes, owned by its
    // thread, freed once by the key's destructor when the thread exits; only its thread touches it.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { free($0) }
        return key
    }()

    /// The longest prefix read through the scratch: longer ones get an array of their own.
    static let limit = 16 * 1024

    /// `length` bytes of this thread's scratch (length ≤ ``limit``), or nil when memory runs out.
    static func bytes(_ length: Int) -> UnsafeMutableRawBufferPointer? {
        if let base = pthread_getspecific(key) { return UnsafeMutableRawBufferPointer(start: base, count: length) }
        guard let base = malloc(limit) else { return nil }
        pthread_setspecific(key, base)
        return UnsafeMutableRawBufferPointer(start: base, count: length)
    }
}

/// A raw payload copied out of the file's mapping into the array a read returns
/// (``Swift/Array/init(count:filledBy:)``), and checked against its hash as it lies there.
private struct MappedPayload: ByteFiller {
    let mapping: FileMapping
    /// Where the payload starts in the file.
    let offset: Int
    /// The record's payload hash.
    let hash: UInt64
    /// After `fill`: nil when the mapping could not serve the copy (the range is outside it, or a SIGBUS
    /// interrupted it), else whether the bytes copied match `hash`.
    var intact: Bool? = nil

    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        guard mapping.copy(at: offset, into: buffer) else {
            buffer.initializeMemory(as: UInt8.self, repeating: 0)  // an interrupted copy left a prefix
            return
        }
        intact = KeyHash.payloadHash(UnsafeRawBufferPointer(buffer)) == hash
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
    /// A read that must not wait (``BucketState/readValueIfImmediate(_:blocked:)``) would: the record's
    /// pages are not all in the page cache, or the file is not mapped.
    case wouldBlock
}

extension BucketState {
    /// The live value record of `key`, or nil. Corrupt records of the key met on the way are counted
    /// and dropped from the index (and their region emptied once the read is done); an expired one is
    /// dropped too. The clock is read only for a record that has an expiry.
    mutating func readValue(_ key: HashedKey) throws(MagpieError) -> DiskEntry? {
        var blocked = false
        return try readValue(key, immediate: false, blocked: &blocked)
    }

    /// ``readValue(_:)`` for a caller that must not wait for the disk (an async read tried on its
    /// caller's task, `Cache+Reads.swift`): `blocked` is set, and nothing changed or counted, when the
    /// read would have to wait (a candidate record's pages are not all in the page cache, or the file is
    /// not mapped) or would have to heal (a candidate fails verification: healing writes, so that read
    /// is left to the caller's I/O thread, which drops, counts and heals as ``readValue(_:)`` does).
    mutating func readValueIfImmediate(_ key: HashedKey, blocked: inout Bool) throws(MagpieError) -> DiskEntry? {
        try readValue(key, immediate: true, blocked: &blocked)
    }

    // Not inlined into its two callers: inlined into `DiskTier.entry`'s locked closure, it made that closure
    // copy the whole BucketState twice per read (callgrind: about 1,600 instructions per raw disk hit).
    @inline(never)
    private mutating func readValue(_ key: HashedKey, immediate: Bool, blocked: inout Bool) throws(MagpieError) -> DiskEntry? {
        try checkOpen()
        defer { if damage.needsScrub { healIfNeeded(now: context.clock.now()) } }
        let tag = DiskSlot.tag(of: key.hash)
        var position = index.home(tag)
        while let next = index.position(of: tag, from: position) {
            position = next
            let slot = index[position]
            var verdict = Verdict.corrupt
            let found: DiskEntry?
            if slot.isPending {
                found = pendingCandidate(slot, key, &verdict)
            } else if immediate && !isResident(slot) {
                found = nil
                verdict = .wouldBlock
            } else {
                found = try candidate(slot, key, &verdict)
            }
            switch verdict {
            case .otherKey:
                position = index.next(position)
            case .wouldBlock:
                blocked = true
                return nil
            case .corrupt where immediate:
                blocked = true  // healing writes: left to a read that may wait
                return nil
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

    /// Reads the record `slot` (in the file) points at as a value of `key` (see the top of this file);
    /// the entry when `verdict` says `.value`.
    private func candidate(_ slot: DiskSlot, _ key: HashedKey, _ verdict: inout Verdict) throws(MagpieError) -> DiskEntry? {
        // Every line of the record (up to the scratch's size) is asked for at once, before the first copy
        // waits for its first line: the payload's lines then arrive while the prefix is verified, rather
        // than one after another behind it (a raw 4 KiB hit 10-27 % faster in most same-minute pairs,
        // docs/lab-notes/disk.md: a record's lines asked for at once). A hint: it never faults, and a record of
        // another key costs only the loads.
        layout.mapping?.prefetch(at: slot.offset, count: min(slot.length, ReadScratch.limit))
        // The first bytes: header and key, and a little more (a short group, the metadata blocks), at once.
        let guess = min(slot.length, RecordHeader.size + key.count + 48)
        guard guess >= RecordHeader.size, guess <= ReadScratch.limit, let scratch = ReadScratch.bytes(ReadScratch.limit) else {
            return try candidateInArray(slot, key, &verdict)
        }
        guard try copyOut(slot.offset, into: UnsafeMutableRawBufferPointer(rebasing: scratch[0..<guess])),
            let header = RecordHeader.decode(UnsafeRawBufferPointer(rebasing: scratch[0..<guess])),
            header.kind == .value, header.recordLength == slot.length
        else { return nil }
        guard header.payloadOffset <= ReadScratch.limit else { return try candidateInArray(slot, key, &verdict) }
        if header.payloadOffset > guess {
            guard try copyOut(slot.offset + guess, into: UnsafeMutableRawBufferPointer(rebasing: scratch[guess..<header.payloadOffset]))
            else { return nil }
        }
        let prefix = UnsafeRawBufferPointer(rebasing: scratch[0..<header.payloadOffset])
        guard RecordHeader.validatePrefix(prefix) != nil else { return nil }
        guard Self.isKey(key, in: prefix, header) else {
            verdict = .otherKey
            return nil
        }
        // The payload: one copy, into the array returned, checked against its hash.
        if header.storedLength == 0 {
            guard RecordHeader.payloadMatches(UnsafeRawBufferPointer(start: nil, count: 0), header) else { return nil }
            verdict = .value
            return Self.entry(prefix, header, payload: [])
        }
        let payloadAt = slot.offset + header.payloadOffset
        if header.codec == .zstd && header.payloadOffset + header.storedLength <= ReadScratch.limit {
            // A zstd frame is only an input to decompression: copied into the scratch behind its prefix and
            // checked there, it needs no array of its own (`DiskTier.entry` decompresses it from there).
            let frame = header.payloadOffset..<(header.payloadOffset + header.storedLength)
            guard try copyOut(payloadAt, into: UnsafeMutableRawBufferPointer(rebasing: scratch[frame])),
                RecordHeader.payloadMatches(UnsafeRawBufferPointer(rebasing: scratch[frame]), header)
            else { return nil }
            verdict = .value
            var entry = Self.entry(prefix, header, payload: [])
            entry.compressed?.scratchStart = UInt32(truncatingIfNeeded: frame.lowerBound)
            entry.compressed?.scratchEnd = UInt32(truncatingIfNeeded: frame.upperBound)
            return entry
        }
        if let mapping = layout.mapping, !FileIO.mayInject {
            var copy = MappedPayload(mapping: mapping, offset: payloadAt, hash: header.payloadHash)
            let payload = [UInt8](count: header.storedLength, filledBy: &copy)
            if let intact = copy.intact {
                guard intact else { return nil }
                verdict = .value
                return Self.entry(prefix, header, payload: payload)
            }
            // The mapping could not serve the copy: read again below, where `pread` tells what failed.
        }
        var failure: MagpieError? = nil
        var intact = false
        let payload = [UInt8](unsafeUninitializedCapacity: header.storedLength) { buffer, initialized in
            do throws(MagpieError) {
                let raw = UnsafeMutableRawBufferPointer(buffer)
                if try copyOut(payloadAt, into: raw) {
                    initialized = header.storedLength
                    intact = RecordHeader.payloadMatches(UnsafeRawBufferPointer(raw), header)
                } else {
                    initialized = 0
                }
            } catch {
                failure = error
                initialized = 0
            }
        }
        if let failure { throw failure }
        guard intact else { return nil }
        verdict = .value
        return Self.entry(prefix, header, payload: payload)
    }

    /// `candidate` for a record read whole into an array of its own (its first bytes too long for the
    /// scratch, or no scratch).
    private func candidateInArray(_ slot: DiskSlot, _ key: HashedKey, _ verdict: inout Verdict) throws(MagpieError) -> DiskEntry? {
        let bytes = try readRecord(slot)
        return bytes.withUnsafeBytes { raw -> DiskEntry? in
            guard let header = RecordHeader.validatePrefix(raw), header.kind == .value, header.recordLength == slot.length,
                raw.count >= header.payloadOffset + header.storedLength
            else { return nil }
            let prefix = UnsafeRawBufferPointer(rebasing: raw[0..<header.payloadOffset])
            guard Self.isKey(key, in: prefix, header) else {
                verdict = .otherKey
                return nil
            }
            let payload = UnsafeRawBufferPointer(rebasing: raw[header.payloadOffset..<(header.payloadOffset + header.storedLength)])
            guard RecordHeader.payloadMatches(payload, header) else { return nil }
            verdict = .value
            return Self.entry(prefix, header, payload: [UInt8](payload))
        }
    }

    /// A pending slot's record, read out of its memtable.
    private func pendingCandidate(_ slot: DiskSlot, _ key: HashedKey, _ verdict: inout Verdict) -> DiskEntry? {
        guard let memtable = memtables.memtable(parity: slot.memtableParity), slot.memtableOffset + slot.length <= memtable.count else { return nil }
        let record = memtable.bytes(at: slot.memtableOffset, length: slot.length)
        guard let header = RecordHeader.decode(record), header.kind == .value, header.recordLength == slot.length else { return nil }
        let prefix = UnsafeRawBufferPointer(rebasing: record[0..<header.payloadOffset])
        guard Self.isKey(key, in: prefix, header) else {
            verdict = .otherKey
            return nil
        }
        verdict = .value
        let payload = [UInt8](UnsafeRawBufferPointer(rebasing: record[header.payloadOffset..<(header.payloadOffset + header.storedLength)]))
        return Self.entry(prefix, header, payload: payload)
    }

    /// Whether the record whose first bytes are `prefix` is `key`'s.
    @inline(__always)
    static func isKey(_ key: HashedKey, in prefix: UnsafeRawBufferPointer, _ header: RecordHeader) -> Bool {
        header.keyHash == key.hash && header.keyLength == key.count
            && (key.count == 0 || memcmp(prefix.baseAddress! + header.keyOffset, key.bytes.baseAddress!, key.count) == 0)
    }

    /// The entry of a verified value record: its first bytes and its payload.
    private static func entry(_ prefix: UnsafeRawBufferPointer, _ header: RecordHeader, payload: [UInt8]) -> DiskEntry {
        let group = header.groupLength == 0 ? nil
            : String(decoding: UnsafeRawBufferPointer(rebasing: prefix[header.groupOffset..<header.groupEnd]), as: UTF8.self)
        return DiskEntry(
            value: payload, expiry: header.expiry, placement: RecordHeader.metadata(of: prefix, header),
            group: group, compressed: header.codec == .zstd ? CompressedFrame(originalLength: header.originalLength) : nil)
    }

    /// Copies `destination.count` bytes of the file from `offset`: out of the file's mapping, or with
    /// `pread`. False when the file ends first.
    private func copyOut(_ offset: Int, into destination: UnsafeMutableRawBufferPointer) throws(MagpieError) -> Bool {
        if destination.isEmpty { return true }
        return try FileIO.read(layout.fd, mapping: layout.mapping, into: destination, at: offset, path: context.path) == destination.count
    }

    /// Counts and logs a corrupt record met by a read, drops its slot, and has the bucket's regions
    /// checked (and healed) when the operation ends (Bucket+Heal.swift).
    mutating func dropCorrupt(at position: Int) {
        let slot = index[position]
        counters.corruptRecords += 1
        context.logs.corruptRecord.record(metadata: ["path": "\(context.path)", "offset": "\(slot.offset)"])
        drop(at: position)
        damage.needsScrub = true
    }

    /// The bytes of the record `slot` points at: out of its memtable for a pending slot, else from the
    /// file (through its mapping when there is one). Fewer than the slot's length only if the file ends
    /// early (which fails validation).
    func readRecord(_ slot: DiskSlot) throws(MagpieError) -> [UInt8] {
        if slot.isPending {
            guard let memtable = memtables.memtable(parity: slot.memtableParity), slot.memtableOffset + slot.length <= memtable.count else { return [] }
            return [UInt8](memtable.bytes(at: slot.memtableOffset, length: slot.length))
        }
        return try readBytes(slot.length, at: slot.offset, mapping: layout.mapping)
    }

    /// Up to `count` bytes of the file from `offset` (through `mapping` if given): fewer only at the end
    /// of the file.
    func readBytes(_ count: Int, at offset: Int, mapping: FileMapping? = nil) throws(MagpieError) -> [UInt8] {
        // init(unsafeUninitializedCapacity:) with a zero capacity writes into the stdlib's shared
        // empty-array storage, a (benign) race that Thread Sanitizer reports: an empty file reads as [].
        if count <= 0 { return [] }
        let fd = layout.fd
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
