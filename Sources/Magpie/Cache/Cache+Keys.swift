import Synchronization

// What every keyed operation of a `Cache` goes through: the key reduced to bytes in place, its one hash,
// and the checks before it (its length, and that the cache is open).

extension Cache {
    /// Runs `body` with the key hashed (the one hash of the operation), after the checks every keyed
    /// call makes: the key's length (``MagpieError/Code/keyTooLong``) and that the cache is open
    /// (``MagpieError/Code/closed``). Inlined with `body` into each public entry point, so that a memory
    /// hit costs what the tier's own read costs (measured: a generic helper taking the closure cost a
    /// memory hit about 100 instructions more).
    @inlinable @inline(__always)
    func withHashedKey<R>(_ key: some Sequence<UInt8>, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        var failure: MagpieError? = nil
        let result = withBytes(key) { bytes -> R? in
            guard let key = admit(bytes) else {
                failure = refusal(bytes)
                return nil
            }
            do throws(MagpieError) { return try body(key) } catch {
                failure = error
                return nil
            }
        }
        if let failure { throw failure }
        return result.unsafelyUnwrapped  // set whenever `failure` is not
    }

    @inlinable @inline(__always)
    func withHashedKey<R>(_ key: String, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try withHashedKey(key.utf8, body)
    }

    /// A read: the memory probe first, inside the one conversion of the key to bytes, with nothing but
    /// the hash around it (a memory hit costs what the tier's own read does, measured); the checks come
    /// after a memory miss, since a key too long for the cache is never in memory, nor is anything once
    /// it is closed (closing empties memory). On a miss the disk half runs with the hash computed.
    @inlinable @inline(__always)
    func read<R>(
        _ key: some Sequence<UInt8>, memory probe: (HashedKey) -> R?, disk: (HashedKey) throws(MagpieError) -> R?
    ) throws(MagpieError) -> R? {
        let outcome = withBytes(key) { bytes -> MemoryProbe<R> in
            let key = HashedKey(bytes, hasher: hasher)
            if let found = probe(key) { return .hit(found) }
            guard bytes.count <= Self.maximumKeyLength, !runtime.closed.load(ordering: .relaxed) else { return .refused }
            return .miss(key.hash)
        }
        switch outcome {
        case .hit(let found): return found
        case .miss(let hash):
            // The disk half with the hash computed, specialised where this is inlined (a call to a
            // generic helper here looked up generic metadata at run time on every miss, perf).
            var failure: MagpieError? = nil
            let found = withBytes(key) { bytes -> R? in
                do throws(MagpieError) { return try disk(HashedKey(bytes, hash: hash)) } catch {
                    failure = error
                    return nil
                }
            }
            if let failure { throw failure }
            return found
        case .refused: throw withBytes(key) { refusal($0) }
        }
    }

    /// ``read(_:memory:disk:)`` for a `String` key.
    @inlinable @inline(__always)
    func read<R>(_ key: String, memory probe: (HashedKey) -> R?, disk: (HashedKey) throws(MagpieError) -> R?)
        throws(MagpieError) -> R?
    {
        try read(key.utf8, memory: probe, disk: disk)
    }

    /// The key, hashed, if it may be used: not too long, and the cache open.
    @inlinable @inline(__always)
    func admit(_ bytes: UnsafeRawBufferPointer) -> HashedKey? {
        guard bytes.count <= Self.maximumKeyLength, !runtime.closed.load(ordering: .relaxed) else { return nil }
        return HashedKey(bytes, hasher: hasher)
    }

    /// Why ``admit(_:)`` refused a key.
    @usableFromInline @inline(never)
    func refusal(_ bytes: UnsafeRawBufferPointer) -> MagpieError {
        runtime.refusal(keyLength: bytes.count)
    }
}

/// What a read's memory probe found.
@usableFromInline
enum MemoryProbe<R> {
    case hit(R)
    /// Not in memory: the key's hash, for the disk half.
    case miss(UInt64)
    /// The key was too long or the cache closed.
    case refused
}
