// The changes the remote store reports, applied to the local tiers in order, and the remote tier's life
// cycle (start, close, shutdown).

extension CoherentTiers {
    // MARK: Changes reported by the store

    /// Starts what the remote tier runs in the background: the store's change reports, applied in order
    /// on the coherence thread, and the replay of removals an earlier run owed (its journal).
    func start() {
        let remote = remote
        remote.store.startReporting(to: RemoteChanges(clock: clock, delivered: { remote.ownWritesDelivered() }) { [weak self] change in
            guard let self else { return }
            _ = applier.submit { self.apply(change) }
        })
        // Removals owed by an earlier run that was killed (journaled in the directory): replayed now.
        if let disk = local.disk {
            do {
                remote.restoreOwed(try disk.journalEntries())
            } catch {
                runtime.logger.error("magpie: the journal of owed removals could not be read", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Applies one change, on the coherence thread (in the order the store reported them).
    func apply(_ change: RemoteChange) {
        switch change {
        case .keys(let keys):
            remote.coherence.invalidations.add(UInt64(keys.count), ordering: .relaxed)
            for key in keys {
                guard let tag = key.first else { continue }
                let rest = key.dropFirst()
                switch tag {
                case RemoteKey.record:
                    let name = Array(rest)
                    dropLocal(name)
                    remote.onInvalidation?(name)
                case RemoteKey.lease:
                    wakeLeaseWaiters(Array(rest))
                case RemoteKey.group:
                    guard let group = String(validating: rest, as: UTF8.self) else { continue }
                    remote.forgetToken(group: group)
                    _ = try? local.removeAll(inGroup: group)
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

    /// Drops the local copies of `name` (a change in the store made them outdated), and wakes the loads
    /// waiting for its value.
    func dropLocal(_ name: [UInt8]) {
        guard name.count <= HashedKey.maximumLength, !runtime.closed.load(ordering: .relaxed) else { return }
        let hash = name.withUnsafeBytes { bytes in
            let key = HashedKey(bytes, hasher: hasher)
            remote.coherence.bump(key.hash)
            local.stripes.withLock(for: key.hash) {
                _ = local.memory.remove(key)
                if let disk = local.disk { _ = try? runtime.logged("drop") { () throws(MagpieError) in try disk.remove(key) } }
            }
            return key.hash
        }
        leaseWaiters.signal(hash)
    }

    private func wakeLeaseWaiters(_ name: [UInt8]) {
        guard name.count <= HashedKey.maximumLength else { return }
        leaseWaiters.signal(name.withUnsafeBytes { HashedKey($0, hasher: hasher).hash })
    }

    // MARK: Life cycle

    /// Stops the remote tier at `close()`: the replay stops, and the store's connections close in the
    /// background unless the caller closes them (`closingStore` false).
    func stop(closingStore: Bool) {
        applier.shutdown()
        remote.stopReplay()
        let store = remote.store
        if closingStore { Task { await store.shutdown() } }
    }

    /// The remote tier of a cache dropped without `close()`: its bridge thread ends, and so do its replay
    /// and its store's connections (they would outlive the cache).
    func drop(closed: Bool) {
        remote.bridge.shutdown()
        applier.shutdown()
        if !closed { stop(closingStore: true) }
    }

    /// `shutdown`'s first step: waits up to `replayTime` for the owed removals to reach the store; what is
    /// still owed is logged (journaled with a disk tier, lost without one).
    nonisolated(nonsending)
    func replayBeforeShutdown(upTo replayTime: Duration) async {
        let owed = await remote.waitForReplay(upTo: replayTime)
        guard owed > 0 else { return }
        if local.disk == nil {
            runtime.logger.error("magpie: removals owed to the remote tier are lost at shutdown", metadata: ["owed": "\(owed)"])
        } else {
            runtime.logger.warning(
                "magpie: removals still owed to the remote tier at shutdown; journaled, replayed at the next open",
                metadata: ["owed": "\(owed)"])
        }
    }
}
