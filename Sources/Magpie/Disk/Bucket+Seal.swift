// MARK: - Sealing: a detached memtable's records, compressed and hashed, written into the regions
//
// The memtables are described in Disk/Memtable.swift. Sealing one takes three steps:
//  1. claim (under the bucket's lock): the sealing memtable is taken by one thread (the tier's sealer, or
//     a store that found both memtables full, or `writeBuffers`/`flush`/`close`), with the offsets of its
//     records that are still live then;
//  2. seal (no lock): each of those records is compressed (zstd, when it is long enough, does not look
//     like noise, and shrinks; see Compression/Compressibility.swift) and its payload hashed, into a
//     `WriteBatch` — the costly part, which RocksDB's memtable flush also does off the writer's path;
//  3. commit (under the lock, through the tier's room-finding loop, DiskTier.withRoom): the records still
//     live are stamped and written (Bucket+Regions.swift), their slots then point into the file, and the
//     sealing memtable is released. A record replaced or removed during step 2 is left out. When the
//     commit leaves no freed header to zero and reinserts no entry (most reclaim nothing), only the placing
//     is done under the lock: the records' `pwrite` follows without it, and their slots point into the file
//     once it is done (a *deferred write*, Bucket+RecordWrite.swift, which says what waits for it meanwhile).
// If the commit fails, the memtable's records still pending are lost (misses, counted in
// `lostBufferedStores`) and the memtable is released all the same.

/// A bucket's memtables and the seal under way: the one stores append to, the one being written and
/// whether a thread has taken it, what the sealer is owed, a failed seal's error, and a seal's write left
/// to its thread (Bucket+RecordWrite.swift).
struct BucketMemtables {
    /// The memtable stores append to, and the one being written (Disk/Memtable.swift).
    var active: Memtable? = nil
    var sealing: Memtable? = nil
    /// Whether a thread has taken `sealing` to write it.
    var sealingClaimed = false
    /// A store detached the active memtable but did not return `.storedAndDetached` (its tombstone needed
    /// room first, or failed): the next store that succeeds returns it, so that the sealer is told.
    var sealingNotHandedOver = false
    /// A memtable that failed to be written, its stores lost: thrown by the next store, `writeBuffers` or
    /// `flush`.
    var sealFailure: MagpieError? = nil
    /// A seal's records placed in the file, their write not yet settled (Bucket+RecordWrite.swift):
    /// settled before anything else changes the file.
    var deferredWrite: RecordWrite? = nil

    /// The memtable of `parity`, if the bucket has it.
    @inline(__always)
    func memtable(parity: Int) -> Memtable? {
        if let active, active.parity == parity { return active }
        if let sealing, sealing.parity == parity { return sealing }
        return nil
    }

    /// Makes room in the active memtable for a record of `length` bytes, detaching a full one into
    /// `sealing` (and, for a record that gets a memtable of its own — longer than `writeBuffer`, or no
    /// write buffer at all — a non-empty one). A memtable it detaches is owed to the sealer from then on
    /// (`sealingNotHandedOver`: the store that next returns `.storedAndDetached` hands it over), even when it
    /// then fails. False when it cannot make room, because the sealing memtable is still there (or memory
    /// ran out): the store is then busy.
    mutating func makeRoom(for length: Int, writeBuffer: Int) -> Bool {
        let ownMemtable = length > writeBuffer || writeBuffer == 0
        if let current = active, ownMemtable ? !current.isEmpty || current.capacity < length : !current.fits(length) {
            if current.isEmpty {
                active = nil
            } else {
                guard sealing == nil else { return false }
                detach()
                sealingNotHandedOver = true
            }
        }
        // Its memtable is detached right after the store: the sealing one must be gone by then.
        if ownMemtable && sealing != nil { return false }
        if active == nil {
            guard let memtable = Memtable(capacity: ownMemtable ? length : writeBuffer, parity: sealing.map { 1 - $0.parity } ?? 0)
            else { return false }
            active = memtable
        }
        return true
    }

    /// Makes the active memtable, if it holds records, the sealing one. Precondition: none is sealing.
    mutating func detach() {
        guard let current = active else { return }
        active = nil
        guard !current.isEmpty else { return }
        sealing = current
        sealingClaimed = false
    }

    /// Releases the claimed memtable (if it is still this bucket's: `removeAll` and `close` let go of it).
    mutating func release(_ memtable: Memtable) {
        guard sealing === memtable else { return }
        sealing = nil
        sealingClaimed = false
    }
}

extension BucketState {
    /// Takes the sealing memtable for this thread to write, with the offsets of its records that are
    /// still live (in order); nil when there is none or another thread has it.
    mutating func claimSealing() -> (memtable: Memtable, live: [Int])? {
        guard let memtable = memtables.sealing, !memtables.sealingClaimed else { return nil }
        memtables.sealingClaimed = true
        var live: [Int] = []
        for slot in index.slots where slot.isPending && slot.memtableParity == memtable.parity {
            live.append(slot.memtableOffset)
        }
        live.sort()
        return (memtable, live)
    }

