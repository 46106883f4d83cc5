import Synchronization

// MARK: - The buckets of a tier, apart from the tier object
//
// What the sealer thread works on (Disk/Sealer.swift): the buckets and what they share, the room-finding
// loop, sealing. The thread holds this object, never the `DiskTier`: a `DiskTier`'s last reference is then
// never dropped on that thread, where its `deinit` — which stops the thread and waits for it — would wait
// for itself. The tier stops the thread and clears its work (the only reference back) when it closes or
// goes.

/// A tier's buckets and what they share (see above).
final class BucketSet: Sendable {
    let buckets: [Locked<BucketState>]
    let shared: BucketShared
    let sealer: Sealer
    let bucketCount: Int
    /// Whether full memtables are written by the sealer thread (else by the store that filled them).
    let sealsInBackground: Bool
    /// Value bytes given to stores, and the bytes their payloads took once written (compressed or not).
    let originalBytes = Atomic<UInt64>(0)
    let storedBytes = Atomic<UInt64>(0)

    init(buckets: [Locked<BucketState>], shared: BucketShared, sealer: Sealer, sealsInBackground: Bool) {
        self.buckets = buckets
        self.shared = shared
        self.sealer = sealer
        self.bucketCount = buckets.count
        self.sealsInBackground = sealsInBackground
    }

    /// Runs `operation` on bucket `number` with room for what it appends: the bucket borrows from the
    /// pool; if that is short, the other buckets lend their free room (one at a time, holding no other
    /// bucket's lock) to this one and the operation runs again; only when no bucket has room does the
    /// bucket evict its own entries (or, for a record larger than it could hold alone, the others evict
    /// to lend).
    func withRoom<R>(
        _ number: Int, now: Int64, _ operation: (inout BucketState, RoomPolicy) throws(MagpieError) -> RoomOutcome<R>
    ) throws(MagpieError) -> R {
        try withBorrowedRoom { (policy, granted) throws(MagpieError) in
            try buckets[number].withLock { (state: inout BucketState) throws(MagpieError) in
                state.acceptGranted(granted)  // first: what the others lent is this bucket's from here on
                try state.loadIfNeeded()
                return try operation(&state, policy)
            }
        } gather: { (bytes, evicting) in
            gatherRoom(bytes, for: number, evicting: evicting, now: now)
        }
    }

    /// Asks the buckets other than `number`, one at a time, to lend up to `bytes` (see
    /// `BucketState.lend`). Returns what they lent, which the caller now holds: it gives them to a
    /// bucket's limit or to the pool.
    func gatherRoom(_ bytes: Int, for number: Int, evicting: Bool, now: Int64) -> Int {
        var gathered = 0
        var step = 1
        while step < bucketCount && gathered < bytes {
            let wanted = bytes - gathered
            gathered += buckets[(number + step) & (bucketCount - 1)].withLock { (state: inout BucketState) -> Int in
                // Its room is known once its index is; a bucket that cannot load lends nothing (its own
                // operations report the failure), rather than failing a store into another bucket.
                do { try state.loadIfNeeded() } catch { return 0 }
                return state.lend(upTo: wanted, evicting: evicting, now: now)
            }
            step += 1
        }
        return gathered
    }

    // MARK: Sealing (Disk/Bucket+Seal.swift, Disk/Sealer.swift): who writes a detached memtable, and when a
    // caller waits for one.

    /// A store detached bucket `number`'s memtable: the sealer writes it; with no write buffer (or no
    /// sealer thread), this thread does, before the store returns.
    func handOver(_ number: Int) throws(MagpieError) {
        if shared.writeBuffer == 0 || !sealsInBackground {
            var before = sealer.completed
            while try !sealBucket(number, ownStore: true) {
                // Another thread has it (a `writeBuffers`): this store returns once it is written.
                guard buckets[number].withLock({ $0.memtables.sealing != nil && $0.memtables.sealingClaimed }) else { return }
                sealer.waitForCompletion(after: before)
                before = sealer.completed
            }
        } else {
            sealer.enqueue(number)
        }
    }

