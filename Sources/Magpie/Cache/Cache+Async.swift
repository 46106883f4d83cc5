import Foundation

// The async API: the same operations as the synchronous one, with disk I/O on the cache's dedicated
// I/O threads, reached through `cache.async`.
//
// Why a view and not overloads of the synchronous names: in an async function Swift prefers an async
// overload over a synchronous one of the same name whether or not the call is marked `await` (and
// `@_disfavoredOverload` on the async form does not change that: the compiler ranks "synchronous call in
// an async context" above "disfavored"), so `try cache.value(forKey:)` would not compile there. With the
// async forms on their own view, both read naturally in any context: `try cache.value(forKey: k)` blocks
// for disk I/O on the calling thread, `try await cache.async.value(forKey: k)` suspends for it. (The
// classic Swift caches did the same, e.g. a `storage.async` view; SwiftNIO gives its blocking forms
// distinct names, `syncShutdownGracefully()` beside `shutdownGracefully()`.)
//
// `nonisolated(nonsending)` keeps each call on its caller's executor, so a memory hit returns without a
// hop; only a disk access moves to an I/O thread and back.

extension Cache {
    /// The asynchronous forms of the cache's operations: disk I/O runs on the cache's I/O threads
    /// (``Configuration/ioThreadCount``), never on Swift's cooperative pool, and a memory hit returns on
    /// the caller's executor without a hop.
    ///
    /// ```swift
    /// try await cache.async.set(bytes, forKey: "avatar:42")
    /// let avatar = try await cache.async.value(forKey: "avatar:42")
    /// ```
    public var async: AsyncCache { AsyncCache(cache: self) }
}

/// The asynchronous view of a ``Cache`` (see ``Cache/async``): the synchronous operations' `async` forms.
/// Each throws what its synchronous form throws, and `CancellationError` if the task is cancelled before
/// its disk work starts.
public struct AsyncCache: Sendable {
    /// The cache underneath.
    public let cache: Cache

    /// The value stored for `key`, or nil; see ``Cache/value(forKey:)-(String)``.
    nonisolated(nonsending)
    public func value(forKey key: String) async throws -> [UInt8]? {
        try await value(forKey: key.utf8)
    }

