import Logging
import Synchronization

// What every operation of a `Cache` goes through: the key's one hash and the checks before it, the
// open check, the logging of disk failures; and the periodic write of the disk buffers.

extension Cache {
    /// Writes the disk tier's write buffers every `interval`, on an I/O thread (failures are logged and
    /// counted in ``CacheStatistics/diskErrors`` like any disk failure).
    func startWritingBuffers(every interval: Duration) {
        let task = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard let self, !Task.isCancelled, let disk = self.disk else { return }
                _ = try? await self.pool.run { [self] () throws(MagpieError) in
                    try self.logged("buffer write") { () throws(MagpieError) in try disk.writeBuffers() }
                }
            }
        }
        bufferWriter.withLock { $0 = task }
    }

    @inlinable
    func checkOpen() throws(MagpieError) {
        if closed.load(ordering: .relaxed) { throw MagpieError(.closed, "the cache is closed") }
    }

    /// Runs a disk operation; logs and counts an I/O failure before rethrowing it.
    func logged<R>(_ operation: String, _ body: () throws(MagpieError) -> R) throws(MagpieError) -> R {
        do {
            return try body()
        } catch {
            if error.code == .ioFailure || error.code == .noSpace {
                counters.diskErrors.add(1, ordering: .relaxed)
                logger.error(
                    "magpie: disk \(operation) failed",
                    metadata: ["error": "\(error)", "path": "\(error.path ?? "")", "errno": "\(error.errno.map(String.init) ?? "")"])
            }
            throw error
        }
    }

    /// Runs `body` with the key hashed (the one hash of the operation), after the checks every keyed
    /// call makes: the key's length (``MagpieError/Code/keyTooLong``) and that the cache is open
    /// (``MagpieError/Code/closed``).
    @inlinable
    func withHashedKey<R>(_ key: some Sequence<UInt8>, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try withBytes(key) { bytes in Result { () throws(MagpieError) -> R in try checked(bytes, body) } }.get()
    }

    @inlinable
    func withHashedKey<R>(_ key: String, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try withBytes(key) { bytes in Result { () throws(MagpieError) -> R in try checked(bytes, body) } }.get()
    }

    /// ``withHashedKey(_:_:)`` for a key whose hash the caller computed already (an async read carries
    /// it from the memory probe to the I/O thread).
    func withHashedKey<R>(_ key: [UInt8], hash: UInt64, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        try checkOpen()
        return try key.withUnsafeBytes { bytes in Result { () throws(MagpieError) -> R in try body(HashedKey(bytes, hash: hash)) } }.get()
    }

    @inlinable
    func checked<R>(_ key: UnsafeRawBufferPointer, _ body: (HashedKey) throws(MagpieError) -> R) throws(MagpieError) -> R {
        guard key.count <= Self.maximumKeyLength else {
            throw MagpieError(.keyTooLong, "key of \(key.count) bytes; the limit is \(Self.maximumKeyLength)")
        }
        try checkOpen()
        return try body(HashedKey(key, hasher: hasher))
    }
}
