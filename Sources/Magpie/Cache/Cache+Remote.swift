import Logging

// A cache with a remote tier (``Cache/Configuration/remote``): reads memory → disk → remote, writes
// and removals through to the store, and local copies kept coherent with it (see Coherence.swift).
//
// Every remote operation is async and awaited where it is needed: the async API awaits the store on
// the caller's task (a memory hit never leaves the caller's executor; disk work goes to the I/O
// threads); the synchronous API waits for it in one place, `RemoteTier.bridge`. No lock is held across
// a round trip.
//
// Writes. A store or removal has two halves. The local half (`writeLocally`, `removeLocally`), under
// the key's stripe: it marks a write of the key under way (Coherence.beginWrite), changes the local
// tiers and gives the remote write its version (HybridClock), so one instance's writes of a key get
// versions in the order they changed the local tiers. The remote half (`send`) then writes the record,
// or a removal's tombstone, with no lock held; the store applies it only if no newer version of the key
// is there (RemoteStore.storeIfNewer), so writes of one key take effect in version order however they
// overtake each other on the way, and a write that ran late (after a timeout, or a paused server) never
// undoes a later removal. When it ends the write is no longer under way (Coherence.endWrite).
//
// Reads. A local copy is served only while `Coherence.servable` says so of its coherence stamp, which
// both local tiers keep beside the value (never in it); a copy without one is never served. A remote hit is kept locally (memory, disk, as the record's tiers say) only while the
// change feed is confirmed, the key's change counter did not move during the fetch, and no write of the
// key is under way (Coherence.keepable).

/// The remote half of a write, sent after the local half (and its locks) are done.
struct RemoteSend: Sendable {
    enum Operation: Sendable {
        case store(RemoteRecord)
        case remove(version: UInt64)
    }

    let name: [UInt8]
    let hash: UInt64
    let operation: Operation
    /// When the write began (``Coherence/beginWrite(_:now:)``).
    let began: Int64
}

extension Cache {
    // MARK: Reads (synchronous API)

    /// A plain read of a cache with a remote tier: the value, nil on a miss (or a remembered absence).
    @usableFromInline
    func fleetValue(_ key: HashedKey) throws(MagpieError) -> [UInt8]? {
        guard let remote, let (entry, _) = try fleetEntry(key, remote), !entry.freshness.negative else { return nil }
        return entry.value
    }

    /// Whether a local tier holds a servable copy of `key` (`contains` does not ask the store).
    func fleetLocalContains(_ key: HashedKey, _ remote: RemoteTier) throws(MagpieError) -> Bool {
        let now = clock.now()
        if let entry = memory.entry(key), !entry.freshness.negative, servable(entry, remote, now: now) != nil { return true }
        return try fleetDiskContains(key, remote, now: now)
    }

    /// The disk half of ``fleetLocalContains(_:_:)``.
    func fleetDiskContains(_ key: HashedKey, _ remote: RemoteTier, now: Int64) throws(MagpieError) -> Bool {
        guard let disk else { return false }
        let entry = try stripes.withLock(for: key.hash) { () throws(MagpieError) -> DiskEntry? in
            try logged("contains") { () throws(MagpieError) in try disk.entry(key) }
        }
        guard let entry, !entry.placement.freshness.negative, entry.placement.stamp != 0 else { return false }
        return remote.coherence.servable(stamp: entry.placement.stamp, now: now)
    }

    /// ``fleetDiskContains(_:_:now:)`` that does not wait: the stripe by a bounded spin, the disk through
    /// ``DiskTier/entryIfImmediate(_:)``; `.wouldBlock`, with nothing read or changed, otherwise.
    func fleetDiskContainsIfImmediate(_ key: HashedKey, _ remote: RemoteTier, now: Int64) throws(MagpieError) -> ImmediateRead<Bool> {
        guard let disk else { return .done(false) }
        guard stripes.tryLock(for: key.hash) else { return .wouldBlock }
        defer { stripes.unlock(for: key.hash) }
        guard case .done(let found) = try logged("contains", { () throws(MagpieError) in try disk.entryIfImmediate(key) }) else {
            return .wouldBlock
        }
        counters.inlineDiskReads.add(1, ordering: .relaxed)
        guard let entry = found, !entry.placement.freshness.negative, entry.placement.stamp != 0 else { return .done(false) }
        return .done(remote.coherence.servable(stamp: entry.placement.stamp, now: now))
    }

