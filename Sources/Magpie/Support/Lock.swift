import Glibc

/// A value guarded by a `pthread_mutex_t`.
///
/// Used where `Synchronization.Mutex` does not fit: its `withLock` hands the value out as
/// `inout sending`, which forbids passing the caller's (non-`Sendable`) key and value buffers into the
/// critical section, and Thread Sanitizer cannot see its atomics. A pthread mutex is visible to TSan.
final class Locked<State>: @unchecked Sendable {
    // @unchecked Sendable invariant: `state` is read and written only inside `withLock`, with `mutex`
    // held. The mutex lives in its own allocation so it never moves.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var state: State

    init(_ state: State) {
        self.state = state
        mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the state.
    func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&state)
    }
}
