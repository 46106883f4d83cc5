// The writes of a cache with a remote tier: the local half under the key's stripe, the remote half sent
// with no lock held (see the top of RemotePolicy.swift).

/// The remote half of a write, sent after the local half (and its locks) are done. A class: a write
/// without a remote half passes a nil one through the same calls, one word wide.
final class RemoteSend: Sendable {
    enum Operation: Sendable {
        case store(RemoteRecord)
        case remove(version: UInt64)
    }

    let name: [UInt8]
    let hash: UInt64
    let operation: Operation
    /// When the write began (``Coherence/beginWrite(_:now:)``).
    let began: Int64

    init(name: [UInt8], hash: UInt64, operation: Operation, began: Int64) {
        self.name = name
        self.hash = hash
        self.operation = operation
        self.began = began
    }
}

extension RemotePolicy {
    // MARK: Local halves

    /// The local half of a store: the write marked under way, the stamped value in the local tiers, and
    /// the record with its version, under the key's stripe. The caller sends it (``send(_:)``), which
    /// ends the write. `.ifImmediate` as ``LocalTiers/write(_:for:options:stamp:wait:)``:
    /// `.wouldBlock` left the local tiers unchanged and no write under way.
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, wait: ReadWait)
        throws(MagpieError) -> ImmediateRead<RemoteSend?>
    {
        let name = Array(key.bytes)
        let partition = remote.partition(of: name)
        guard local.lock(key.hash, for: options, wait: wait, always: true) else { return .wouldBlock }
        defer { local.unlock(key.hash, always: true) }
        let began = clock.now()
        remote.coherence.beginWrite(key.hash, now: began)
        // The version is given under the stripe, with the local store: one instance's writes of a key get
        // versions in the order they changed the local tiers, and its copy knows which write it holds. A
        // load's landing carries the version given when it started (LoadCoordinator.land): its own writes
        // since superseded it.
        var stamped = stamp
        stamped.coherence = Coherence.stamp(at: began, partition: partition)
        // A landing whose key another instance wrote since the load started keeps the newer copy (the store
        // refuses the load's value too).
        let superseded = stamped.version != 0 && (local.memory.metadata(key)?.version ?? 0) > stamped.version
        if stamped.version == 0 { stamped.version = remote.versions.next() }
        let written: ImmediateRead<Void>
        do {
            written =
                superseded
                ? .done(()) : try local.store(value, for: key, options: options, memoryPolicy: options.encodedMemoryPolicy, stamp: stamped, wait: wait)
        } catch {
            remote.coherence.endWrite(key.hash, began: began)
            throw error
        }
        guard case .done = written else {
            remote.coherence.endWrite(key.hash, began: began)
            return .wouldBlock
        }
        // This write is newer than any message of the key still to come from before it: none may bring
        // an older value back once its copy is gone (evicted).
        droppedKeys.withLock { $0.forget(key.hash) }
        removedKeys.withLock { $0.forget(key.hash) }
        let expiry = local.storage.placing(options.tiers) == .memoryOnly ? stamp.memory : stamp.disk
        var record = RemoteRecord(
            value: Array(value), expiresAt: expiry, memoryPolicy: options.encodedMemoryPolicy, freshness: stamp.freshness,
            tiers: options.tiers, group: options.group.flatMap { $0.isEmpty ? nil : $0 })
        record.version = stamped.version
        return .done(RemoteSend(name: name, hash: key.hash, operation: .store(record), began: began))
    }

    /// The local half of a removal: whether a local tier held the key, and the tombstone to send.
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?) {
        local.stripes.lock(for: key.hash)
        defer { local.stripes.unlock(for: key.hash) }
        let began = clock.now()
        remote.coherence.beginWrite(key.hash, now: began)
        do {
            let removed = try local.removeHoldingStripe(key)
            let version = remote.versions.next()
            // As a removal by another instance: only a push newer than this removal brings the key back (a
            // message of a write older than it, still on its way, must not).
            droppedKeys.withLock { $0.note(key.hash, version: version) }
            removedKeys.withLock { $0.note(key.hash, version: version) }
            let send = RemoteSend(name: Array(key.bytes), hash: key.hash, operation: .remove(version: version), began: began)
            return (removed, send)
        } catch {
            remote.coherence.endWrite(key.hash, began: began)
            throw error
        }
    }

    // MARK: Remote halves

    /// Sends a write's remote half and ends the write. A failure is counted and owes the key a removal
    /// (`RemoteTier`), never thrown. With ``RemoteTierOptions/writeWait``, returns when the store
    /// answered or the wait passed, whichever is first (the write then goes on in a task of its own).
    nonisolated(nonsending)
    func send(_ write: RemoteSend) async {
        guard let wait = remote.writeWait else { return await perform(write) }
        let waiter = Wakeup()
        remote.backgroundWrites.add(1, ordering: .relaxed)
        Task {
            await perform(write)
            remote.backgroundWrites.subtract(1, ordering: .relaxed)
            waiter.finish()
        }
        await waiter.wait(upTo: wait)
    }

    /// Sends `write` and ends it; a store releases the load lease `lease` (a token) with it.
    func perform(_ write: RemoteSend, releasing lease: [UInt8]? = nil) async {
        let remote = remote
        switch write.operation {
        case .store(let record):
            if await !remote.write(record, forKey: write.name, releasing: lease) {
                // The store holds a newer version (another instance's write, versioned above this one):
                // this instance's local copy is older than the store's value. The report of that write
                // may have come before the local store, so nothing else would drop it: drop it here.
                _ = try? await local.offload { [self] () throws(MagpieError) in dropLocal(write.name) }
            }
        case .remove(let version): await remote.remove(write.name, version: version)
        }
        remote.coherence.endWrite(write.hash, began: write.began)
    }

    /// A write the synchronous API could not wait for (on the store's own thread): owed, and ended.
    func owe(_ write: RemoteSend) {
        switch write.operation {
        case .store: remote.owed.owe(key: write.name, version: remote.versions.next())
        case .remove(let version): remote.owed.owe(key: write.name, version: version)
        }
        remote.coherence.endWrite(write.hash, began: write.began)
    }

    func owe(group: String) { remote.owed.owe(group: group) }

    // MARK: Removing many

    /// The store's namespace replaced (every record outdated), after the local tiers were emptied.
    nonisolated(nonsending)
    func removeAll() async {
        remote.coherence.raiseFloor(to: clock.now())
        await remote.removeAll()
    }

    /// The group's token replaced in the store (every record of the group outdated).
    nonisolated(nonsending)
    func removeGroup(_ group: String) async { await remote.removeGroup(group) }
}
