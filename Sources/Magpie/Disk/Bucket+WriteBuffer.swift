import Glibc

// MARK: - The write buffer: appends gathered in memory, written to the file in one `pwrite`
//
// A bucket's records occupy bytes [header, size) of its log. The first `written` of them are in the
// file; the rest, in `buffer`, are records appended since, kept in memory and written as one `pwrite`
// when the next record would not fit in ``BucketContext/writeBuffer`` bytes, and before anything that
// must find them in the file: a removal (its tombstone must reach the kernel before it returns),
// `flush()`, `close()`, a snapshot. A compaction copies them into the new file with the rest.
//
// Why: with one `pwrite` per record, the kernel's write path (a system call, page-cache folio
// lookups, zeroing the rest of every partly written new block) was about half of a set's time (perf);
// gathered into writes of up to 64 KiB, a set takes about 30 % less time (BENCHMARKS.md).
//
// What it costs: a set is in the kernel only once its bucket's buffer is written, so a process crash
// loses what the buffers held (up to `writeBuffer` bytes per bucket): those keys read as misses after
// the restart, never as an older value, since the record a set replaced is marked dead in the file at
// once. `writeBuffer == 0` writes every record through.
//
// Records are written into the buffer where they land, and sealed there (see `RecordDraft`): no
// record is built elsewhere and copied in. Reads of buffered records copy them out of `buffer` (under the bucket's lock, like every read).

/// The bytes of a bucket's buffered records: an array allocated (and zeroed) once at the buffer's
/// capacity, of which the first `count` bytes are records, so that a record is written in place
/// without growing or zero-filling anything per append.
struct WriteBuffer {
    private var storage: [UInt8] = []
    /// Bytes of records in the buffer.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// Appends `length` bytes that `body` writes in place. Precondition: `count + length` ≤ `capacity`.
    mutating func append(_ length: Int, capacity: Int, _ body: (UnsafeMutableRawBufferPointer) -> Void) {
        if storage.isEmpty { storage = [UInt8](repeating: 0, count: capacity) }  // once, at its capacity
        let start = count
        storage.withUnsafeMutableBytes { body(UnsafeMutableRawBufferPointer(rebasing: $0[start..<(start + length)])) }
        count += length
    }

    /// Runs `body` over the buffered bytes.
    func withBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        storage.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
    }

    /// Up to `length` buffered bytes from `start` (fewer past the end), in a new array.
    func copy(from start: Int, length: Int) -> [UInt8] {
        guard start < count else { return [] }
        return Array(storage[start..<min(start + length, count)])
    }

    /// Copies `bytes` over buffered bytes from `start` (which must lie within the buffer).
    mutating func overwrite(at start: Int, with bytes: UnsafeRawBufferPointer) {
        storage.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[start..<(start + bytes.count)]).copyMemory(from: bytes) }
    }

    mutating func removeAll() { count = 0 }
}

extension BucketState {
    /// Appends `draft` at `size`, stamped with `sequence` and sealed: written in place into the buffer
    /// when it fits there, else (or with no buffer) after writing the buffer, straight to the file. On
    /// failure nothing of the record is in the log, and if the buffer could not be written its records
    /// are gone (see `writePending`).
    mutating func put(_ draft: RecordDraft, sequence: UInt64) throws(MagpieError) {
        let capacity = context.writeBuffer
        let length = draft.length
        if length <= capacity {
            if buffer.count + length > capacity { try writePending() }
            buffer.append(length, capacity: capacity) { draft.write(into: $0, sequence: sequence) }
            return
        }
        try writePending()
        let offset = size
        do {
            try FileIO.write(fd, draft.makeRecord(sequence: sequence), at: offset, path: context.path)
        } catch {
            // Best effort: cut a partial record off. If this fails too, `size` still excludes it, the
            // next append overwrites it, and recovery would truncate it as a torn tail.
            try? FileIO.truncate(fd, to: offset, path: context.path)
            throw error
        }
        written += length
    }

    /// Writes the buffered records to the file. On failure they are lost: their index slots are
    /// dropped (they read as misses, counted in `lostBufferedRecords`), the file is cut back to
    /// `written` (best effort, as after a failed append), and the error is thrown.
    mutating func writePending() throws(MagpieError) {
        guard !buffer.isEmpty else { return }
        try beforeFileChange()  // already done by the append that filled the buffer; kept as the invariant's guard
        let offset = written
        let (fd, path) = (self.fd, context.path)
        do {
            try buffer.withBytes { bytes in Result { () throws(MagpieError) in try FileIO.write(fd, bytes, at: offset, path: path) } }.get()
        } catch {
            try? FileIO.truncate(fd, to: offset, path: path)
            discardPending()
            throw error
        }
        written += buffer.count
        buffer.removeAll()
    }

    /// Forgets the buffered records and every index slot that points into them.
    mutating func discardPending() {
        let offset = written
        let lost = dropAll { $0.offset >= offset }
        counters.lostBufferedRecords += UInt64(lost)
        buffer.removeAll()
    }

    /// The buffered bytes of the record `slot` points at (which starts at or after `written`).
    func pendingRecord(_ slot: DiskSlot) -> [UInt8] {
        buffer.copy(from: slot.offset - written, length: slot.length)
    }

    /// Overwrites the magic of a record that is no longer indexed with "DEAD", so that recovery never
    /// applies it: in the buffer if it is still there, else in the file. Best effort for the file: the
    /// record is already out of the index, and a tombstone or newer record follows it; a failed mark
    /// only loses that extra protection.
    mutating func markDead(_ slot: DiskSlot) {
        guard slot.offset + 4 <= size else { return }  // never write past the log
        withUnsafeBytes(of: RecordHeader.deadMagic.littleEndian) { magic in
            if slot.offset >= written {
                buffer.overwrite(at: slot.offset - written, with: magic)
            } else if !keepsSnapshot {  // never while a snapshot of the file as it is remains (callers retire it first)
                _ = try? FileIO.write(fd, magic, at: slot.offset, path: context.path, operation: "mark")
            }
        }
    }

    /// Puts back a slot that an operation dropped before it failed, if its record is still in the log
    /// (a failed buffer write may have taken it).
    mutating func restore(_ slot: DiskSlot) {
        guard slot.offset + slot.length <= size else { return }
        index.insert(slot)
        liveBytes += slot.length
    }
}
