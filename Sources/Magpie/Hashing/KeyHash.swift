import CXXHash
import Glibc

/// The key hash: XXH3-64 of a key's bytes with a per-cache seed, from the system's libxxhash.
///
/// A key is hashed once per operation, where it enters the library (``HashedKey``), and the hash is
/// passed down: the memory tier takes its low bits to pick a shard (see `MemoryTier.shard(of:)`), bits 12
/// and up for the home of its index probe and the top 8 bits as the index tag; `Cache` takes bits 32 and
/// up to pick a lock stripe; the disk tier takes the high bits to pick a bucket and the low 32 as its
/// index tag. The seed makes placement unpredictable to someone choosing keys, so keys chosen by an
/// attacker cannot pile into one shard. A hash never stands in for a key: every hit compares the full key.
///
/// This is the only file that imports `CXXHash`.
@usableFromInline
package struct KeyHash: Sendable, Hashable {
    /// The seed mixed into every hash.
    @usableFromInline package let seed: UInt64

    /// Creates a hasher with the given seed.
    package init(seed: UInt64) {
        self.seed = seed
    }

    /// Creates a hasher with a random seed.
    package static func random() -> KeyHash {
        var generator = SystemRandomNumberGenerator()
        return KeyHash(seed: generator.next())
    }

    /// XXH3-64 of a key's bytes: the one place a key is hashed (counted in test builds, see
    /// ``KeyHashCounter``). Cost: about 2–3 ns for a 16-byte key.
    @inlinable
    package func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        #if MAGPIE_TESTING
        KeyHashCounter.add()
        #endif
        // XXH3 accepts (NULL, 0); any other base address is valid for `count` bytes by the buffer's contract.
        return XXH3_64bits_withSeed(bytes.baseAddress, bytes.count, seed)
    }

    /// The hash of a byte sequence (read in place when contiguous).
    package func hash(_ key: some Sequence<UInt8>) -> UInt64 {
        withBytes(key) { hash($0) }
    }

    /// The hash of a `String`'s UTF-8 bytes (read in place when native).
    package func hash(_ key: String) -> UInt64 {
        withBytes(key) { hash($0) }
    }

    /// A group name's 64-bit tag: its seeded hash, never 0 (not a key hash: not counted). A collision
    /// between two groups can only make a group removal remove more entries, never return a wrong value.
    package func groupTag(_ group: String) -> UInt64 {
        withBytes(group.utf8) { XXH3_64bits_withSeed($0.baseAddress, $0.count, seed ^ 0x6772_6f75_7074_6167) | 1 }
    }
}

extension KeyHash {
    /// The disk record checksum: XXH3-64 of `body` (key, group, metadata: short), seeded with XXH3-64 of
    /// `header` (so one call covers two separate regions without a streaming state).
    static func checksum(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer) -> UInt64 {
        checksum(header: header, body: body, dispatch: dispatchLong)
    }

    /// ``checksum(header:body:)`` with the entry for `body` chosen by the caller (the test that both agree).
    static func checksum(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer, dispatch: Bool) -> UInt64 {
        let headerHash = XXH3_64bits_withSeed(header.baseAddress, header.count, 0)
        return magpie_xxh3_64_long(body.baseAddress, body.count, headerHash, dispatch ? 1 : 0)
    }

    /// Whether long inputs are hashed through libxxhash's run-time dispatcher (`magpie_xxh3_dispatch_wanted`
    /// in CModules/CXXHash/shim.h: on x86-64 where the library has one, but not on an Intel CPU with usable
    /// AVX-512; never elsewhere), asked once.
    static let dispatchLong = magpie_xxh3_dispatch_wanted() != 0

    /// ``payloadHash(_:)`` with the entry chosen by the caller (the test that both agree).
    @inline(__always)
    static func payloadHash(_ payload: UnsafeRawBufferPointer, dispatch: Bool) -> UInt64 {
        magpie_xxh3_64_long(payload.baseAddress, payload.count, 0, dispatch ? 1 : 0)
    }

