import CXXHash

/// The key hash: XXH3-64 of a key's bytes with a per-cache seed, from the system's libxxhash.
///
/// One hash is computed per operation and passed down. The memory tier takes its low bits to pick a
/// shard and its high 32 bits as the index tag; the disk tier takes the high bits to pick a bucket.
/// The seed makes placement unpredictable to someone choosing keys, so keys chosen by an attacker
/// cannot pile into one shard. A hash never stands in for a key: every hit compares the full key.
///
/// This is the only file that imports `CXXHash`.
public struct KeyHash: Sendable, Hashable {
    /// The seed mixed into every hash.
    public let seed: UInt64

    /// Creates a hasher with the given seed.
    public init(seed: UInt64) {
        self.seed = seed
    }

    /// Creates a hasher with a random seed.
    public static func random() -> KeyHash {
        var generator = SystemRandomNumberGenerator()
        return KeyHash(seed: generator.next())
    }

    /// XXH3-64 of the bytes. Cost: about 2–3 ns for a 16-byte key.
    @inlinable
    public func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        _hash(bytes)
    }

    /// XXH3-64 of a string's UTF-8 bytes, read in place when the string is native (no copy).
    @inlinable
    public func hash(_ key: String) -> UInt64 {
        if let value = key.utf8.withContiguousStorageIfAvailable({ _hash(UnsafeRawBufferPointer($0)) }) {
            return value
        }
        var copy = key
        return copy.withUTF8 { _hash(UnsafeRawBufferPointer($0)) }
    }

    /// XXH3-64 of a byte sequence; contiguous sequences (`[UInt8]`, `Data`, buffer pointers) are read in place.
    @inlinable
    public func hash(_ key: some Sequence<UInt8>) -> UInt64 {
        if let value = key.withContiguousStorageIfAvailable({ _hash(UnsafeRawBufferPointer($0)) }) {
            return value
        }
        return Array(key).withUnsafeBytes { _hash($0) }
    }

    @usableFromInline
    internal func _hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        // XXH3 accepts (NULL, 0); any other base address is valid for `count` bytes by the buffer's contract.
        XXH3_64bits_withSeed(bytes.baseAddress, bytes.count, seed)
    }
}

extension KeyHash {
    /// The disk record checksum: XXH3-64 of `body`, seeded with XXH3-64 of `header` (so one call
    /// covers two separate regions without a streaming state).
    /// The body goes through libxxhash's run-time dispatcher where it has one (AVX2 on x86-64).
    static func checksum(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer) -> UInt64 {
        let headerHash = XXH3_64bits_withSeed(header.baseAddress, header.count, 0)
        return magpie_xxh3_64_long(body.baseAddress, body.count, headerHash)
    }

    /// The checksum through the plain (non-dispatching) entry point: for the test that both agree.
    static func checksumWithoutDispatch(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer) -> UInt64 {
        let headerHash = XXH3_64bits_withSeed(header.baseAddress, header.count, 0)
        return XXH3_64bits_withSeed(body.baseAddress, body.count, headerHash)
    }
}
