import Synchronization

/// Async locks striped by key: a task waiting for a stripe suspends (it never blocks its thread), and a
/// stripe is handed to its waiters in the order they came. Held only across one key's cache calls.
final class KeyLocks: Sendable {
    private let stripes: [Stripe]

    init(stripeCount: Int = 64) {
        stripes = (0..<max(1, stripeCount)).map { _ in Stripe() }
    }

    /// Runs `body` holding `key`'s stripe.
    func withLock<Result: Sendable>(
        _ key: String, _ body: () async throws -> Result
    ) async throws -> Result {
        let stripe = stripes[Int(UInt(bitPattern: key.hashValue) % UInt(stripes.count))]
        await stripe.acquire()
        defer { stripe.release() }
        return try await body()
    }

    final class Stripe: Sendable {
        struct State {
            var held = false
            /// First come, first served; `head` is the next to run (the array is compacted when empty).
            var waiters: [CheckedContinuation<Void, Never>] = []
            var head = 0
        }
        let state = Mutex(State())

        func acquire() async {
            let free = state.withLock { state -> Bool in
                if state.held { return false }
                state.held = true
                return true
            }
            if free { return }
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let owned = state.withLock { state -> Bool in
                    if !state.held {
                        state.held = true
                        return true
                    }
                    state.waiters.append(continuation)
                    return false
                }
                if owned { continuation.resume() }
            }
        }

        /// Hands the stripe to the first waiter (it stays held), or frees it.
        func release() {
            let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard state.head < state.waiters.count else {
                    state.held = false
                    state.waiters.removeAll(keepingCapacity: true)
                    state.head = 0
                    return nil
                }
                let next = state.waiters[state.head]
                state.head += 1
                if state.head >= 32 && state.head * 2 >= state.waiters.count {  // a stripe never idle
                    state.waiters.removeFirst(state.head)
                    state.head = 0
                }
                return next
            }
            next?.resume()
        }
    }
}
