import Dispatch

// One running load of a key and the callers waiting for it (see LoadCoordinator.swift for the protocol).
//
// A caller waits either in a task (a continuation) or on its thread (a semaphore: the synchronous
// loader API). Each waiter is resumed exactly once, by whichever comes first: the load's result, its
// own soft or hard timeout (a timer task that sleeps on the cache's clock), or, for a task, its
// cancellation. A waiter that leaves by timeout *detaches* the flight: the load then runs to its end
// and lands in the cache whatever happens to the other waiters; so does a background refresh, which
// has no waiter at all. A flight that is not detached and loses its last waiter to cancellation is
// abandoned: its task is cancelled and a later caller starts afresh.

/// What ended one caller's wait.
enum LoadOutcome: Sendable {
    /// The load finished (nil: it found no value).
    case loaded(Result<[UInt8]?, any Error>)
    case softTimeout
    case hardTimeout
}

/// The code a load runs: the async API's closure (run in a task of its own) or the synchronous API's
/// (run on the caller's thread or a loader thread).
enum LoadWork: Sendable {
    case async(@Sendable () async throws -> [UInt8]?)
    case blocking(@Sendable () throws -> [UInt8]?)
}

/// One running load and the callers waiting for it.
final class Flight: Sendable {
    private enum Waiter {
        case task(CheckedContinuation<LoadOutcome, any Error>)
        case thread(BlockingSlot)

        func resume(with outcome: Result<LoadOutcome, any Error>) {
            switch self {
            case .task(let continuation): continuation.resume(with: outcome)
            case .thread(let slot): slot.fill(outcome)
            }
        }
    }

    private struct State {
        var waiters: [Int: Waiter] = [:]
        /// Waiters cancelled or timed out before their continuation arrived, and how.
        var gone: [Int: Result<LoadOutcome, any Error>] = [:]
        var members = 0
        var nextID = 0
        var result: Result<[UInt8]?, any Error>? = nil
        var task: Task<Void, Never>? = nil
        var abandoned = false
        var detached: Bool
    }

    private let state: Locked<State>
    /// Held while the load's value lands in the cache; true once a write of the key (a store, a removal,
    /// a group removal) has made the load's value out of date, so that it must not land.
    let superseded = Locked<Bool>(false)
    /// The key's bytes (`Cache.flights` is keyed by the key's hash).
    let name: [UInt8]
    /// The stale value the flight's starter found (fail-safe's candidate, see `Cache.land`).
    let fallback: StoredEntry?
    let options: LoaderOptions

    /// A flight; `detached` for a background refresh (no caller's cancellation may cancel it).
    init(name: [UInt8], fallback: StoredEntry?, options: LoaderOptions, detached: Bool) {
        self.name = name
        self.fallback = fallback
        self.options = options
        state = Locked(State(detached: detached))
    }

    /// Registers a caller; false if the flight was abandoned (every caller cancelled) or has ended.
    func join() -> Bool {
        state.withLock { state in
            guard !state.abandoned, state.result == nil else { return false }
            state.members += 1
            return true
        }
    }

    func start(_ task: Task<Void, Never>) {
        let abandoned = state.withLock { state -> Bool in
            state.task = task
            return state.abandoned
        }
        if abandoned { task.cancel() }
    }

    private func nextID() -> Int {
        state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
    }

