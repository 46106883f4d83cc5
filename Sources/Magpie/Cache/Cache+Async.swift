import Foundation

// The async API: the same operations as the synchronous one, with disk I/O on the cache's dedicated
// I/O threads. `nonisolated(nonsending)` keeps each call on its caller's executor, so a memory hit
// returns without a hop; only a disk access moves to an I/O thread and back.

extension Cache {
    /// The value stored for `key`, or nil. A memory hit returns at once on the caller's executor; a miss
    /// reads disk on an I/O thread and promotes the value, as `value(forKey:)` does.
    /// - Throws: `CancellationError` if the task is cancelled before the disk read starts; the
    ///   synchronous form's errors.
    nonisolated(nonsending)
    public func value(forKey key: String) async throws -> [UInt8]? {
        if let value = memory.value(forKey: key) { return value }
        guard disk != nil else {
            try checkOpen()
            return nil
        }
        return try await pool.run { [self] () throws(MagpieError) -> [UInt8]? in
            try withKey(key) { key throws(MagpieError) in try _valueAfterMemoryMiss(key) }
        }
    }

    /// `value(forKey:)` as `Data`, asynchronously.
    nonisolated(nonsending)
    public func data(forKey key: String) async throws -> Data? {
        try await value(forKey: key).map { Data($0) }
    }

    /// Stores `value` for `key`; the disk write runs on an I/O thread. See `set(_:forKey:options:)`.
    nonisolated(nonsending)
    public func set(_ value: some Sequence<UInt8> & Sendable, forKey key: String, options: EntryOptions? = nil) async throws {
        try await onDisk { [self] () throws(MagpieError) in try set(value, forKey: key, options: options) }
    }

    /// Removes `key` from both tiers; see `removeValue(forKey:)`.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: String) async throws -> Bool {
        try await onDisk { [self] () throws(MagpieError) -> Bool in try removeValue(forKey: key) }
    }

    /// Removes every entry; see `removeAll()`.
    nonisolated(nonsending)
    public func removeAll() async throws {
        try await onDisk { [self] () throws(MagpieError) in try removeAll() }
    }

    /// Removes a group's entries from both tiers; see `removeAll(inGroup:)`.
    @discardableResult nonisolated(nonsending)
    public func removeAll(inGroup group: String) async throws -> RemovedEntries {
        try await onDisk { [self] () throws(MagpieError) -> RemovedEntries in try removeAll(inGroup: group) }
    }

    /// Removes expired entries from both tiers; see `removeExpired()`.
    @discardableResult nonisolated(nonsending)
    public func removeExpired() async throws -> RemovedEntries {
        try await onDisk { [self] () throws(MagpieError) -> RemovedEntries in try removeExpired() }
    }

    /// Whether `key` has a live value in either tier; see `contains(_:)`.
    nonisolated(nonsending)
    public func contains(_ key: String) async throws -> Bool {
        if memory.contains(key) { return true }
        return try await onDisk { [self] () throws(MagpieError) -> Bool in try contains(key) }
    }

    /// Makes everything written so far durable; see `flush()`.
    nonisolated(nonsending)
    public func flush() async throws {
        try await onDisk { [self] () throws(MagpieError) in try flush() }
    }

    /// Runs `work` on an I/O thread when there is a disk tier, else right here (memory work never blocks).
    nonisolated(nonsending)
    func onDisk<R: Sendable>(_ work: @escaping @Sendable () throws(MagpieError) -> R) async throws -> R {
        guard disk != nil else { return try work() }
        try checkOpen()
        return try await pool.run(work)
    }
}
