import Foundation

// The composer: the one place that knows which tiers a `Cache` has. Every public operation (sync,
// async, loader) reaches the tiers through the functions here, so that the rest of `Cache` is written
// once for every composition.
//
// Reads go down a read-through chain: memory, then disk (with the key's stripe held, a hit promoted
// into memory), then, with a remote tier, the store (a hit kept locally while coherence allows, see
// Cache+Remote.swift), then, for the loader API, the loader (Cache+Loader.swift). A cache with a remote
// tier serves a local copy only while its coherence stamp is servable (Remote/Coherence.swift).
//
// Writes go to a write-through list: the local tiers under the key's stripe (the local half), then,
// with a remote tier, the store (the remote half, sent with no lock held, Cache+Remote.swift).
//
// The chain's links are the tiers' own interfaces (MemoryTier+Bytes.swift, DiskTier+Entries.swift,
// RemoteTier.swift); its specialised forms (a plain value, an entry with its metadata, a hit with its
// tier, containment; sync and async) are written out here rather than behind a protocol, because a
// memory hit must cost what the memory tier's own read costs (Benchmarks/opcount.sh).

extension Cache {
    // MARK: Reads (synchronous)

    /// The value of `key` down the chain, nil on a miss (a remembered absence included).
    @inlinable
    func readValue(_ key: some Sequence<UInt8>) throws(MagpieError) -> [UInt8]? {
        if hasRemote { return try withHashedKey(key) { key throws(MagpieError) in try fleetValue(key) } }
        return try read(key, memory: { key in memory.copyValue(key) }, disk: { key throws(MagpieError) in try valueAfterMemoryMiss(key) })
    }

    /// The value of `key` with the tier that answered and its freshness.
    func readHit(_ key: some Sequence<UInt8>) throws(MagpieError) -> CacheHit? {
        if let remote {
            return try withHashedKey(key) { key throws(MagpieError) in
                try fleetEntry(key, remote).flatMap { CacheHit($0.0, tier: $0.1, clock: clock) }
            }
        }
        return try read(
            key, memory: { key in CacheHit(memory.entry(key), tier: .memory, clock: clock) },
            disk: { key throws(MagpieError) in try CacheHit(storedEntryAfterMemoryMiss(key), tier: .disk, clock: clock) })
    }

    /// The value of `key` as `Data` (one copy, from the tier's storage into the `Data`).
    func readData(_ key: HashedKey) throws(MagpieError) -> Data? {
        if hasRemote { return try fleetValue(key).map { Data($0) } }
        if let data = memory.withValue(key, { $0.isEmpty ? Data() : Data(bytes: $0.baseAddress!, count: $0.count) }) {
            return data
        }
        return try valueAfterMemoryMiss(key).map { Data($0) }
    }

    /// Whether a local tier holds a live (and, with a remote tier, servable) value of `key`. Not counted
    /// as a read; does not promote; never asks the store.
    func readContains(_ key: HashedKey) throws(MagpieError) -> Bool {
        if let remote { return try fleetLocalContains(key, remote) }
        if memory.contains(key) { return true }
        return try containsAfterMemoryMiss(key)
    }

    /// ``readContains(_:)`` past memory (its disk half, on an I/O thread for the async API).
    func containsAfterMemoryMiss(_ key: HashedKey) throws(MagpieError) -> Bool {
        if let remote { return try fleetLocalContains(key, remote) }
        guard let disk else { return false }
        return try logged("contains") { () throws(MagpieError) in try disk.contains(key) }
    }

    /// ``containsAfterMemoryMiss(_:)`` tried on an async caller's task: `.wouldBlock`, with nothing read or
    /// changed, when the disk read would wait (``DiskTier/containsIfImmediate(_:)``; with a remote tier,
    /// ``fleetDiskContainsIfImmediate(_:_:now:)``).
    func containsAfterMemoryMissIfImmediate(_ key: HashedKey, now: Int64) throws(MagpieError) -> ImmediateRead<Bool> {
        if let remote { return try fleetDiskContainsIfImmediate(key, remote, now: now) }
        guard let disk else { return .done(false) }
        let read = try logged("contains") { () throws(MagpieError) in try disk.containsIfImmediate(key) }
        if case .done = read { counters.inlineDiskReads.add(1, ordering: .relaxed) }
        return read
    }

