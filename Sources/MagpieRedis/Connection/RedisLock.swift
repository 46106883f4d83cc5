import NIOConcurrencyHelpers

/// A value behind a lock, for the client's shared state.
///
/// Why not `Synchronization.Mutex` (which the client used first): on Linux its contended path is a
/// `FUTEX_LOCK_PI` system call inside the uninstrumented standard library, so Thread Sanitizer sees no
/// ordering between one holder and the next and reports races that are not there (seen in `make tsan`
/// as soon as a pool's health check contended with its callers); worse, it would hide real ones behind
/// that noise. swift-nio's lock is a `pthread_mutex_t`, which TSan understands. Same cost when
/// uncontended.
struct RedisLock<Value: Sendable>: Sendable {
    private let box: NIOLockedValueBox<Value>

    init(_ value: Value) {
        box = NIOLockedValueBox(value)
    }

    /// Runs `body` with exclusive access to the value. `body` must not take this lock again.
    func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        let outcome: Swift.Result<Result, Failure> = box.withLockedValue { value in
            do throws(Failure) {
                return .success(try body(&value))
            } catch {
                return .failure(error)
            }
        }
        return try outcome.get()
    }
}
