import Glibc

// MARK: - The write buffer: appends gathered in memory, written to the file in one `pwrite`
//
// A bucket's records occupy bytes [header, size) of its log. The first `written` of them are in the
// file; the rest, `pending`, are records appended since, kept in memory and written as one `pwrite`
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
// Reads of buffered records copy them out of `pending` (under the bucket's lock, like every read).

extension BucketState {
    /// Appends `record` at `size`: into the buffer when it fits there, else (or with no buffer) after
    /// writing the buffer, straight to the file. On failure nothing of `record` is in the log, and if
    /// the buffer could not be written its records are gone (see `writePending`).
    mutating func put(_ record: UnsafeRawBufferPointer) throws(MagpieError) {
        let capacity = context.writeBuffer
        if record.count <= capacity {
            if pending.count + record.count > capacity { try writePending() }
            if pending.capacity < capacity { pending.reserveCapacity(capacity) }
            record.withMemoryRebound(to: UInt8.self) { pending.append(contentsOf: $0) }  // one memcpy
            return
        }
        try writePending()
        let offset = size
        do {
            try FileIO.write(fd, record, at: offset, path: context.path)
        } catch {
            // Best effort: cut a partial record off. If this fails too, `size` still excludes it, the
            // next append overwrites it, and recovery would truncate it as a torn tail.
            try? FileIO.truncate(fd, to: offset, path: context.path)
            throw error
        }
        written += record.count
    }

    /// Writes the buffered records to the file. On failure they are lost: their index slots are
    /// dropped (they read as misses, counted in `lostBufferedRecords`), the file is cut back to
    /// `written` (best effort, as after a failed append), and the error is thrown.
    mutating func writePending() throws(MagpieError) {
        guard !pending.isEmpty else { return }
        let offset = written
        do {
            try FileIO.write(fd, pending, at: offset, path: context.path)
        } catch {
            try? FileIO.truncate(fd, to: offset, path: context.path)
            discardPending()
            throw error
        }
        written += pending.count
        pending.removeAll(keepingCapacity: true)
    }

    /// Forgets the buffered records and every index slot that points into them.
    mutating func discardPending() {
        let offset = written
        let lost = dropAll { $0.offset >= offset }
        counters.lostBufferedRecords += UInt64(lost)
        pending.removeAll(keepingCapacity: true)
    }

    /// The buffered bytes of the record `slot` points at (which starts at or after `written`).
    func pendingRecord(_ slot: DiskSlot) -> [UInt8] {
        let start = slot.offset - written
        guard start < pending.count else { return [] }  // not a record (fails validation)
        return Array(pending[start..<min(start + slot.length, pending.count)])
    }

    /// Overwrites the magic of a record that is no longer indexed with "DEAD", so that recovery never
    /// applies it: in the buffer if it is still there, else in the file. Best effort for the file: the
    /// record is already out of the index, and a tombstone or newer record follows it; a failed mark
    /// only loses that extra protection.
    mutating func markDead(_ slot: DiskSlot) {
        guard slot.offset + 4 <= size else { return }  // never write past the log
        withUnsafeBytes(of: RecordHeader.deadMagic.littleEndian) { magic in
            if slot.offset >= written {
                let start = slot.offset - written
                pending.withUnsafeMutableBytes { buffer in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[start..<(start + 4)]).copyMemory(from: magic)
                }
            } else {
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