    /// A record's payload hash: XXH3-64 (seed 0) of its stored payload, through libxxhash's run-time
    /// dispatcher where ``dispatchLong`` says so (AVX2 or AVX-512), else the plain entry (SSE2 on x86-64,
    /// the library's default build elsewhere).
    @inline(__always)
    static func payloadHash(_ payload: UnsafeRawBufferPointer) -> UInt64 {
        payloadHash(payload, dispatch: dispatchLong)
    }

    /// XXH3-64 of a format header seeded with this hasher's seed: a checksum only the directory's owner
    /// (who can read the MANIFEST) can forge, for headers whose forgery could make recovery apply bytes
    /// that a stored value carried (region headers).
    func sealedChecksum(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        XXH3_64bits_withSeed(bytes.baseAddress, bytes.count, seed ^ 0x7265_6769_6f6e_7321)
    }

    /// The checksum through the plain (non-dispatching) entry point: for the test that both agree.
    static func checksumWithoutDispatch(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer) -> UInt64 {
        let headerHash = XXH3_64bits_withSeed(header.baseAddress, header.count, 0)
        return XXH3_64bits_withSeed(body.baseAddress, body.count, headerHash)
    }

    /// XXH3-64 with seed 0 of a format header (file headers, MANIFEST, snapshots): not a key hash.
    package static func formatChecksum(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        XXH3_64bits_withSeed(bytes.baseAddress, bytes.count, 0)
    }
}

/// A key as the tiers take it: its bytes and their hash, computed once where the key enters the
/// library and handed to the lock stripe and both tiers, so that no layer hashes or converts it again.
/// Valid only while `bytes` is (inside the closure that made it).
@usableFromInline
package struct HashedKey {
    @usableFromInline package let bytes: UnsafeRawBufferPointer
    @usableFromInline package let hash: UInt64

    /// The longest key, in bytes, in every tier: both keep a key's length in 16 bits.
    package static let maximumLength = Int(UInt16.max)

    /// Hashes `bytes` with `hasher`.
    @inlinable
    package init(_ bytes: UnsafeRawBufferPointer, hasher: KeyHash) {
        self.bytes = bytes
        self.hash = hasher.hash(bytes)
    }

    /// A key whose hash is already known (the same bytes, copied to cross to another thread).
    @inlinable
    package init(_ bytes: UnsafeRawBufferPointer, hash: UInt64) {
        self.bytes = bytes
        self.hash = hash
    }

    var count: Int { bytes.count }
}

/// Calls `body` with the bytes of `sequence`, in place when it is contiguous (`[UInt8]`, `Data`, buffer
/// pointers, a native `String`'s UTF-8 view), else with a copy. Always inlined: DiskTier's generic callers
/// called it unspecialised, and its `R?` then cost a metadata lookup in the Swift runtime on every call.
@inlinable @inline(__always)
package func withBytes<R>(_ sequence: some Sequence<UInt8>, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    if let result = sequence.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
    return Array(sequence).withUnsafeBytes(body)
}

/// Whether `name` holds exactly `bytes` (the loader's tables compare a key's bytes this way).
@inline(__always)
func sameKey(_ name: [UInt8], _ bytes: UnsafeRawBufferPointer) -> Bool {
    // Both buffers are valid for `count` bytes: `name`'s for the closure, `bytes` by the caller's contract.
    name.count == bytes.count
        && name.withUnsafeBytes { own in bytes.isEmpty || memcmp(own.baseAddress!, bytes.baseAddress!, bytes.count) == 0 }
}

/// Calls `body` with the UTF-8 bytes of `string`, in place when it is native.
@inlinable
package func withBytes<R>(_ string: String, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    if let result = string.utf8.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
    var copy = string
    return copy.withUTF8 { body(UnsafeRawBufferPointer($0)) }
}

#if MAGPIE_TESTING
/// Test builds only: key hashes computed on the calling thread, so a test can check that one `Cache`
/// operation hashes its key exactly once. Per thread, so tests running in parallel do not mix counts.
@usableFromInline
package enum KeyHashCounter {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    @usableFromInline
    package static func add() {
        pthread_setspecific(key, UnsafeRawPointer(bitPattern: count + 1))
    }

    /// Key hashes computed on this thread so far.
    package static var count: Int { Int(bitPattern: pthread_getspecific(key)) }
}
#endif
