import Foundation

// The reads of a `Cache` (the synchronous API): memory here, inlined where a hit must cost what the
// memory tier's own read costs; everything past memory through the composition (Tiers/Composition.swift).
//
// Every keyed call reduces its key to bytes (in place when it can) and hashes them once; the
// `HashedKey` then picks the memory shard, the lock stripe and the disk bucket.

extension Cache {
    /// The value stored for `key`, or nil: absent, expired, evicted, or dropped as corrupt.
    ///
    /// Cost: a memory hit is one hash, one shard lock and a copy of the value. A miss reads disk
    /// (one `pread`, plus zstd decompression for compressed values) and promotes the value.
    /// - Throws: ``MagpieError/Code/keyTooLong``, disk I/O errors, ``MagpieError/Code/closed``.
    @inlinable
    public func value(forKey key: String) throws(MagpieError) -> [UInt8]? {
        try value(forKey: key.utf8)
    }

    /// `value(forKey:)` for a key of arbitrary bytes.
    @inlinable
    public func value(forKey key: some Sequence<UInt8>) throws(MagpieError) -> [UInt8]? {
        try read(key, memory: { key in memoryValue(key) }, disk: { key throws(MagpieError) in try composition.valuePastMemory(key) })
    }

    /// A memory hit that may be served, copied: any, or with a remote tier a servable one.
    @inlinable @inline(__always)
    func memoryValue(_ key: HashedKey) -> [UInt8]? {
        guard composition.judgesCopies else { return memory.copyValue(key) }
        return composition.withServableMemoryValue(key) { [UInt8]($0) }
    }

    /// Runs `body` over the bytes of a memory hit that may be served, in place.
    func withMemoryValue<R>(_ key: HashedKey, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        guard composition.judgesCopies else { return memory.withValue(key, body) }
        return composition.withServableMemoryValue(key, body)
    }

    /// The value stored for `key`, the tier that answered and whether the value is fresh or stale (see
    /// ``EntryOptions/freshFor``); nil on a miss. For callers that count or time memory and disk hits
    /// apart (the `tiered` benchmark does), or serve stale values their own way.
    public func lookup(_ key: String) throws(MagpieError) -> CacheHit? {
        try lookup(key.utf8)
    }

    /// ``lookup(_:)-(String)`` for a key of arbitrary bytes.
    public func lookup(_ key: some Sequence<UInt8>) throws(MagpieError) -> CacheHit? {
        try withHashedKey(key) { key throws(MagpieError) in
            try composition.read(key, .entry).flatMap { CacheHit($0.0, tier: $0.1, clock: runtime.clock) }
        }
    }

    /// The value stored for `key` as `Data` (one copy, from the tier's storage into the `Data`).
    /// - Throws: as ``value(forKey:)-(String)``.
    public func data(forKey key: String) throws(MagpieError) -> Data? {
        try data(forKey: key.utf8)
    }

    /// ``data(forKey:)-(String)`` for a key of arbitrary bytes.
    public func data(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Data? {
        try withHashedKey(key) { key throws(MagpieError) -> Data? in
            let inMemory = withMemoryValue(key) { $0.isEmpty ? Data() : Data(bytes: $0.baseAddress!, count: $0.count) }
            if let inMemory { return inMemory }
            return try composition.valuePastMemory(key).map { Data($0) }
        }
    }

    /// Whether `key` has a live value in either tier. Not counted as a read; does not promote.
    /// - Throws: ``MagpieError/Code/keyTooLong``, disk I/O errors, ``MagpieError/Code/closed``.
    public func contains(_ key: String) throws(MagpieError) -> Bool {
        try contains(key.utf8)
    }

    /// ``contains(_:)-(String)`` for a key of arbitrary bytes.
    public func contains(_ key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try withHashedKey(key) { key throws(MagpieError) in try composition.read(key, .contains) != nil }
    }
}
