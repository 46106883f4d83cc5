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
// hop, whatever the tiers; a disk access that may wait moves to an I/O thread and back, and a remote call
// is awaited on the caller's task (the store's event loop does the I/O; no thread waits for it). A read
// (`value(forKey:)`, `lookup`, `contains`, a loader's read of the local tiers) whose disk read cannot wait
// (the record in the page cache, its locks free: `Configuration.inlineResidentDiskReads`) reads on the
// caller's task, since the hop would cost ten times the read; so does a store whose disk half is a
// memtable append that cannot wait (`Configuration.inlineDiskStores`). One read and one store serve the
// synchronous and the async API alike (`ReadWait`, Runtime.immediateOrHop).

extension Cache {
    /// The asynchronous forms of the cache's operations: disk I/O runs on the cache's I/O threads
    /// (``Configuration/ioThreadCount``), never on Swift's cooperative pool, and a memory hit returns on
    /// the caller's executor without a hop. A read (``AsyncCache/value(forKey:)-(String)``, `lookup`,
    /// `contains`, a loader's read of the local tiers) whose record the page cache holds, its bucket's
    /// lock free, is read on the caller's task too: no disk I/O, and no hop
    /// (``Configuration/inlineResidentDiskReads``); so is a store whose disk half is a memtable append
    /// that cannot wait (``Configuration/inlineDiskStores``).
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
        // The key is hashed once, here; the hash travels with a copy of its bytes past memory.
        let (value, hash) = try cache.withHashedKey(key) { key throws(MagpieError) in (cache.memoryValue(key), key.hash) }
        if let value { return value }
        guard let (entry, _) = try await cache.composition.read(Array(key), hash: hash, .value, memory: .nothing),
            !entry.freshness.negative
        else { return nil }
        return entry.value
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

    /// The value for `key` decoded as `type` by `coder`; see ``Cache/value(forKey:as:coder:)-(String,_,_)``.
    nonisolated(nonsending)
    public func value<Value: Codable & Sendable>(forKey key: String, as type: Value.Type, coder: any CacheCoder = JSONCacheCoder())
        async throws -> Value?
    {
        try await TypedCache<Value>(cache, coder: coder).async.value(forKey: key)
    }

    /// ``value(forKey:as:coder:)-(String,_,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func value<Value: Codable & Sendable>(
        forKey key: some Sequence<UInt8>, as type: Value.Type, coder: any CacheCoder = JSONCacheCoder()
    ) async throws -> Value? {
        try await TypedCache<Value>(cache, coder: coder).async.value(forKey: key)
    }

    /// The value stored for `key` with the tier that answered and its freshness; see
    /// ``Cache/lookup(_:)-(String)``.
    nonisolated(nonsending)
    public func lookup(_ key: String) async throws -> CacheHit? {
        try await lookup(key.utf8)
    }

    /// ``lookup(_:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func lookup(_ key: some Sequence<UInt8>) async throws -> CacheHit? {
        let hash = try cache.withHashedKey(key) { $0.hash }
        return try await cache.composition.read(Array(key), hash: hash, .entry).flatMap { CacheHit($0.0, tier: $0.1, clock: cache.runtime.clock) }
    }

    /// Whether `key` has a live value in either tier; see ``Cache/contains(_:)-(String)``.
    nonisolated(nonsending)
    public func contains(_ key: String) async throws -> Bool {
        try await contains(key.utf8)
    }

    /// ``contains(_:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func contains(_ key: some Sequence<UInt8>) async throws -> Bool {
        let hash = try cache.withHashedKey(key) { $0.hash }
        return try await cache.composition.read(Array(key), hash: hash, .contains) != nil
    }

    /// Stores `value` for `key`; see ``Cache/set(_:forKey:options:)-(_,String,_)``. With a remote tier,
    /// returns once the store answered (or failed, which owes the key a removal; never thrown), having
    /// awaited it with no thread blocked. The local half runs on the caller's task when it cannot wait
    /// (``Cache/Configuration/inlineDiskStores``), else on an I/O thread.
    nonisolated(nonsending)
    public func set(_ value: some Sequence<UInt8> & Sendable, forKey key: String, options: EntryOptions? = nil) async throws {
        try await set(value, forKey: key.utf8, options: options)
    }

    /// ``set(_:forKey:options:)-(_,String,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func set(
        _ value: some Sequence<UInt8> & Sendable, forKey key: some Sequence<UInt8>, options: EntryOptions? = nil
    ) async throws {
        let (key, value, cache) = (Array(key), Array(value), cache)
        let hash = try cache.withHashedKey(key) { $0.hash }
        let local = cache.composition.local
        let send = try await local.immediateOrHop(key, hash: hash, inline: cache.runtime.inlineStores) { key, wait throws(MagpieError) in
            try value.withUnsafeBytes { bytes in
                Result { () throws(MagpieError) in try cache.write(bytes, for: key, options: options, wait: wait) }
            }.get()
        }
        await cache.composition.send(send)
    }

    /// Removes `key` from both tiers; see ``Cache/removeValue(forKey:)-(String)``.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: String) async throws -> Bool {
        try await removeValue(forKey: key.utf8)
    }

    /// ``removeValue(forKey:)-(String)`` for a key of arbitrary bytes.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: some Sequence<UInt8>) async throws -> Bool {
        let (key, cache) = (Array(key), cache)
        let hash = try cache.withHashedKey(key) { $0.hash }
        let (removed, send) = try await cache.composition.local.offload { () throws(MagpieError) -> (Bool, RemoteSend?) in
            try cache.runtime.withKey(key, hash: hash) { key throws(MagpieError) -> (Bool, RemoteSend?) in
                cache.loads.supersede(key)
                return try cache.composition.removeLocally(key)
            }
        }
        await cache.composition.send(send)
        return removed
    }

    /// Removes every entry; see ``Cache/removeAll()``.
    nonisolated(nonsending)
    public func removeAll() async throws {
        try cache.runtime.checkOpen()
        cache.loads.supersedeAll()
        try await cache.composition.removeAll()
    }

    /// Removes a group's entries from every tier; see ``Cache/removeAll(inGroup:)``.
    @discardableResult nonisolated(nonsending)
    public func removeAll(inGroup group: String) async throws -> RemovedEntries {
        try cache.runtime.checkOpen()
        guard !group.isEmpty else { return RemovedEntries() }
        cache.loads.supersedeAll()
        return try await cache.composition.removeAll(inGroup: group)
    }

    /// Removes expired entries from both local tiers; see ``Cache/removeExpired()``.
    @discardableResult nonisolated(nonsending)
    public func removeExpired() async throws -> RemovedEntries {
        let cache = cache
        return try await cache.composition.local.offload { () throws(MagpieError) -> RemovedEntries in try cache.removeExpired() }
    }

    /// Makes everything written so far durable; see ``Cache/flush()``.
    nonisolated(nonsending)
    public func flush() async throws {
        let cache = cache
        try await cache.composition.local.offload { () throws(MagpieError) in try cache.flush() }
    }
}