    /// Waits in a task for the load, or a timeout of `timers`. `onAbandon` runs (outside the flight's
    /// lock) if this caller's cancellation leaves no caller waiting on a flight that is not detached,
    /// just before the load's task is cancelled.
    func wait(timers: LoadTimers, clock: CacheClock, onAbandon: @escaping @Sendable () -> Void) async throws -> LoadOutcome {
        let id = nextID()
        let timer = timers.start(for: self, waiter: id, clock: clock)
        defer { timer?.cancel() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<LoadOutcome, any Error>) in
                register(id, .task(continuation))
            }
        } onCancel: {
            let (waiter, abandoned, task) = state.withLock { state -> (Waiter?, Bool, Task<Void, Never>?) in
                guard state.result == nil, state.gone[id] == nil else { return (nil, false, nil) }  // ended already
                let waiter = state.waiters.removeValue(forKey: id)
                state.gone[id] = .failure(CancellationError())
                state.members -= 1
                guard state.members == 0, !state.detached else { return (waiter, false, nil) }
                state.abandoned = true
                return (waiter, true, state.task)
            }
            waiter?.resume(with: .failure(CancellationError()))
            if abandoned {
                onAbandon()
                task?.cancel()
            }
        }
    }

    /// Waits on the calling thread for the load, or a timeout of `timers`.
    func waitBlocking(timers: LoadTimers, clock: CacheClock) -> LoadOutcome {
        let id = nextID()
        let slot = BlockingSlot()
        let timer = timers.start(for: self, waiter: id, clock: clock)
        defer { timer?.cancel() }
        register(id, .thread(slot))
        // Only `.failure(CancellationError)` could be thrown, and a thread waiter is never cancelled.
        return (try? slot.take().get()) ?? .hardTimeout
    }

    /// Resumes the waiter at once if the load has ended or the waiter has gone; else records it.
    private func register(_ id: Int, _ waiter: Waiter) {
        let immediate = state.withLock { state -> Result<LoadOutcome, any Error>? in
            if let gone = state.gone.removeValue(forKey: id) { return gone }
            if let result = state.result { return .success(.loaded(result)) }
            state.waiters[id] = waiter
            return nil
        }
        if let immediate { waiter.resume(with: immediate) }
    }

    /// Ends waiter `id`'s wait with a timeout, if it is still waiting: the flight is detached (its load
    /// goes on). Returns false if the waiter's wait had already ended.
    @discardableResult
    func timeOut(_ id: Int, _ outcome: LoadOutcome) -> Bool {
        let (waiter, timedOut) = state.withLock { state -> (Waiter?, Bool) in
            guard state.result == nil, state.gone[id] == nil else { return (nil, false) }
            let waiter = state.waiters.removeValue(forKey: id)
            state.gone[id] = .success(outcome)
            state.members -= 1
            state.detached = true
            return (waiter, true)
        }
        waiter?.resume(with: .success(outcome))
        return timedOut
    }

    /// Delivers the result to every waiter, exactly once.
    func finish(_ result: Result<[UInt8]?, any Error>) {
        let waiters = state.withLock { state -> [Waiter] in
            state.result = result
            let waiters = Array(state.waiters.values)
            state.waiters = [:]
            return waiters
        }
        for waiter in waiters { waiter.resume(with: .success(.loaded(result))) }
    }
}

/// A caller's soft and hard timeouts (either may be nil).
struct LoadTimers: Sendable {
    var soft: Duration?
    var hard: Duration?

    /// Starts the timer task that ends waiter `id`'s wait at its timeouts; nil when there are none.
    func start(for flight: Flight, waiter id: Int, clock: CacheClock) -> Task<Void, Never>? {
        var soft = self.soft
        if let hard, let chosen = soft, chosen >= hard { soft = nil }  // the hard timeout comes first
        guard soft != nil || hard != nil else { return nil }
        return Task { [soft, hard] in
            if let soft {
                // A soft timeout ends the wait (the caller serves its stale value, or waits anew).
                do { try await clock.sleep(soft) } catch { return }
                flight.timeOut(id, .softTimeout)
            } else if let hard {
                do { try await clock.sleep(hard) } catch { return }
                flight.timeOut(id, .hardTimeout)
            }
        }
    }
}

/// Where a thread waiting for a load receives its outcome.
final class BlockingSlot: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    private let outcome = Locked<Result<LoadOutcome, any Error>?>(nil)

    func fill(_ value: Result<LoadOutcome, any Error>) {
        outcome.withLock { $0 = value }
        semaphore.signal()
    }

    func take() -> Result<LoadOutcome, any Error> {
        semaphore.wait()
        return outcome.withLock { $0 } ?? .failure(CancellationError())  // filled before the signal
    }
}