    /// ``value(forKey:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func value(forKey key: some Sequence<UInt8>) async throws -> [UInt8]? {
        if cache.hasRemote {
            let key = Array(key)
            return try await cache.onDisk { [cache] () throws(MagpieError) -> [UInt8]? in try cache.value(forKey: key) }
        }
        // The key is hashed once, here; the hash travels with a copy of its bytes to the I/O thread.
        let (value, hash) = try cache.withHashedKey(key) { key throws(MagpieError) in (cache.memory.copyValue(key), key.hash) }
        if let value { return value }
        return try await cache.diskValue(Array(key), hash: hash)
    }

    /// The value stored for `key` as `Data`; see ``Cache/data(forKey:)-(String)``.
    nonisolated(nonsending)
    public func data(forKey key: String) async throws -> Data? {
        try await value(forKey: key).map { Data($0) }
    }

    /// ``data(forKey:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func data(forKey key: some Sequence<UInt8>) async throws -> Data? {
        try await value(forKey: key).map { Data($0) }
    }

    /// Whether `key` has a live value in either tier; see ``Cache/contains(_:)-(String)``.
    nonisolated(nonsending)
    public func contains(_ key: String) async throws -> Bool {
        try await contains(key.utf8)
    }

    /// ``contains(_:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func contains(_ key: some Sequence<UInt8>) async throws -> Bool {
        if cache.hasRemote {
            let key = Array(key)
            return try await cache.onDisk { [cache] () throws(MagpieError) -> Bool in try cache.contains(key) }
        }
        let (found, hash) = try cache.withHashedKey(key) { key throws(MagpieError) in (cache.memory.contains(key), key.hash) }
        if found { return true }
        let key = Array(key)
        return try await cache.onDisk { [cache] () throws(MagpieError) -> Bool in
            try cache.withHashedKey(key, hash: hash) { key throws(MagpieError) in try cache.containsAfterMemoryMiss(key) }
        }
    }

    /// Stores `value` for `key`; see ``Cache/set(_:forKey:options:)-(_,String,_)``.
    nonisolated(nonsending)
    public func set(_ value: some Sequence<UInt8> & Sendable, forKey key: String, options: EntryOptions? = nil) async throws {
        try await cache.onDisk { [cache] () throws(MagpieError) in try cache.set(value, forKey: key, options: options) }
    }

    /// ``set(_:forKey:options:)-(_,String,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func set(
        _ value: some Sequence<UInt8> & Sendable, forKey key: some Sequence<UInt8>, options: EntryOptions? = nil
    ) async throws {
        let key = Array(key)
        try await cache.onDisk { [cache] () throws(MagpieError) in try cache.set(value, forKey: key, options: options) }
    }

    /// Removes `key` from both tiers; see ``Cache/removeValue(forKey:)-(String)``.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: String) async throws -> Bool {
        try await cache.onDisk { [cache] () throws(MagpieError) -> Bool in try cache.removeValue(forKey: key) }
    }

    /// ``removeValue(forKey:)-(String)`` for a key of arbitrary bytes.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: some Sequence<UInt8>) async throws -> Bool {
        let key = Array(key)
        return try await cache.onDisk { [cache] () throws(MagpieError) -> Bool in try cache.removeValue(forKey: key) }
    }

    /// Removes every entry; see ``Cache/removeAll()``.
    nonisolated(nonsending)
    public func removeAll() async throws {
        try await cache.onDisk { [cache] () throws(MagpieError) in try cache.removeAll() }
    }

    /// Removes a group's entries from both tiers; see ``Cache/removeAll(inGroup:)``.
    @discardableResult nonisolated(nonsending)
    public func removeAll(inGroup group: String) async throws -> RemovedEntries {
        try await cache.onDisk { [cache] () throws(MagpieError) -> RemovedEntries in try cache.removeAll(inGroup: group) }
    }

    /// Removes expired entries from both tiers; see ``Cache/removeExpired()``.
    @discardableResult nonisolated(nonsending)
    public func removeExpired() async throws -> RemovedEntries {
        try await cache.onDisk { [cache] () throws(MagpieError) -> RemovedEntries in try cache.removeExpired() }
    }

    /// Makes everything written so far durable; see ``Cache/flush()``.
    nonisolated(nonsending)
    public func flush() async throws {
        try await cache.onDisk { [cache] () throws(MagpieError) in try cache.flush() }
    }
}

extension Cache {
    /// An async read of a key whose hash is known: memory, then disk on an I/O thread.
    nonisolated(nonsending)
    func value(_ key: [UInt8], hash: UInt64) async throws -> [UInt8]? {
        if hasRemote { return try await onDisk { [self] () throws(MagpieError) -> [UInt8]? in try value(forKey: key) } }
        if let value = try withHashedKey(key, hash: hash, { key throws(MagpieError) in memory.copyValue(key) }) { return value }
        return try await diskValue(key, hash: hash)
    }

    /// The disk half of an async read, on an I/O thread.
    nonisolated(nonsending)
    func diskValue(_ key: [UInt8], hash: UInt64) async throws -> [UInt8]? {
        try await onDisk { [self] () throws(MagpieError) -> [UInt8]? in
            try withHashedKey(key, hash: hash) { key throws(MagpieError) in try valueAfterMemoryMiss(key) }
        }
    }

    /// Runs `work` on an I/O thread when there is a disk tier, else right here (memory work never blocks).
    nonisolated(nonsending)
    func onDisk<R: Sendable>(_ work: @escaping @Sendable () throws(MagpieError) -> R) async throws -> R {
        guard disk != nil || remote != nil else { return try work() }
        try checkOpen()
        return try await pool.run(work)
    }
}
