import Logging

// A cache with a remote tier (``Cache/Configuration/remote``): reads memory → disk → remote, writes
// and removals through to the store, and local copies kept coherent with it (see Coherence.swift).
//
// Writes. A store or removal holds the key's write stripe (`RemoteTier.writeStripes`) across its local
// writes and its remote one, and bumps the key's change counter before and after: so two writes of one
// key in this process reach the store in the order they reach the local tiers, and a fetch that
// overlapped either never keeps its (older) value locally.
//
// Reads. A local copy is served only while `Coherence.servable` says so; the value's first 8 bytes are
// its stamp. A remote hit is kept locally (memory, disk, as the record's tiers say) only while the
// change feed is confirmed and the key's change counter did not move during the fetch.

extension Cache {
    // MARK: Reads

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
        guard let disk else { return false }
        let entry = try stripes.withLock(for: key.hash) { () throws(MagpieError) -> DiskEntry? in
            try logged("contains") { () throws(MagpieError) in try disk.entry(key) }
        }
        guard let entry, !entry.placement.freshness.negative, let stamp = LocalStamp.stamp(of: entry.value) else { return false }
        return remote.coherence.servable(stamp: stamp, now: now)
    }

    /// The key's entry for a read of a cache with a remote tier, and the tier that answered: a servable
    /// local copy (its stamp removed), else the store's record, kept locally.
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

    /// `entry` without its stamp, marked unverified (nil if it carries none).
    private func stripped(_ entry: StoredEntry) -> StoredEntry? {
        guard LocalStamp.stamp(of: entry.value) != nil else { return nil }
        var local = entry
        local.value = LocalStamp.value(of: entry.value)
        local.unverified = true
        return local
    }

    /// `entry` without its stamp, if it may be served at `now`.
    private func servable(_ entry: StoredEntry, _ remote: RemoteTier, now: Int64) -> StoredEntry? {
        guard let stamp = LocalStamp.stamp(of: entry.value), remote.coherence.servable(stamp: stamp, now: now) else { return nil }
        var local = entry
        local.value = LocalStamp.value(of: entry.value)
        return local
    }

    /// The store's current record of `key`, kept locally when it may be; nil on a miss or a failure.
    func remoteEntry(_ key: HashedKey, _ remote: RemoteTier) -> StoredEntry? {
        let started = clock.now()
        let counter = remote.coherence.counter(key.hash)
        let name = Array(key.bytes)
        let fetched: RemoteRecord?
        do {
            fetched = try remote.store.runBlocking { await remote.fetch(name) }
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            return nil
        }
        guard let record = fetched else { return nil }
        let now = clock.now()
        let entry = StoredEntry(
            value: record.value,
            deadline: EntryOptions.promotedDeadline(policy: record.memoryPolicy, diskDeadline: record.expiresAt, now: now),
            freshness: record.freshness)
        guard remote.coherence.confirmedRecently(now: now), !closed.load(ordering: .relaxed) else { return entry }
        remote.writeStripes.withLock(for: key.hash) {
            stripes.withLock(for: key.hash) {
                guard remote.coherence.counter(key.hash) == counter else { return }
                let options = EntryOptions(group: record.group, tiers: record.tiers)
                let stamp = StoreStamp(memory: entry.deadline, disk: record.expiresAt, freshness: record.freshness)
                let stamped = record.value.withUnsafeBytes { LocalStamp.stamped($0, started) }
                do {
                    try stamped.withUnsafeBytes { bytes in
                        Result { () throws(MagpieError) in
                            try writeTiers(bytes, for: key, options: options, memoryPolicy: record.memoryPolicy, stamp: stamp)
                        }
                    }.get()
                } catch {
                    logger.debug("magpie: a remote hit could not be kept locally", metadata: ["error": "\(error)"])
                }
            }
        }
        return entry
    }

    // MARK: Writes

    /// A store through to the store: the local tiers (stamped), then the record, under the key's write
    /// stripe. A remote failure is counted (and owes the key a removal), never thrown.
    func fleetWrite(_ value: UnsafeRawBufferPointer, for key: HashedKey, options: EntryOptions, stamp: StoreStamp, _ remote: RemoteTier)
        throws(MagpieError)
    {
        try remote.writeStripes.withLock(for: key.hash) { () throws(MagpieError) in
            remote.coherence.bump(key.hash)
            defer { remote.coherence.bump(key.hash) }
            let stamped = LocalStamp.stamped(value, clock.now())
            try stamped.withUnsafeBytes { bytes in
                Result { () throws(MagpieError) in
                    try stripes.withLock(for: key.hash) { () throws(MagpieError) in
                        try writeTiers(bytes, for: key, options: options, memoryPolicy: options.encodedMemoryPolicy, stamp: stamp)
                    }
                }
            }.get()
            let name = Array(key.bytes)
            var expiry = stamp.disk
            if disk == nil || options.tiers == .memoryOnly { expiry = stamp.memory }
            let record = RemoteRecord(
                value: Array(value), expiresAt: expiry, memoryPolicy: options.encodedMemoryPolicy, freshness: stamp.freshness,
                tiers: options.tiers, group: options.group.flatMap { $0.isEmpty ? nil : $0 })
            runRemote(remote, "store") { await remote.write(record, forKey: name) }
        }
    }

    /// A removal through to the store. Returns whether a local tier held the key.
    func fleetRemove(_ key: HashedKey, _ remote: RemoteTier) throws(MagpieError) -> Bool {
        try remote.writeStripes.withLock(for: key.hash) { () throws(MagpieError) -> Bool in
            remote.coherence.bump(key.hash)
            defer { remote.coherence.bump(key.hash) }
            let removed = try stripes.withLock(for: key.hash) { () throws(MagpieError) -> Bool in
                let onDisk = try disk.map { disk throws(MagpieError) in try logged("remove") { () throws(MagpieError) in try disk.remove(key) } }
                return memory.remove(key) || onDisk == true
            }
            let name = Array(key.bytes)
            runRemote(remote, "remove") { await remote.remove(name) }
            return removed
        }
    }

    /// Runs a remote write from the synchronous API; a failure to reach the store at all owes nothing
    /// more than the operation itself records (`RemoteTier` owes removals on its own failures).
    private func runRemote(_ remote: RemoteTier, _ operation: String, _ body: @escaping @Sendable () async -> Void) {
        do {
            try remote.store.runBlocking(body)
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)
            logger.debug("magpie: remote \(operation) not run", metadata: ["error": "\(error)"])
        }
    }

    func fleetRemoveGroup(_ group: String, _ remote: RemoteTier) {
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
        }
    }

    /// Drops the local copies of `name` (a change in the store made them outdated).
    private func dropLocal(_ name: [UInt8], _ remote: RemoteTier) {
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
