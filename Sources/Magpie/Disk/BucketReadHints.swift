import CMagpieGuard

// MARK: - Read hints: a read's first cache misses asked for at once, before the bucket's lock
//
// A disk read with the bucket cold in the CPU's caches (the common case: a tier has hundreds of buckets,
// and every read streams a record through the caches) misses several times, each miss waiting for the
// one before: the bucket's mutex, its state (which holds the index), the index's home slot, and only
// then the record. The first three addresses are known before the lock is taken, from the key's hash
// alone, if the tier keeps them apart: the mutex and the state never move (``Locked`` allocates them
// once), and the index's slot storage moves only when the index is rebuilt or grows. So `DiskTier.entry`
// prefetches all three first, and the lock, the state and the probe then find their lines arriving
// (docs/lab-notes/disk.md: the read path's arrays and prefetches).
//
// A hint is only ever a prefetch address: a prefetch never faults and reads nothing the program sees, so
// an index storage that moved since its hint was taken costs one wasted prefetch, never a wrong read. Reads
// refresh the hint under the bucket's lock when the storage moved (a store that grows the index leaves
// it stale until the next read). Refreshing costs a reference count round trip on the slots' storage.

/// Per bucket: the addresses of its mutex, its state and its index's slots (with the index's capacity),
/// for ``DiskTier/entry(_:)`` to prefetch before it takes the bucket's lock.
final class BucketReadHints: @unchecked Sendable {
    // @unchecked Sendable invariant: `words` holds `4 × count` words, allocated in init and freed in
    // deinit. Words 0 and 1 of a bucket (its mutex and its state, which never move while the tier lives)
    // are written once, by `register`, which `DiskTier.init` calls before it returns, and only read after,
    // by `prefetch` (from `DiskTier.entry`, which cannot run before). Words 2 and 3 (the index's slot
    // storage and capacity, as a read last saw them under the bucket's lock) are read and written only
    // through relaxed atomic loads and stores (`magpie_load_relaxed`, `magpie_store_relaxed`), so they
    // may be read torn or stale: harmless, since no word is ever dereferenced, only prefetched.
    private let words: UnsafeMutablePointer<UInt>
    private let count: Int

    /// Hints for `count` buckets, all empty until ``register(_:)``.
    init(count: Int) {
        self.count = count
        words = UnsafeMutablePointer<UInt>.allocate(capacity: 4 * max(count, 1))
        words.initialize(repeating: 0, count: 4 * max(count, 1))
    }

    /// Records where each bucket's mutex and state live; once, before any read (see the invariant).
    func register(_ buckets: [Locked<BucketState>]) {
        for (number, bucket) in buckets.enumerated() where number < count {
            let (mutex, state) = bucket.addresses
            words[4 * number] = UInt(bitPattern: mutex)
            words[4 * number + 1] = UInt(bitPattern: state)
        }
    }

    deinit {
        words.deallocate()
    }

    /// Asks for the lines a read of a key with `tag` in bucket `number` will touch first: the bucket's
    /// mutex, its state, and the index's home slot for `tag` (when a read has seen the index).
    @inline(__always)
    func prefetch(bucket number: Int, tag: UInt32) {
        guard number >= 0, number < count else { return }
        let bucket = words + 4 * number
        guard bucket[0] != 0 else { return }  // not registered yet
        magpie_prefetch(UnsafeRawPointer(bitPattern: bucket[0]), PThreadMutex.size)
        magpie_prefetch(UnsafeRawPointer(bitPattern: bucket[1]), MemoryLayout<BucketState>.size)
        let slots = magpie_load_relaxed(bucket + 2)
        let capacity = magpie_load_relaxed(bucket + 3)
        guard slots != 0, capacity != 0 else { return }
        let home = BucketIndex.home(tag, capacity: Int(truncatingIfNeeded: capacity))
        magpie_prefetch(UnsafeRawPointer(bitPattern: slots &+ UInt(truncatingIfNeeded: home) &* UInt(MemoryLayout<DiskSlot>.stride)), MemoryLayout<DiskSlot>.size)
    }

    /// The index hint of bucket `number`: its slots' address and capacity as a read last saw them (for tests).
    func indexHint(bucket number: Int) -> (slots: UInt, capacity: Int) {
        (magpie_load_relaxed(words + 4 * number + 2), Int(magpie_load_relaxed(words + 4 * number + 3)))
    }

    /// Records where bucket `number`'s index keeps its slots now, if that changed. Called with the bucket's
    /// lock held, at the end of every read (`BucketState.readValue`).
    @inline(__always)
    func noteIndex(bucket number: Int, _ index: borrowing BucketIndex) {
        guard number >= 0, number < count else { return }
        let (slots, capacity) = index.storage
        let bucket = words + 4 * number
        if magpie_load_relaxed(bucket + 2) != slots || magpie_load_relaxed(bucket + 3) != capacity {
            magpie_store_relaxed(bucket + 2, slots)
            magpie_store_relaxed(bucket + 3, capacity)
        }
    }
}