    /// A store found bucket `number`'s memtables both taken: writes the sealing one here if no thread has
    /// taken it, else waits until a seal finishes (`before`: the count of finished seals read before the
    /// store looked at the bucket).
    func sealOrWait(_ number: Int, before: UInt64) {
        // A failure is the stores' of that memtable, not this one's (not stored yet): it is counted, logged
        // and kept for the next `flush`, and this store goes on.
        if (try? sealBucket(number, reported: false)) == true { return }
        if buckets[number].withLock({ !$0.memtables.sealingClaimed }) { return }  // written, or failed, meanwhile
        sealer.waitForCompletion(after: before)
    }

    /// Writes bucket `number`'s sealing memtable on this thread, if it has one that no other thread has
    /// taken; returns whether it did. A failure loses the memtable's records (counted, logged) and throws.
    /// (`reported`: the caller throws the failure on to whoever asked for the write; else it is kept for
    /// the next `writeBuffers`/`flush`.)
    /// (`ownStore`: the memtable holds just the record of the store that writes it through, which throws
    /// the failure: not a lost store.)
    @discardableResult
    func sealBucket(_ number: Int, reported: Bool = true, ownStore: Bool = false) throws(MagpieError) -> Bool {
        guard let (memtable, live) = buckets[number].withLock({ $0.isOpen && $0.life.loaded ? $0.claimSealing() : nil }) else {
            return false
        }
        defer { sealer.noteCompleted() }
        var (batch, original, stored) = BucketState.seal(memtable, live: live, shared: shared)
        let now = shared.clock.now()
        do {
            let deferred = try withRoom(number, now: now) { (state, policy) throws(MagpieError) in
                try state.commitSeal(memtable, &batch, policy: policy, now: now, deferring: true)
            }
            // The records' write, without the bucket's lock (Bucket+RecordWrite.swift).
            if let deferred {
                deferred.write(from: batch.bytes)
                try buckets[number].withLock { (state: inout BucketState) throws(MagpieError) in try state.finishSeal(memtable, write: deferred) }
            }
        } catch {
            buckets[number].withLock { $0.abandonSeal(memtable, failure: reported ? nil : error, countingLost: !ownStore) }
            shared.logs.sealFailed.record(
                error: "\(error)", metadata: ["path": "\(shared.directory.path(.buckets, DiskTier.bucketName(number, count: bucketCount)))"])
            throw error
        }
        originalBytes.add(UInt64(original), ordering: .relaxed)
        storedBytes.add(UInt64(stored), ordering: .relaxed)
        return true
    }

    /// The sealer thread's work: one bucket's sealing memtable (a failure is counted and logged by
    /// `sealBucket`).
    func sealInBackground(_ number: Int) {
        _ = try? sealBucket(number, reported: false)
    }

    /// Writes every memtable bucket `number` holds now (its sealing one, then its active one), on this
    /// thread or, for one another thread has taken, by waiting for it. Records stored meanwhile may wait
    /// for the next call.
    func writeMemtables(_ number: Int) throws(MagpieError) {
        let targets = buckets[number].withLock { state -> [Memtable] in
            guard state.isOpen && state.life.loaded else { return [] }
            return [state.memtables.sealing, state.memtables.active].compactMap { $0 }.filter { !$0.isEmpty }
        }
        var failure: MagpieError? = nil
        for target in targets {
            while true {
                let before = sealer.completed
                enum Step { case done, seal, wait }
                let step = buckets[number].withLock { state -> Step in
                    guard state.isOpen else { return .done }
                    if state.memtables.sealing === target { return state.memtables.sealingClaimed ? .wait : .seal }
                    if state.memtables.active === target {
                        guard state.memtables.sealing == nil else { return state.memtables.sealingClaimed ? .wait : .seal }
                        state.memtables.detach()
                        return .seal
                    }
                    return .done  // written (or dropped by `removeAll`) meanwhile
                }
                switch step {
                case .done:
                    break
                case .seal:
                    do { try sealBucket(number) } catch { failure = failure ?? error }
                    continue
                case .wait:
                    sealer.waitForCompletion(after: before)
                    continue
                }
                break
            }
        }
        // A memtable the sealer failed to write since the last call (or while this one waited for it): its
        // stores are lost, and this call must not return as if everything stored had reached the file.
        let background = buckets[number].withLock { state in
            defer { state.memtables.sealFailure = nil }
            return state.memtables.sealFailure
        }
        if let failure = failure ?? background { throw failure }
    }
}
