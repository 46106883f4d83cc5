import Glibc
import Synchronization

/// One lock stripe of the memory tier: a `ShardStorage` and the mutex that guards it, and the word through
/// which hits find the index without the mutex (Memory/LockFreeRead.swift).
///
/// The lock is a ``PThreadMutex`` of the adaptive kind (it spins briefly before sleeping, which suits
/// critical sections of tens of nanoseconds).
///
/// Memory: one 64-byte-aligned block holding the mutex in its first cache line and the storage from
/// the second, so a shard's lock word never shares a cache line with another shard's data.
@usableFromInline
final class Shard: @unchecked Sendable {
    // @unchecked Sendable invariant: `storage` is read and written only inside `withLock`, while
    // `mutex` is held; both pointers are set once in init and freed once in deinit. `published` belongs
    // to the storage (freed with it); outside the lock it is only loaded, atomically.
    private let mutex: PThreadMutex
    /// The storage's published table address (see ``ShardStorage/published``).
    let published: UnsafeMutablePointer<Atomic<UInt>>
    private let storage: UnsafeMutablePointer<ShardStorage>
    private let block: UnsafeMutableRawPointer

    /// The mutex's size rounded up to whole cache lines (one line on x86-64 and arm64 glibc).
    private static let storageOffset = (PThreadMutex.size + 63) & ~63

    init?(budget: Int, hasher: KeyHash, clock: CacheClock, pool: BudgetPool, largestCharge: Int) {
        guard
            let initial = ShardStorage(
                budget: budget, hasher: hasher, clock: clock, pool: pool, largestCharge: largestCharge)
        else { return nil }
        var raw: UnsafeMutableRawPointer? = nil
        guard posix_memalign(&raw, 64, Self.storageOffset + MemoryLayout<ShardStorage>.stride) == 0,
            let raw
        else { return nil }
        block = raw
        mutex = PThreadMutex(at: raw, adaptive: true)
        storage = (raw + Self.storageOffset).bindMemory(to: ShardStorage.self, capacity: 1)
        storage.initialize(to: initial)
        published = storage.pointee.published
    }

    deinit {
        storage.deinitialize(count: 1)
        mutex.destroy()
        free(block)
    }

    /// Runs `body` with exclusive access to the storage.
    @inline(__always)
    func withLock<R, E: Error>(_ body: (inout ShardStorage) throws(E) -> R) throws(E) -> R {
        mutex.lock()
        defer { mutex.unlock() }
        return try body(&storage.pointee)
    }
}
