import Glibc

/// One lock stripe of the memory tier: a `ShardStorage` and the mutex that guards it.
///
/// The lock is a `pthread_mutex_t` of the adaptive kind (spins briefly before sleeping, which suits
/// critical sections of tens of nanoseconds), not `Synchronization.Mutex`, for two reasons:
/// `Mutex.withLock` hands out its value as `inout sending`, which forbids passing the caller's key and
/// value buffers (non-`Sendable` pointers) into the critical section; and Thread Sanitizer understands
/// pthread mutexes but not `Mutex`'s precompiled atomics, so the stress suite can run under TSan.
///
/// Memory: one 64-byte-aligned block holding the mutex in its first cache line and the storage from
/// the second, so a shard's lock word never shares a cache line with another shard's data.
@usableFromInline
final class Shard: @unchecked Sendable {
    // @unchecked Sendable invariant: `storage` is read and written only inside `withLock`, while
    // `mutex` is held; both pointers are set once in init and freed once in deinit.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let storage: UnsafeMutablePointer<ShardStorage>
    private let block: UnsafeMutableRawPointer

    /// The mutex's size rounded up to whole cache lines (one line on x86-64 and arm64 glibc).
    private static let storageOffset = (MemoryLayout<pthread_mutex_t>.size + 63) & ~63

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
        mutex = raw.bindMemory(to: pthread_mutex_t.self, capacity: 1)
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
        pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        storage = (raw + Self.storageOffset).bindMemory(to: ShardStorage.self, capacity: 1)
        storage.initialize(to: initial)
    }

    deinit {
        storage.deinitialize(count: 1)
        pthread_mutex_destroy(mutex)
        free(block)
    }

    /// Runs `body` with exclusive access to the storage.
    @inline(__always)
    func withLock<R, E: Error>(_ body: (inout ShardStorage) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&storage.pointee)
    }
}