    /// The loader API's read of `key`: the entry with its expiry and freshness, negative ones included;
    /// with a remote tier, a local copy past its staleness bound comes marked unverified when the store
    /// has nothing (fail-safe may serve it). `memoryChecked`: memory was read and found nothing.
    func readLoaderEntry(_ key: HashedKey, memoryChecked: Bool) throws(MagpieError) -> StoredEntry? {
        if let remote { return try fleetEntry(key, remote, unverifiedFallback: true)?.0 }
        if !memoryChecked, let entry = memory.entry(key) { return entry }
        return try storedEntryAfterMemoryMiss(key)
    }

    /// Whether a loader call that found nothing in memory must read further (a disk or remote tier).
    var readsPastMemory: Bool { disk != nil || remote != nil }

    /// Whether a loader call may judge a memory entry by itself, before the full protocol: not with a
    /// remote tier, whose local copies are judged by their coherence stamps there.
    @usableFromInline
    var judgesMemoryFirst: Bool { !hasRemote }

    /// Whether memory holds a value of the key that `call` would serve without a load (fresh).
    func servableInMemory(_ call: LoaderCall) -> Bool {
        if let remote { return fleetServableInMemory(call, remote) }
        return call.name.withUnsafeBytes { bytes in
            guard let (_, freshness) = memory.metadata(HashedKey(bytes, hash: call.hash)) else { return false }
            guard call.acceptsAbsence || !freshness.negative else { return false }
            return freshness.freshUntil == 0 || freshness.isFresh(at: clock.now())
        }
    }

    // MARK: Reads (async)

    /// ``readValue(_:)`` for the async API: a memory hit returns on the caller's executor; disk is read
    /// here when the read cannot wait, else on an I/O thread; the store awaited with no thread blocked.
    nonisolated(nonsending)
    func readValueAsync(_ key: some Sequence<UInt8>) async throws -> [UInt8]? {
        if let remote {
            let (value, hash) = try withHashedKey(key) { key throws(MagpieError) in (fleetMemoryValue(key, remote), key.hash) }
            if let value { return value }
            guard let (entry, _) = try await fleetEntry(Array(key), hash: hash, remote, memoryChecked: true),
                !entry.freshness.negative
            else { return nil }
            return entry.value
        }
        // The key is hashed once, here; the hash travels with a copy of its bytes to the I/O thread.
        let (value, hash) = try withHashedKey(key) { key throws(MagpieError) in (memory.copyValue(key), key.hash) }
        if let value { return value }
        let name = Array(key)
        // A disk read that cannot wait runs here, on the caller's task (Configuration.inlineResidentDiskReads);
        // a cancelled task's read goes to `onDisk`, which throws CancellationError as it always has.
        if configuration.inlineResidentDiskReads, disk != nil, !Task.isCancelled,
            case .done(let value) = try withHashedKey(name, hash: hash, { key throws(MagpieError) in try valueAfterMemoryMissIfImmediate(key) })
        {
            return value
        }
        return try await onDisk { [self] () throws(MagpieError) -> [UInt8]? in
            try withHashedKey(name, hash: hash) { key throws(MagpieError) in try valueAfterMemoryMiss(key) }
        }
    }

    /// ``readHit(_:)`` for the async API.
    nonisolated(nonsending)
    func readHitAsync(_ key: some Sequence<UInt8>) async throws -> CacheHit? {
        let clock = clock
        if let remote {
            let hash = try withHashedKey(key) { key throws(MagpieError) in key.hash }
            return try await fleetEntry(Array(key), hash: hash, remote).flatMap { CacheHit($0.0, tier: $0.1, clock: clock) }
        }
        let (hit, hash) = try withHashedKey(key) { key throws(MagpieError) in
            (CacheHit(memory.entry(key), tier: .memory, clock: clock), key.hash)
        }
        if let hit { return hit }
        guard disk != nil else { return nil }
        return CacheHit(try await storedEntryAfterMemoryMissAsync(Array(key), hash: hash), tier: .disk, clock: clock)
    }

