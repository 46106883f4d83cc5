import Synchronization

/// Per-process single flight, as a careful user writes it around a cache-aside miss: one load per key
/// in flight; a caller that misses the key while its load runs awaits that load instead of starting
/// another. A lock-protected dictionary of tasks: the first caller starts the load's task and removes it
/// once it ended; the others await the same task.
///
/// (Go's `singleflight` and most hand-written versions are this. It is not fleet-wide: every process
/// that misses the key loads it once.)
final class FleetFlights<Value: Sendable>: Sendable {
    private let flights = Mutex<[String: Task<Value, any Error>]>([:])

    /// `load`'s value, run once for concurrent callers of `key`.
    func run(_ key: String, _ load: @escaping @Sendable () async throws -> Value) async throws -> Value {
        let (task, started) = flights.withLock { flights -> (Task<Value, any Error>, Bool) in
            if let running = flights[key] { return (running, false) }
            let task = Task { try await load() }
            flights[key] = task
            return (task, true)
        }
        let result = await task.result
        if started { flights.withLock { _ = $0.removeValue(forKey: key) } }
        return try result.get()
    }

    /// Loads in flight now.
    var count: Int { flights.withLock { $0.count } }
}
