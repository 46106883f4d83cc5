// Trace replay through the real memory tier at simulator speed: placeholders charged like values.
// For `magpie-bench replay` (package access: not part of the public API). The serving path pays
// nothing for it: `ShardStorage.store` and `storePlaceholder` are two specialisations of one
// always-inlined body, and a read tests the placeholder flag in the same mask test as the expiry flag.

extension MemoryTier {
    /// One request of a trace replay, for `magpie-bench replay` and similar tools (not for serving).
    ///
    /// A hit when `key` is present: counted as a read, so the eviction policy sees it exactly as it
    /// sees ``withValue(forKey:_:)-(Sequence<UInt8>,_)``. Otherwise a miss, after which a
    /// *placeholder* is stored: an entry charged as a value of `valueLength` bytes would be, placed and
    /// evicted by the same code, but holding no value bytes, so a replay measures the policy and the
    /// tier's bookkeeping rather than `memcpy` of the objects. The miss ratios are identical to storing
    /// real values of that length (a test checks this).
    ///
    /// Placeholders are invisible to the serving API: reads of one are misses and ``contains(_:)-(Sequence<UInt8>)``
    /// is false; a ``set(_:forKey:expiry:group:)-(Sequence<UInt8>,Sequence<UInt8>,_,_)`` replaces one.
    /// - Returns: whether the request hit. A `valueLength` outside 0...``maximumValueLength`` or a key
    ///   over ``maximumKeyLength`` is a miss that stores nothing.
    package func simulateRequest(forKey key: UnsafeRawBufferPointer, valueLength: Int) -> Bool {
        guard key.count <= Self.maximumKeyLength, valueLength >= 0, valueLength <= Self.maximumValueLength else {
            return false
        }
        let hash = hasher.hash(key)
        let number = Int(truncatingIfNeeded: hash) & shardMask
        var first = true  // a retry after gathering room is the same request: counted once
        return withBorrowedRoom { policy, granted -> RoomOutcome<Bool> in
            defer { first = false }
            return withShard(for: hash) {
                $0.acceptGranted(granted)
                return $0.simulateRequest(
                    hash: hash, key: key, valueLength: valueLength, policy: policy, counted: !first)
            }
        } gather: { bytes, evicting in
            gatherRoom(bytes, for: number, evicting: evicting)
        }
    }
}

extension ShardStorage {
    /// A request of trace replay: a hit (counted as a read) if `key` is present, else a miss that
    /// stores a placeholder charged as a value of `valueLength` bytes without holding them. The
    /// policy sees exactly what `store` of such a value would do; no value bytes are written or read.
    /// `counted`: the request's miss was already counted (a retry after the tier gathered room).
    mutating func simulateRequest(
        hash: UInt64, key: UnsafeRawBufferPointer, valueLength: Int, policy: RoomPolicy, counted: Bool
    ) -> RoomOutcome<Bool> {
        if let (_, block) = find(hash: hash, key: key) {
            counters.hits &+= 1
            let frequency = EntryHeader(of: block).frequency
            if frequency < Self.frequencyCap { EntryHeader.setFrequency(block, frequency &+ 1) }
            return .done(true)
        }
        if !counted { counters.misses &+= 1 }
        let outcome = storePlaceholder(hash: hash, key: key, valueLength: valueLength, policy: policy)
        if case .short(let shortfall) = outcome { return .short(shortfall) }
        return .done(false)
    }
}
