/// A fixed array of ``PThreadMutex``es, one per cache line, picked by a key's hash: `Cache` holds a
/// key's stripe while it changes both tiers for that key, or reads disk and promotes into memory, so
/// those steps never interleave for one key. Bulk operations (remove all, remove a group) hold every
/// stripe, in index order, so no promotion can slip a value removed from disk back into memory.
final class LockStripes: @unchecked Sendable {
    // @unchecked Sendable invariant: the mutexes are initialised in `init`, destroyed in `deinit`, and
    // otherwise only locked and unlocked, which is thread safe. The memory never moves. Stripe i lives
    // at byte offset i × stride, so two stripes never share a cache line.
    private static let stride = 64
    private let base: UnsafeMutableRawPointer
    let count: Int
    private let mask: Int

    /// `count` must be a power of two.
    init(count: Int) {
        precondition(count > 0 && count & (count - 1) == 0, "stripe count must be a power of two")
        self.count = count
        mask = count - 1
        base = UnsafeMutableRawPointer.allocate(byteCount: count * Self.stride, alignment: Self.stride)
        for index in 0..<count { _ = PThreadMutex(at: base + index * Self.stride) }
    }

    deinit {
        for index in 0..<count { mutex(index).destroy() }
        base.deallocate()
    }

    private func mutex(_ index: Int) -> PThreadMutex {
        PThreadMutex(initialized: base + index * Self.stride)
    }

    /// Runs `body` with the stripe of `hash` held. Bits 32 and up pick the stripe, so stripes stay
    /// independent of the memory tier's shard bits.
    func withLock<R, E: Error>(for hash: UInt64, _ body: () throws(E) -> R) throws(E) -> R {
        try mutex(Int(truncatingIfNeeded: hash >> 32) & mask).withLock(body)
    }

    /// Locks the stripe of `hash` (for a caller that cannot pass a closure without a cost: pair it with
    /// ``unlock(for:)`` in a `defer`).
    @inline(__always)
    func lock(for hash: UInt64) { mutex(Int(truncatingIfNeeded: hash >> 32) & mask).lock() }

    @inline(__always)
    func unlock(for hash: UInt64) { mutex(Int(truncatingIfNeeded: hash >> 32) & mask).unlock() }

    /// Locks the stripe of `hash` if no one holds it now or within a short spin
    /// (``PThreadMutex/tryLockSpinning()``); false (not locked) otherwise. Pair a true with
    /// ``unlock(for:)``.
    @inline(__always)
    func tryLock(for hash: UInt64) -> Bool { mutex(Int(truncatingIfNeeded: hash >> 32) & mask).tryLockSpinning() }

    /// Runs `body` with every stripe held (taken in index order, so two callers cannot deadlock).
    func withAllLocked<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        for index in 0..<count { mutex(index).lock() }
        defer { for index in (0..<count).reversed() { mutex(index).unlock() } }
        return try body()
    }
}
