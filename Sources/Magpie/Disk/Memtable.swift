import Glibc

// MARK: - Memtables: where a store's record waits, readable, until its bucket writes it
//
// A store does not compress, hash or write: under its bucket's lock it copies its record, unsealed
// (codec raw, no sequence number, no hashes: Format/Record.swift's layout with those fields 0), into the
// bucket's *active* memtable, points the key's index slot at it (a pending slot, Disk/BucketIndex.swift)
// and returns. Reads of a pending slot copy the record out of the memtable.
//
// When the active memtable cannot take the next record it is *detached*: it becomes the bucket's
// *sealing* memtable (read-only from then on) and a new active one takes its place, with the other
// parity, so that a pending slot's parity bit says which of the two holds its record. The tier's sealer
// thread (Disk/Sealer.swift) then compresses and hashes the sealing memtable's records outside the
// bucket's lock and writes those still live into the bucket's regions under it (Disk/Bucket+Seal.swift).
// A bucket has at most these two memtables: a store that finds the active one full while the sealing one
// is still being written waits for it (or writes it itself, if the sealer has not started it).
//
// Memory: a memtable takes `DiskTier.Configuration.writeBufferSize` bytes (default 64 KiB), or one
// record's length for a record longer than that (detached at once); so a bucket holds at most about
// twice the write buffer size, plus one such record.

/// An append-only byte arena of unsealed records, shared by its bucket (which appends while it is
/// active, and reads) and the thread that seals it (which reads once it is detached).
final class Memtable: @unchecked Sendable {
    // @unchecked Sendable invariant: `storage` is a live allocation of `capacity` bytes, owned by this
    // object and freed once in deinit. Bytes below `count` are records and never change again. `count`
    // and the bytes at and past it are written only by the owning bucket, under its lock, while the
    // memtable is active; once detached (under the same lock) nothing writes to it, and the sealing
    // thread, which receives it through the sealer's queue or the bucket's lock (both give
    // happens-before), only reads bytes below the `count` it was detached at.
    let storage: UnsafeMutableRawPointer
    let capacity: Int
    /// Which of its bucket's two memtables this is: the parity bit of its pending slots.
    let parity: Int
    /// Bytes of records appended.
    private(set) var count = 0

    /// A memtable of `capacity` bytes (at least 8); nil when memory runs out.
    init?(capacity: Int, parity: Int) {
        let capacity = max(8, capacity)
        guard let storage = malloc(capacity) else { return nil }
        self.storage = storage
        self.capacity = capacity
        self.parity = parity
    }

    deinit { free(storage) }

    var isEmpty: Bool { count == 0 }

    /// Whether `length` more bytes fit.
    func fits(_ length: Int) -> Bool { length <= capacity - count }

    /// Appends `draft`'s record, unsealed; returns its offset. Precondition: `fits(draft.length)`, and the
    /// memtable is active (its bucket's lock held).
    func append(_ draft: RecordDraft) -> Int {
        let offset = count
        draft.write(into: UnsafeMutableRawBufferPointer(start: storage + offset, count: draft.length))
        count += draft.length
        return offset
    }

    /// The `length` bytes at `offset` (which lie below `count`). Valid while the memtable lives.
    func bytes(at offset: Int, length: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: storage + offset, count: length)
    }

    /// Every record appended, in order: (offset, header) for each, stopping at anything that does not
    /// parse (nothing should: the bucket wrote every byte).
    func records() -> [(offset: Int, header: RecordHeader)] {
        var found: [(Int, RecordHeader)] = []
        var offset = 0
        while offset + RecordHeader.size <= count {
            guard let header = RecordHeader.decode(bytes(at: offset, length: count - offset)),
                offset + header.recordLength <= count
            else { break }
            found.append((offset, header))
            offset += header.recordLength
        }
        return found
    }
}
