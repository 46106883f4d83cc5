import Foundation

// MARK: - Writing placed records; a seal's write, without the bucket's lock (the last step of Bucket+Seal.swift)
//
// A write of records into the file (Bucket+Regions.swift) *places* them under the bucket's lock: it stamps
// their sequence numbers, moves the newest region's end past them, opens the regions they need (writing
// those headers) and, when it must, reclaims the oldest region. Then a ``RecordWrite`` writes the placed
// records (one `pwrite` per run contiguous in the file and in the batch), and *settles*: their slots point
// into the file.
//
// The commit of a sealed memtable (Bucket+Seal.swift, step 3) need not hold the lock for that `pwrite` —
// 40–170 µs for a 40 KiB memtable on this project's VMs, most of a commit, which kept every store and read
// of the bucket waiting. When the commit leaves no freed region header to zero after the records and
// reinserts no entry (most commits reclaim nothing; one that reclaimed the oldest region into the slot it
// opens, and kept none of its entries, qualifies too: the records placed before the reclaim were written
// under the lock, and the reused slot's header is the new region's), the write is left to the sealing
// thread after the lock is released: a *deferred write*, noted in `BucketMemtables.deferredWrite` until it
// is settled.
//
// While a deferred write is out, the bucket serves as before: its records' slots are still pending, so
// reads and overwrites find them in the sealing memtable, which stays until the write is settled. What
// must not happen meanwhile is anything that depends on those bytes being in the file, or on nothing being
// appended behind them. So, under the lock, these settle it first (`settleDeferredWrite`: wait until its
// write is done, then point its records' slots into the file, exactly as a commit under the lock would
// have):
//  - every change to the file: `beforeFileChange()` (appends, tombstones, reclaims, truncation,
//    emptying), so nothing is ever written behind a deferred write before it is complete (a crash then can
//    only cut the file's tail, as in a commit under the lock);
//  - whatever reads a region's bytes beyond its records' slots (scrub, evacuation), closes or syncs the
//    file, or writes a snapshot;
//  - an overwrite or removal of a key whose record is in the deferred write, and a group removal with such
//    a member: the record is about to be in the file, so its replacement needs a tombstone, written after it.
// The sealing thread settles its own deferred write when the write is done, if nobody did earlier; it waits
// for nothing under the lock, and takes no lock while it writes, so no thread waiting under the lock can be
// waiting for it in vain.
//
// A failed write: the records before the failed run are settled; each region then ends where the failed
// run began (nothing was appended behind it: see above), and what the failed write left is zeroed, or, if
// that fails, the region is noted in `BucketDamage.unindexedRegion` (Bucket+Regions.swift). The commit then
// fails as a commit under the lock does (the memtable's records not written are lost, Bucket+Seal.swift).

/// Records placed in the file under the bucket's lock, and their write (see above): by a seal's thread
/// without the lock (deferred), or under it (`writePlaced`, Bucket+Regions.swift).
final class RecordWrite: Sendable {
    /// A placed record: where it goes in the file, and which slot points at it once written.
    struct Record: Sendable {
        /// The record's bytes in the seal's batch.
        var start: Int
        var length: Int
        var offset: Int
        var origin: WriteBatch.Origin
    }

    /// What the write did.
    struct Outcome: Sendable {
        /// Records written, from the first (the rest were not).
        var written = 0
        var bytesWritten = 0
        var failure: MagpieError? = nil
        /// The file offset of a failed write whose partial bytes could not be zeroed.
        var unzeroed: Int? = nil
    }

    let fd: Int32
    let path: String
    let records: [Record]
    private let done = NSCondition()
    private let outcome = Locked<Outcome?>(nil)

    init(fd: Int32, path: String, records: [Record]) {
        self.fd = fd
        self.path = path
        self.records = records
    }

    /// Writes the records (from `bytes`, the seal's batch): one `pwrite` per run contiguous both in the file
    /// and in `bytes`; a failed one's partial bytes are zeroed (its pages exist: the overwrite needs no new
    /// space). Then tells those waiting, and returns what it did. Called once: by the sealing thread,
    /// holding no lock, or under the lock by a write that writes its records there (`writePlaced`).
    @discardableResult
    func write(from bytes: [UInt8]) -> Outcome {
        var result = Outcome()
        defer { finish(result) }
        // (`finish` runs on every return below, which then hands back the same `result`.)
        var first = 0  // the first record of the current run
        while first < records.count {
            var end = first + 1
            var length = records[first].length
            while end < records.count && records[end].offset == records[first].offset + length
                && records[end].start == records[first].start + length
            {
                length += records[end].length
                end += 1
            }
            let at = records[first].offset
            var written = 0
            do {
                try bytes.withUnsafeBytes { raw in
                    Result { () throws(MagpieError) in
                        try FileIO.write(
                            fd, UnsafeRawBufferPointer(rebasing: raw[records[first].start..<(records[first].start + length)]), at: at,
                            path: path, done: &written)
                    }
                }.get()
            } catch {
                result.failure = error
                if written > 0 && (try? FileIO.write(fd, [UInt8](repeating: 0, count: written), at: at, path: path, operation: "zero")) == nil {
                    result.unzeroed = at
                }
                return result
            }
            result.written = end
            result.bytesWritten += length
            first = end
        }
        return result
    }

    private func finish(_ result: Outcome) {
        done.lock()
        outcome.withLock { $0 = result }
        done.broadcast()
        done.unlock()
    }

    /// Waits until the write is done; returns what it did.
    func waitUntilWritten() -> Outcome {
        done.lock()
        defer { done.unlock() }
        while true {
            if let result = outcome.withLock({ $0 }) { return result }
            done.wait()
        }
    }
}

extension BucketMemtables {
    /// Whether `slot` is a record of the deferred write out: pending in the sealing memtable while a
    /// deferred write is out. (Exact: every record of that memtable still pending was placed in the write —
    /// the others were replaced, removed or dropped as expired before — and stores made since went to the
    /// other memtable. Were it not, a slot taken for one would only make its operation wait for the write.)
    func isInDeferredWrite(_ slot: DiskSlot) -> Bool {
        guard deferredWrite != nil, slot.isPending, let sealing else { return false }
        return slot.memtableParity == sealing.parity
    }
}

extension BucketState {
    /// Waits for the deferred write out, if any, and settles it: its written records' slots point into the
    /// file; after a failure, each region ends where the failed write began (see the top of this file).
    /// Idempotent.
    mutating func settleDeferredWrite() {
        guard let write = memtables.deferredWrite else { return }
        let outcome = write.waitUntilWritten()
        memtables.deferredWrite = nil
        settle(write, outcome)
    }

    /// Settles a write that is done: its written records' slots point into the file; after a failure, each
    /// region ends where the failed write began.
    mutating func settle(_ write: RecordWrite, _ outcome: RecordWrite.Outcome) {
        for record in write.records[0..<outcome.written] {
            pointSlot(of: record.origin, at: record.offset, length: record.length)
        }
        counters.bytesWritten += UInt64(outcome.bytesWritten)
        if outcome.failure != nil {
            for record in write.records[outcome.written...] { layout.endRegion(before: record.offset) }
            if let at = outcome.unzeroed, let position = layout.regionPosition(holding: layout.slot(ofOffset: at)) {
                damage.noteUnindexed(layout.regions[position].sequence)
            }
        }
        remapIfGrown()
    }
}