    /// ``readContains(_:)`` for the async API.
    nonisolated(nonsending)
    func readContainsAsync(_ key: some Sequence<UInt8>) async throws -> Bool {
        if let remote {
            let (found, hash) = try withHashedKey(key) { key throws(MagpieError) in (fleetMemoryValue(key, remote) != nil, key.hash) }
            if found { return true }
            guard disk != nil else { return false }
            let (key, now) = (Array(key), clock.now())
            if configuration.inlineResidentDiskReads, !Task.isCancelled,  // cancelled: `onDisk` throws
                case .done(let found) = try withHashedKey(key, hash: hash, { key throws(MagpieError) in try containsAfterMemoryMissIfImmediate(key, now: now) })
            {
                return found
            }
            return try await onDisk { [self] () throws(MagpieError) -> Bool in
                try withHashedKey(key, hash: hash) { key throws(MagpieError) in try fleetDiskContains(key, remote, now: now) }
            }
        }
        let (found, hash) = try withHashedKey(key) { key throws(MagpieError) in (memory.contains(key), key.hash) }
        if found { return true }
        guard disk != nil else { return false }
        let key = Array(key)
        if configuration.inlineResidentDiskReads, !Task.isCancelled,  // cancelled: `onDisk` throws
            case .done(let found) = try withHashedKey(key, hash: hash, { key throws(MagpieError) in try containsAfterMemoryMissIfImmediate(key, now: 0) })
        {
            return found
        }
        return try await onDisk { [self] () throws(MagpieError) -> Bool in
            try withHashedKey(key, hash: hash) { key throws(MagpieError) in try containsAfterMemoryMiss(key) }
        }
    }

    /// ``readLoaderEntry(_:memoryChecked:)`` for the async loader: memory here, disk as
    /// ``storedEntryAfterMemoryMissAsync(_:hash:)`` reads it, the store awaited.
    nonisolated(nonsending)
    func readLoaderEntryAsync(_ call: LoaderCall, memoryChecked: Bool) async throws -> StoredEntry? {
        if let remote {
            return try await fleetEntry(call.name, hash: call.hash, remote, unverifiedFallback: true, memoryChecked: memoryChecked)?.0
        }
        if !memoryChecked,
            let entry = try withHashedKey(call.name, hash: call.hash, { key throws(MagpieError) in memory.entry(key) })
        {
            return entry
        }
        guard disk != nil else { return nil }
        return try await storedEntryAfterMemoryMissAsync(call.name, hash: call.hash)
    }

    /// ``storedEntryAfterMemoryMiss(_:)`` for the async API (`lookup`, the loaders, a fleet's local
    /// read): on the caller's task when the read cannot wait (Configuration.inlineResidentDiskReads),
    /// else on an I/O thread.
    nonisolated(nonsending)
    func storedEntryAfterMemoryMissAsync(_ name: [UInt8], hash: UInt64) async throws -> StoredEntry? {
        if configuration.inlineResidentDiskReads, !Task.isCancelled,  // cancelled: `onDisk` throws
            case .done(let entry) = try withHashedKey(name, hash: hash, { key throws(MagpieError) in try storedEntryAfterMemoryMissIfImmediate(key) })
        {
            return entry
        }
        return try await onDisk { [self] () throws(MagpieError) -> StoredEntry? in
            try withHashedKey(name, hash: hash) { key throws(MagpieError) in try storedEntryAfterMemoryMiss(key) }
        }
    }

    // MARK: Writes (the write-through list)

    /// A store's local half: the whole store for a cache without a remote tier; with one, the local
    /// tiers and the remote write still to send (Cache+Remote.swift).
    func writeLocally(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp)
        throws(MagpieError) -> RemoteSend?
    {
        if let remote { return try fleetWriteLocally(value, for: key, options: options, stamp: stamp, remote) }
        guard disk != nil else {
            try writeTiers(value, for: key, options: options, memoryPolicy: 0, stamp: stamp)
            return nil
        }
        try stripes.withLock(for: key.hash) { () throws(MagpieError) in
            try writeTiers(value, for: key, options: options, memoryPolicy: options.encodedMemoryPolicy, stamp: stamp)
        }
        return nil
    }

    /// What a store keeps beside its disk record: the memory policy (`memoryPolicy`, the memory expiry a
    /// promotion restores), its tiers for a disk-only store, its freshness and coherence stamp.
    @inline(__always)
    static func diskPlacement(_ options: EntryOptions, memoryPolicy: Int64, stamp: StoreStamp) -> EntryMetadata {
        options.tiers == .diskOnly
            ? EntryMetadata(memoryPolicy: memoryPolicy, tiers: .diskOnly, freshness: stamp.freshness, stamp: stamp.coherence)
            : EntryMetadata(memoryPolicy: memoryPolicy, freshness: stamp.freshness, stamp: stamp.coherence)
    }

