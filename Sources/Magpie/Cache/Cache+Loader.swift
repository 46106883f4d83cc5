// Single-flight loading: concurrent callers that miss the same key share one run of the loader.
//
// `flights` maps a key's bytes to the load running for it. The first caller to miss creates the
// flight and starts the loader in its own unstructured task, so cancelling that caller does not cancel
// the load the others wait for. Every caller (the first included) waits on the flight with its own
// continuation. When the loader returns, the value is stored in the cache *before* the flight leaves
// the map, and a caller that finds no flight re-checks memory under the map's lock: so a caller
// arriving just after a load sees its value instead of starting another (except for entries stored
// disk-only, which that re-check cannot see). If every waiter is cancelled, the load is cancelled and
// the flight leaves the map, so a later caller starts afresh rather than inherit the cancellation.

extension Cache {
    /// The value for `key`; on a miss, `load` produces it, it is stored with `options`, and returned.
    ///
    /// Concurrent callers that miss the same key share one run of `load` (single flight): it runs once
    /// and every caller gets its value. If it throws, every waiting caller gets the error and nothing is
    /// cached. Cancelling one caller resumes that caller with `CancellationError` and leaves the load
    /// running for the others; when every caller has been cancelled, the load's task is cancelled.
    /// A value that cannot be cached (say, larger than a bucket) is still returned, and the failure logged.
    /// - Parameters:
    ///   - key: the key, its UTF-8 bytes.
    ///   - options: how to store the loaded value; nil: ``Configuration/defaultOptions``.
    ///   - load: produces the value; runs in its own task (not the caller's).
    /// - Throws: what `load` throws, `CancellationError`, or the cache's read errors.
    nonisolated(nonsending)
    public func value(
        forKey key: String, options: EntryOptions? = nil, load: @escaping @Sendable () async throws -> [UInt8]
    ) async throws -> [UInt8] {
        try await value(forKey: Array(key.utf8), options: options, load: load)
    }

    /// ``value(forKey:options:load:)-(String,_,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func value(
        forKey key: some Sequence<UInt8>, options: EntryOptions? = nil, load: @escaping @Sendable () async throws -> [UInt8]
    ) async throws -> [UInt8] {
        let name = Array(key)
        let hash = hasher.hash(name)  // the one hash of this call: its reads and its store take it
        while true {
            if let value = try await value(name, hash: hash) { return value }
            let joined = flights.withLock { flights -> (Flight, Bool)? in
                if let flight = flights[name], flight.join() { return (flight, false) }
                // Stored by a flight that just ended?
                if name.withUnsafeBytes({ memory.contains(HashedKey($0, hash: hash)) }) { return nil }
                let flight = Flight()
                _ = flight.join()
                flights[name] = flight
                return (flight, true)
            }
            guard let (flight, isNew) = joined else { continue }
            if isNew {
                counters.loaderRuns.add(1, ordering: .relaxed)
                flight.start(Task { [self] in await runLoad(flight, name: name, hash: hash, options: options, load: load) })
            } else {
                counters.loaderCoalesced.add(1, ordering: .relaxed)
            }
            return try await flight.wait(onAbandon: { [self] in
                flights.withLock { flights in
                    if flights[name] === flight { flights[name] = nil }
                }
            })
        }
    }

    private func runLoad(
        _ flight: Flight, name: [UInt8], hash: UInt64, options: EntryOptions?,
        load: @Sendable () async throws -> [UInt8]
    ) async {
        let result: Result<[UInt8], any Error>
        do {
            result = .success(try await load())
        } catch {
            result = .failure(error)
        }
        if case .success(let value) = result {
            do {
                try await onDisk { [self] () throws(MagpieError) in
                    try withHashedKey(name, hash: hash) { key throws(MagpieError) in
                        try value.withUnsafeBytes { bytes in
                            Result { () throws(MagpieError) in try set(bytes, for: key, options: options) }
                        }.get()
                    }
                }
            } catch {
                logger.warning("magpie: a loaded value could not be cached", metadata: ["error": "\(error)"])
            }
        } else {
            counters.loaderFailures.add(1, ordering: .relaxed)
        }
        flights.withLock { flights in
            if flights[name] === flight { flights[name] = nil }
        }
        flight.finish(result)
    }
}

/// One running load and the callers waiting for it.
final class Flight: Sendable {
    private struct State {
        var waiters: [Int: CheckedContinuation<[UInt8], any Error>] = [:]
        /// Waiters cancelled before their continuation arrived.
        var cancelled: Set<Int> = []
        var members = 0
        var nextID = 0
        var result: Result<[UInt8], any Error>? = nil
        var task: Task<Void, Never>? = nil
        var abandoned = false
    }

    private let state = Locked(State())

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

    /// Waits for the result. `onAbandon` runs (outside the flight's lock) if this caller's cancellation
    /// leaves no caller waiting, just before the load's task is cancelled.
    func wait(onAbandon: @escaping @Sendable () -> Void) async throws -> [UInt8] {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8], any Error>) in
                let immediate = state.withLock { state -> Result<[UInt8], any Error>? in
                    if state.cancelled.remove(id) != nil { return .failure(CancellationError()) }
                    if let result = state.result { return result }
                    state.waiters[id] = continuation
                    return nil
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        } onCancel: {
            let (continuation, abandoned, task) = state.withLock {
                state -> (CheckedContinuation<[UInt8], any Error>?, Bool, Task<Void, Never>?) in
                guard state.result == nil else { return (nil, false, nil) }
                let continuation = state.waiters.removeValue(forKey: id)
                if continuation == nil { state.cancelled.insert(id) }
                state.members -= 1
                guard state.members == 0 else { return (continuation, false, nil) }
                state.abandoned = true
                return (continuation, true, state.task)
            }
            continuation?.resume(throwing: CancellationError())
            if abandoned {
                onAbandon()
                task?.cancel()
            }
        }
    }

    /// Delivers the result to every waiter, exactly once.
    func finish(_ result: Result<[UInt8], any Error>) {
        let waiters = state.withLock { state -> [CheckedContinuation<[UInt8], any Error>] in
            state.result = result
            let waiters = Array(state.waiters.values)
            state.waiters = [:]
            return waiters
        }
        for waiter in waiters { waiter.resume(with: result) }
    }
}
