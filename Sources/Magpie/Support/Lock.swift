import CMagpieGuard
import Glibc

/// The library's one lock: a `pthread_mutex_t` at a fixed address, which its owner allocates (alone,
/// at the head of a shard's block, or one per cache line in ``LockStripes``) and destroys.
///
/// Why not `Synchronization.Mutex`: its `withLock` hands the value out as `inout sending`, which forbids
/// passing the caller's (non-`Sendable`) key and value buffers into the critical section, and Thread
/// Sanitizer cannot see its atomics, while it understands pthread mutexes, so the stress suites run
/// under TSan. The adaptive kind (a Linux kind: it spins briefly before sleeping) suits the memory
/// tier's critical sections of tens of nanoseconds.
struct PThreadMutex {
    // Invariant: `mutex` points at memory that never moves, initialised by `init` and destroyed once by
    // `destroy()`; in between it is touched only through pthread_mutex_lock/unlock, which are thread safe.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    /// Bytes a mutex takes.
    static let size = MemoryLayout<pthread_mutex_t>.size

    /// Initialises a mutex in `memory` (at least ``size`` bytes, suitably aligned).
    init(at memory: UnsafeMutableRawPointer, adaptive: Bool = false) {
        mutex = memory.bindMemory(to: pthread_mutex_t.self, capacity: 1)
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        if adaptive { pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP)) }
        pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
    }

    @inline(__always) func lock() { pthread_mutex_lock(mutex) }
    @inline(__always) func unlock() { pthread_mutex_unlock(mutex) }

    /// Takes the mutex if it is free now or within a short spin (``spinAttempts`` tries, eight CPU
    /// pauses between them: 512 pauses in all when the mutex stays held, about 10 µs where a pause is
    /// 65 cycles (AMD Zen) and 25 µs where it is 140 (Intel since Skylake), against the 40-60 µs of a hop
    /// to an I/O thread and back on the project's VMs; a page-cache disk read holds a bucket for a few);
    /// false (not taken) otherwise. Never sleeps: for a caller that must not wait on a holder that may be
    /// waiting for the disk.
    @inline(__always) func tryLockSpinning() -> Bool {
        for _ in 0..<Self.spinAttempts {
            if pthread_mutex_trylock(mutex) == 0 { return true }
            for _ in 0..<8 { magpie_cpu_relax() }
        }
        return false
    }

    /// Tries of ``tryLockSpinning()``.
    static let spinAttempts = 64

    /// Runs `body` with the mutex held.
    @inline(__always)
    func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// The mutex already initialised in `memory` (by ``init(at:adaptive:)``).
    init(initialized memory: UnsafeMutableRawPointer) {
        mutex = memory.assumingMemoryBound(to: pthread_mutex_t.self)
    }

    /// Destroys the mutex; its memory is the owner's to free.
    func destroy() { pthread_mutex_destroy(mutex) }
}

/// A value guarded by a ``PThreadMutex``.
package final class Locked<State>: @unchecked Sendable {
    // @unchecked Sendable invariant: `state` is read and written only inside `withLock`, with `mutex`
    // held. The mutex and the state live in allocations of their own, so neither ever moves, and the
    // state is reached through a pointer: no dynamic exclusivity check per access (the lock is what
    // makes accesses exclusive).
    private let mutex: PThreadMutex
    private let state: UnsafeMutablePointer<State>

    package init(_ state: State) {
        self.state = UnsafeMutablePointer<State>.allocate(capacity: 1)
        self.state.initialize(to: state)
        mutex = PThreadMutex(at: UnsafeMutableRawPointer.allocate(byteCount: PThreadMutex.size, alignment: 16))
    }

    deinit {
        state.deinitialize(count: 1)
        state.deallocate()
        mutex.destroy()
        mutex.address.deallocate()
    }

    /// Where the mutex and the state live (they never move while this object lives): for prefetching
    /// (Disk/BucketReadHints.swift), never for access.
    var addresses: (mutex: UnsafeRawPointer, state: UnsafeRawPointer) {
        (UnsafeRawPointer(mutex.address), UnsafeRawPointer(state))
    }

    /// Runs `body` with exclusive access to the state.
    package func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        mutex.lock()
        defer { mutex.unlock() }
        return try body(&state.pointee)
    }

    /// Runs `body` with exclusive access to the state if no one holds it now or within a short spin
    /// (``PThreadMutex/tryLockSpinning()``); nil (`body` not run) otherwise. For a caller that must not
    /// wait long (an async read tried on the caller's task).
    func withLockIfAvailable<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R? {
        guard mutex.tryLockSpinning() else { return nil }
        defer { mutex.unlock() }
        return try body(&state.pointee)
    }
}

extension PThreadMutex {
    /// Where the mutex lives (for its owner to free).
    var address: UnsafeMutableRawPointer { UnsafeMutableRawPointer(mutex) }
}