    /// `cache.async.set` without a remote tier, tried on the caller's task (``Configuration/inlineDiskStores``):
    /// both tiers written here, as ``writeLocally(_:for:options:stamp:)`` writes them, when the disk's half
    /// needs neither the file nor a wait (``DiskTier/storeIfImmediate(_:for:expiry:group:placement:)``) and
    /// the key's stripe is free within a short spin. False, with nothing changed but the key's running load
    /// superseded (which the waiting store does first as well), otherwise, and when that load is landing
    /// (the hop waits for it to land, as a synchronous store does); and for a cancelled task (whose
    /// store then throws `CancellationError` in `onDisk`), a memory-only store (which removes the disk's
    /// record) and a cache without a disk tier (whose stores never wait).
    func setIfImmediate(_ value: [UInt8], forKey key: [UInt8], options: EntryOptions?) throws(MagpieError) -> Bool {
        guard configuration.inlineDiskStores, let disk, remote == nil, !Task.isCancelled else { return false }
        try checkOpen()
        let options = options ?? defaultOptions
        guard options.tiers != .memoryOnly else { return false }
        return try withHashedKey(key) { key throws(MagpieError) -> Bool in
            // A load of the key landing now holds its flight's lock across its store: the hop waits for it.
            guard supersedeLoadsIfImmediate(of: key), stripes.tryLock(for: key.hash) else { return false }
            defer { stripes.unlock(for: key.hash) }
            let stamp = options.stamp(now: clock.now(), hash: key.hash)
            let diskExpiry = stamp.disk == 0 ? Expiry.never : .at(millisecondsSince1970: stamp.disk)
            let placement = Self.diskPlacement(options, memoryPolicy: options.encodedMemoryPolicy, stamp: stamp)
            let stored = try value.withUnsafeBytes { bytes in
                Result { () throws(MagpieError) -> Bool in
                    let outcome = try logged("store") { () throws(MagpieError) in
                        try disk.storeIfImmediate(bytes, for: key, expiry: diskExpiry, group: options.group, placement: placement)
                    }
                    guard case .done = outcome else { return false }
                    if options.tiers == .diskOnly {
                        _ = memory.remove(key)
                    } else {
                        _ = try memory.set(
                            bytes, for: key, deadline: stamp.memory, group: options.group, freshness: stamp.freshness, stamp: stamp.coherence
                        ).get()
                    }
                    return true
                }
            }.get()
            if stored { counters.inlineDiskStores.add(1, ordering: .relaxed) }
            return stored
        }
    }

    /// A removal's local half: whether either local tier held the key, and, with a remote tier, the
    /// removal still to send (Cache+Remote.swift).
    func removeLocally(_ key: HashedKey) throws(MagpieError) -> (Bool, RemoteSend?) {
        if let remote {
            let (removed, send) = try fleetRemoveLocally(key, remote)
            return (removed, send)
        }
        guard let disk else { return (memory.remove(key), nil) }
        return try stripes.withLock(for: key.hash) { () throws(MagpieError) -> (Bool, RemoteSend?) in
            let onDisk = try logged("remove") { () throws(MagpieError) in try disk.remove(key) }
            return (memory.remove(key) || onDisk, nil)
        }
    }

    /// Whether a write has a remote half to send after its local half (a remote tier).
    var sendsWrites: Bool { remote != nil }

    /// `removeAll()` through every tier: the local ones, then the store's namespace (synchronous API).
    func removeAllThrough() throws(MagpieError) {
        try removeAllLocally()
        if let remote { fleetRemoveAll(remote) }
    }

    /// `removeAll()` past the local tiers for the async API: the store's namespace, awaited.
    nonisolated(nonsending)
    func removeAllRemotely() async {
        guard let remote else { return }
        remote.coherence.raiseFloor(to: clock.now())
        await remote.removeAll()
    }

    /// A group removal past the local tiers: the group's token in the store (synchronous API).
    func removeGroupRemotely(_ group: String) {
        if let remote { fleetRemoveGroup(group, remote) }
    }

    /// ``removeGroupRemotely(_:)`` for the async API.
    nonisolated(nonsending)
    func removeGroupRemotelyAsync(_ group: String) async {
        if let remote { await remote.removeGroup(group) }
    }