    /// Writes the claimed memtable's batch (step 3 above) and releases it; or, with `deferring`, when the
    /// write can, places the records and returns their deferred write for the caller to write without the lock and
    /// finish with `finishSeal` (Bucket+RecordWrite.swift).
    mutating func commitSeal(_ memtable: Memtable, _ batch: inout WriteBatch, policy: RoomPolicy, now: Int64, deferring: Bool = false)
        throws(MagpieError) -> RoomOutcome<RecordWrite?>
    {
        try checkOpen()
        // Expired while it waited: not written.
        for item in batch.items {
            guard case .memtable(let parity, let offset, let tag) = item.origin,
                let position = pendingPosition(tag: tag, parity: parity, offset: offset), index[position].isExpired(nowMilliseconds: now)
            else { continue }
            drop(at: position)
            counters.expired += 1
        }
        switch try write(&batch, policy: policy, now: now, deferring: deferring) {
        case .short(let short):
            return .short(short)
        case .done(let deferred):
            if deferred == nil { memtables.release(memtable) }
            return .done(deferred)
        }
    }

    /// After a deferred commit's write is done: settles it (if nobody did meanwhile) and releases the
    /// memtable; throws the write's failure (the caller then abandons the seal, as after a failed commit).
    mutating func finishSeal(_ memtable: Memtable, write: RecordWrite) throws(MagpieError) {
        if memtables.deferredWrite === write { settleDeferredWrite() }
        if let failure = write.waitUntilWritten().failure { throw failure }
        memtables.release(memtable)
    }

    /// After a failed commit: the memtable's records still pending are lost (counted, unless they are the
    /// record of a store that throws the failure itself); the memtable is released; a failure no caller
    /// throws is kept for the next store, `writeBuffers` or `flush` to throw (a flush promises that
    /// everything stored before it reached the file).
    mutating func abandonSeal(_ memtable: Memtable, failure: MagpieError?, countingLost: Bool = true) {
        guard memtables.sealing === memtable else { return }  // let go of by `removeAll`: its stores are gone anyway
        let lost = dropAll { $0.isPending && $0.memtableParity == memtable.parity }
        // Kept only if it lost a store: a memtable whose records were all replaced or removed meanwhile (a
        // `removeAll` during its write, say) owes nobody an error.
        if lost > 0 { memtables.sealFailure = memtables.sealFailure ?? failure }
        if countingLost { counters.lostBufferedRecords += UInt64(lost) }
        memtables.release(memtable)
    }

    /// Step 2 above: the batch of the memtable's records at `live` offsets, compressed and hashed. Runs
    /// without the bucket's lock (the memtable is read-only once detached). Returns the batch and the
    /// value bytes before and after compression.
    static func seal(_ memtable: Memtable, live: [Int], shared: BucketShared) -> (WriteBatch, original: Int, stored: Int) {
        var batch = WriteBatch()
        var original = 0
        var stored = 0
        batch.bytes.reserveCapacity(memtable.count)
        for offset in live {
            let head = memtable.bytes(at: offset, length: min(RecordHeader.size, memtable.count - offset))
            guard let header = RecordHeader.decode(head), offset + header.recordLength <= memtable.count else { continue }
            let record = memtable.bytes(at: offset, length: header.recordLength)
            let payload = UnsafeRawBufferPointer(rebasing: record[header.payloadOffset..<(header.payloadOffset + header.storedLength)])
            var compressed: [UInt8]? = nil
            if header.codec == .raw, let compression = shared.compression, payload.count >= shared.minimumCompressibleLength,
                !Compressibility.looksIncompressible(payload)
            {
                // A failure to compress (out of memory for a context) stores the value raw.
                compressed = (try? compression.compress(payload)) ?? nil
            }
            var sealed = header
            if let compressed {
                sealed.codec = .zstd
                sealed.storedLength = compressed.count
            }
            let tag = DiskSlot.tag(of: header.keyHash)
            batch.append(length: sealed.recordLength, origin: .memtable(parity: memtable.parity, offset: offset, tag: tag)) { raw in
                let base = raw.baseAddress!
                sealed.encode(into: base)
                // Key, group and metadata as they are; then the payload; then zero padding.
                copyBytes(UnsafeRawBufferPointer(rebasing: record[RecordHeader.size..<header.payloadOffset]), to: base + RecordHeader.size)
                if let compressed {
                    compressed.withUnsafeBytes { copyBytes($0, to: base + sealed.payloadOffset) }
                } else {
                    copyBytes(payload, to: base + sealed.payloadOffset)
                }
                let end = sealed.payloadOffset + sealed.storedLength
                (base + end).initializeMemory(as: UInt8.self, repeating: 0, count: sealed.recordLength - end)
                RecordHeader.sealPayload(raw)
            }
            original += header.originalLength
            stored += sealed.storedLength
        }
        return (batch, original, stored)
    }
}