    /// The key's entry for a read of a cache with a remote tier, and the tier that answered: a servable
    /// local copy, else the store's record, kept locally.
    ///
    /// With `unverifiedFallback` (the loader API), a local copy past its staleness bound is returned,
    /// marked ``StoredEntry/unverified``, when the store has nothing (or cannot be reached): fail-safe may
    /// serve it, nothing else does.
    func fleetEntry(_ key: HashedKey, _ remote: RemoteTier, unverifiedFallback: Bool = false) throws(MagpieError)
        -> (StoredEntry, CacheHit.Tier)?
    {
        let now = clock.now()
        var unverified: (StoredEntry, CacheHit.Tier)? = nil
        if let entry = memory.entry(key) {
            if let local = servable(entry, remote, now: now) { return (local, .memory) }
            if unverifiedFallback { unverified = stripped(entry).map { ($0, .memory) } }
        }
        if disk != nil, unverified == nil, let entry = try storedEntryAfterMemoryMiss(key) {
            if let local = servable(entry, remote, now: now) { return (local, .disk) }
            if unverifiedFallback { unverified = stripped(entry).map { ($0, .disk) } }
        }
        return remoteEntry(key, remote).map { ($0, .remote) } ?? unverified
    }

    /// The store's current record of `key`, kept locally when it may be; nil on a miss or a failure.
    /// Blocks for the round trip (the synchronous API).
    func remoteEntry(_ key: HashedKey, _ remote: RemoteTier) -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(key.hash)
        let name = Array(key.bytes)
        let fetched: RemoteRecord?
        do {
            fetched = try remote.bridge.wait(remote.store) { await remote.fetch(name) }
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            return nil
        }
        guard let record = fetched else { return nil }
        return keep(record, for: key, fetchedAt: started, counter: counter, remote)
    }

    // MARK: Reads (async API)

    /// A servable local copy of `key` in memory (one copy of the value, no lock: the async API's memory
    /// hit, on the caller's executor).
    @inline(__always)
    func fleetMemoryValue(_ key: HashedKey, _ remote: RemoteTier) -> [UInt8]? {
        let now = clock.now()
        let found = memory.withStampedValue(key) { stamp, bytes -> [UInt8]? in
            remote.coherence.servable(stamp: stamp, now: now) ? [UInt8](bytes) : nil
        }
        return found ?? nil
    }

    /// ``fleetEntry(_:_:unverifiedFallback:)`` for the async API: memory here, disk here when the read
    /// cannot wait and on an I/O thread otherwise (``storedEntryAfterMemoryMissAsync(_:hash:)``), the
    /// store awaited (no thread blocked), a remote hit kept locally (on an I/O thread when there is a
    /// disk tier). `memoryChecked`: the caller found no servable copy in memory already.
    nonisolated(nonsending)
    func fleetEntry(
        _ name: [UInt8], hash: UInt64, _ remote: RemoteTier, unverifiedFallback: Bool = false, memoryChecked: Bool = false
    ) async throws -> (StoredEntry, CacheHit.Tier)? {
        let now = clock.now()
        var unverified: (StoredEntry, CacheHit.Tier)? = nil
        if !memoryChecked || unverifiedFallback,
            let entry = try withHashedKey(name, hash: hash, { key throws(MagpieError) in memory.entry(key) })
        {
            if let local = servable(entry, remote, now: now) { return (local, .memory) }
            if unverifiedFallback { unverified = stripped(entry).map { ($0, .memory) } }
        }
        if disk != nil, unverified == nil {
            let found = try await storedEntryAfterMemoryMissAsync(name, hash: hash)
            if let entry = found {
                if let local = servable(entry, remote, now: now) { return (local, .disk) }
                if unverifiedFallback { unverified = stripped(entry).map { ($0, .disk) } }
            }
        }
        if let entry = await remoteEntry(name, hash: hash, remote) { return (entry, .remote) }
        return unverified
    }

    /// The store's current record of `name`, awaited, and kept locally when it may be.
    nonisolated(nonsending)
    func remoteEntry(_ name: [UInt8], hash: UInt64, _ remote: RemoteTier) async -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(hash)
        guard let record = await remote.fetch(name) else { return nil }
        guard disk != nil else {
            return name.withUnsafeBytes { keep(record, for: HashedKey($0, hash: hash), fetchedAt: started, counter: counter, remote) }
        }
        let kept = try? await onDisk { [self] () -> StoredEntry in
            name.withUnsafeBytes { keep(record, for: HashedKey($0, hash: hash), fetchedAt: started, counter: counter, remote) }
        }
        return kept ?? storedEntry(of: record)
    }

    /// A fetched record as an entry (its memory deadline from its policy).
    private func storedEntry(of record: RemoteRecord) -> StoredEntry {
        StoredEntry(
            value: record.value,
            deadline: EntryOptions.promotedDeadline(policy: record.memoryPolicy, diskDeadline: record.expiresAt, now: clock.now()),
            freshness: record.freshness)
    }

    /// Keeps a fetched record locally (stamped with the fetch's start) when it may be, and returns it
    /// as an entry. Takes the key's stripe; disk I/O when there is a disk tier.
    private func keep(_ record: RemoteRecord, for key: HashedKey, fetchedAt started: Int64, counter: UInt32, _ remote: RemoteTier)
        -> StoredEntry
    {
        let entry = storedEntry(of: record)
        guard !closed.load(ordering: .relaxed) else { return entry }
        guard remote.coherence.confirmedRecently(now: clock.now()) else {
            remote.counters.unkept.add(1, ordering: .relaxed)
            return entry
        }
        stripes.withLock(for: key.hash) {
            guard remote.coherence.keepable(key.hash, since: counter) else {
                remote.counters.unkept.add(1, ordering: .relaxed)
                return
            }
            let options = EntryOptions(group: record.group, tiers: record.tiers)
            let stamp = StoreStamp(
                memory: entry.deadline, disk: record.expiresAt, freshness: record.freshness, coherence: max(1, started))
            do {
                try record.value.withUnsafeBytes { bytes in
                    Result { () throws(MagpieError) in
                        try writeTiers(bytes, for: key, options: options, memoryPolicy: record.memoryPolicy, stamp: stamp)
                    }
                }.get()
            } catch {
                logger.debug("magpie: a remote hit could not be kept locally", metadata: ["error": "\(error)"])
            }
        }
        return entry
    }

    /// `entry` marked unverified (nil if it carries no stamp: not written by a cache with a remote tier).
    private func stripped(_ entry: StoredEntry) -> StoredEntry? {
        guard entry.stamp != 0 else { return nil }
        var local = entry
        local.unverified = true
        return local
    }

    /// `entry`, if it may be served at `now`.
    private func servable(_ entry: StoredEntry, _ remote: RemoteTier, now: Int64) -> StoredEntry? {
        remote.coherence.servable(stamp: entry.stamp, now: now) ? entry : nil
    }

    // MARK: Writes

    /// The local half of a store through to the store, under the key's stripe: the write marked under
    /// way, the stamped value in the local tiers, and the record with its version. The caller sends it
    /// (``send(_:)`` or ``sendWaiting(_:)``), which ends the write.
    func fleetWriteLocally(
        _ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, _ remote: RemoteTier
    ) throws(MagpieError) -> RemoteSend {
        let began = clock.now()
        remote.coherence.beginWrite(key.hash, now: began)
        do {
            var local = stamp
            local.coherence = max(1, began)
            let version = try stripes.withLock(for: key.hash) { () throws(MagpieError) -> UInt64 in
                try writeTiers(value, for: key, options: options, memoryPolicy: options.encodedMemoryPolicy, stamp: local)
                return remote.versions.next()
            }
            var expiry = stamp.disk
            if disk == nil || options.tiers == .memoryOnly { expiry = stamp.memory }
            var record = RemoteRecord(
                value: Array(value), expiresAt: expiry, memoryPolicy: options.encodedMemoryPolicy, freshness: stamp.freshness,
                tiers: options.tiers, group: options.group.flatMap { $0.isEmpty ? nil : $0 })
            record.version = version
            return RemoteSend(name: Array(key.bytes), hash: key.hash, operation: .store(record), began: began)
        } catch {
            remote.coherence.endWrite(key.hash, began: began)
            throw error
        }
    }

    /// The local half of a removal through to the store (see ``fleetWriteLocally(_:for:options:stamp:_:)``):
    /// whether a local tier held the key, and the tombstone to send.
    func fleetRemoveLocally(_ key: HashedKey, _ remote: RemoteTier) throws(MagpieError) -> (Bool, RemoteSend) {
        let began = clock.now()
        remote.coherence.beginWrite(key.hash, now: began)
        do {
            let (removed, version) = try stripes.withLock(for: key.hash) { () throws(MagpieError) -> (Bool, UInt64) in
                let onDisk = try disk.map { disk throws(MagpieError) in try logged("remove") { () throws(MagpieError) in try disk.remove(key) } }
                return (memory.remove(key) || onDisk == true, remote.versions.next())
            }
            return (removed, RemoteSend(name: Array(key.bytes), hash: key.hash, operation: .remove(version: version), began: began))
        } catch {
            remote.coherence.endWrite(key.hash, began: began)
            throw error
        }
    }

    /// Sends a write's remote half and ends the write. A failure is counted and owes the key a removal
    /// (`RemoteTier`), never thrown. With ``RemoteTierOptions/writeWait``, returns when the store
    /// answered or the wait passed, whichever is first (the write then goes on in a task of its own).
    nonisolated(nonsending)
    func send(_ write: RemoteSend) async {
        guard let remote else { return }
        guard let wait = remote.writeWait else { return await perform(write, remote) }
        let waiter = WriteWaiter()
        remote.backgroundWrites.add(1, ordering: .relaxed)
        Task {
            await perform(write, remote)
            remote.backgroundWrites.subtract(1, ordering: .relaxed)
            waiter.finish()
        }
        await waiter.wait(upTo: wait)
    }

    private func perform(_ write: RemoteSend, _ remote: RemoteTier) async {
        switch write.operation {
        case .store(let record):
            if await !remote.write(record, forKey: write.name) {
                // The store holds a newer version (another instance's write, versioned above this one):
                // this instance's local copy is older than the store's value. The report of that write
                // may have come before the local store, so nothing else would drop it: drop it here.
                if disk == nil {
                    dropLocal(write.name, remote)
                } else {
                    _ = try? await onDisk { [self] () throws(MagpieError) in dropLocal(write.name, remote) }
                }
            }
        case .remove(let version): await remote.remove(write.name, version: version)
        }
        remote.coherence.endWrite(write.hash, began: write.began)
    }

    /// ``send(_:)`` from the synchronous API: blocks until the store answered.
    func sendWaiting(_ write: RemoteSend) {
        guard let remote else { return }
        runRemote(remote, "write") { [self] in await send(write) }
        // A call that could not wait never ran: the write is still owed, and ends here.
        if !remote.store.callerMayWait {
            if case .store = write.operation { remote.owe(key: write.name, version: remote.versions.next()) }
            if case .remove(let version) = write.operation { remote.owe(key: write.name, version: version) }
            remote.coherence.endWrite(write.hash, began: write.began)
        }
    }

    /// Runs a remote operation from the synchronous API; a failure to reach the store at all owes nothing
    /// more than the operation itself records (`RemoteTier` owes removals on its own failures).
    private func runRemote(_ remote: RemoteTier, _ operation: String, _ body: @escaping @Sendable () async -> Void) {
        do {
            try remote.bridge.wait(remote.store, body)
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            logger.debug("magpie: remote \(operation) not run", metadata: ["error": "\(error)"])
        }
    }

    func fleetRemoveGroup(_ group: String, _ remote: RemoteTier) {
        guard remote.store.callerMayWait else { return remote.owe(group: group) }
        runRemote(remote, "group removal") { await remote.removeGroup(group) }
    }

    func fleetRemoveAll(_ remote: RemoteTier) {
        remote.coherence.raiseFloor(to: clock.now())
        runRemote(remote, "removal of everything") { await remote.removeAll() }
    }

    // MARK: Changes reported by the store

    /// Applies one change, on the cache's coherence thread (in the order the store reported them).
    func apply(_ change: RemoteChange, _ remote: RemoteTier) {
        switch change {
        case .keys(let keys):
            remote.coherence.invalidations.add(UInt64(keys.count), ordering: .relaxed)
            for key in keys {
                guard let tag = key.first else { continue }
                let rest = key.dropFirst()
                switch tag {
                case RemoteKey.record:
                    let name = Array(rest)
                    dropLocal(name, remote)
                    remote.onInvalidation?(name)
                case RemoteKey.group:
                    guard let group = String(validating: rest, as: UTF8.self) else { continue }
                    remote.forgetToken(group: group)
                    _ = try? removeAllLocally(inGroup: group)
                case RemoteKey.namespace:
                    remote.forgetToken(group: nil)
                    remote.coherence.raiseFloor(to: clock.now())
                default:
                    continue  // the store's own keys
                }
            }
        case .all:
            remote.forgetToken(group: nil)
            remote.coherence.raiseFloor(to: clock.now())
        case .confirmed(let instant):
            remote.coherence.confirm(through: instant, now: clock.now())
        case .delivered(let instant):
            remote.coherence.delivered.store(instant, ordering: .releasing)
        }
    }

    /// Drops the local copies of `name` (a change in the store made them outdated).
    func dropLocal(_ name: [UInt8], _ remote: RemoteTier) {
        guard name.count <= Self.maximumKeyLength, !closed.load(ordering: .relaxed) else { return }
        name.withUnsafeBytes { bytes in
            let key = HashedKey(bytes, hasher: hasher)
            remote.coherence.bump(key.hash)
            stripes.withLock(for: key.hash) {
                _ = memory.remove(key)
                if let disk { _ = try? logged("drop") { () throws(MagpieError) in try disk.remove(key) } }
            }
        }
    }
}

/// A caller waiting for a write that may outlast its wait: resumed once, by the write's end or by the
/// wait's timer, whichever comes first.
final class WriteWaiter: Sendable {
    private enum Phase {
        case running
        case waiting(CheckedContinuation<Void, Never>)
        case done
    }

    private let phase = Locked(Phase.running)

    /// The write ended.
    func finish() {
        let waiting = phase.withLock { phase -> CheckedContinuation<Void, Never>? in
            defer { phase = .done }
            if case .waiting(let continuation) = phase { return continuation }
            return nil
        }
        waiting?.resume()
    }

    /// Returns when the write ended or `limit` passed.
    func wait(upTo limit: Duration) async {
        let timer = Task { [self] in
            try? await Task.sleep(for: limit)
            finish()
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = phase.withLock { phase -> Bool in
                if case .done = phase { return true }
                phase = .waiting(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
        timer.cancel()
    }
}