    // MARK: Loads

    /// Takes the fleet's lease of `call`'s key (or gets the value another instance's load stored);
    /// without a remote tier this instance just loads.
    nonisolated(nonsending)
    func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome {
        guard let remote else { return .load(token: nil) }
        return await leaseOrShared(call, remote)
    }

    /// ``acquireLoad(_:)`` from a loader thread (the synchronous loader API).
    func acquireLoadBlocking(_ call: LoaderCall) -> LeaseOutcome {
        guard let remote else { return .load(token: nil) }
        return (try? remote.bridge.wait(remote.store) { [self] in await leaseOrShared(call, remote) }) ?? .load(token: nil)
    }

    /// Releases the lease `lease` holds, if any, once the load landed.
    nonisolated(nonsending)
    func finishLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async {
        if case .load(let token?) = lease, let remote { await releaseLease(call, token: token, remote) }
    }

    /// ``finishLoad(_:_:)`` from a loader thread.
    func finishLoadBlocking(_ call: LoaderCall, _ lease: LeaseOutcome) {
        if case .load(let token?) = lease, let remote {
            _ = try? remote.bridge.wait(remote.store) { [self] in await releaseLease(call, token: token, remote) }
        }
    }

    // MARK: Life cycle

    /// The remote tier of `configuration`, if any, journaling its owed removals in `disk`'s directory.
    static func makeRemoteTier(_ configuration: Configuration, disk: DiskTier?) -> (RemoteTier, IOThreadPool)? {
        guard let options = configuration.remote else { return nil }
        let journal = disk.map { disk in
            OwedJournal(
                append: { (entry) throws(MagpieError) -> Bool in try disk.appendToJournal(entry) },
                replace: { (entries) throws(MagpieError) -> Bool in try disk.replaceJournal(with: entries) })
        }
        return (RemoteTier(options, clock: configuration.clock, journal: journal), IOThreadPool(threadCount: 1, name: "magpie-coherence"))
    }

    /// Starts what the remote tier runs in the background: the store's change reports, applied in order
    /// on the coherence thread, and the replay of removals an earlier run owed (its journal).
    func startRemoteTier() {
        guard let remote, let applier = coherencePool else { return }
        remote.store.startReporting(to: RemoteChanges(clock: clock, delivered: { remote.ownWritesDelivered() }) { [weak self] change in
            guard let cache = self else { return }
            _ = applier.submit { cache.apply(change, remote) }
        })
        // Removals owed by an earlier run that was killed (journaled in the directory): replayed now.
        if let disk {
            do {
                remote.restoreOwed(try disk.journalEntries())
            } catch {
                logger.error("magpie: the journal of owed removals could not be read", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Stops the remote tier at `close()`: the replay stops, and the store's connections close in the
    /// background unless the caller closes them (`closingStore` false).
    func stopRemoteTier(closingStore: Bool) {
        guard let remote else { return }
        remote.stopReplay()
        let store = remote.store
        if closingStore { Task { await store.shutdown() } }
    }

    /// The remote tier of a cache dropped without `close()`: its bridge thread ends, and so do its
    /// replay and its store's connections (they would outlive the cache).
    func dropRemoteTier() {
        guard let remote else { return }
        remote.bridge.shutdown()
        if !closed.load(ordering: .relaxed) { stopRemoteTier(closingStore: true) }
    }

    /// `shutdown`'s first step: waits up to `replayTime` for the owed removals to reach the store; what
    /// is still owed is logged (journaled with a disk tier, lost without one).
    nonisolated(nonsending)
    func replayBeforeShutdown(upTo replayTime: Duration) async {
        guard let remote else { return }
        let owed = await remote.waitForReplay(upTo: replayTime)
        if owed > 0 && disk == nil {
            logger.error("magpie: removals owed to the remote tier are lost at shutdown", metadata: ["owed": "\(owed)"])
        } else if owed > 0 {
            logger.warning(
                "magpie: removals still owed to the remote tier at shutdown; journaled, replayed at the next open",
                metadata: ["owed": "\(owed)"])
        }
    }

    /// `shutdown`'s last step: the store's connections, closed and awaited.
    nonisolated(nonsending)
    func closeRemoteStore() async {
        if let remote { await remote.store.shutdown() }
    }
}
