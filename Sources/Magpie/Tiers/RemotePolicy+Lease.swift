// Fleet-wide single flight. A load in a cache with a remote tier first takes the key's lease in the
// store (`SET <namespace>l<key> <token> NX PX <lease>`, the token random per load): the holder runs the
// loader, its value goes through to the store when it lands, and the lease is released, by its holder
// only (removed only while it still holds the holder's token: a holder whose lease expired cannot
// release its successor's). An instance that finds the lease taken runs no loader: it sleeps (the task,
// never a thread) until the key changes in the store (the holder's value landing, or the lease's
// release, both reported by the change feed) or the staleness bound passes, then looks for the value and
// tries the lease again; it loads itself only when the holder gave up (released the lease without a
// value) or the lease expired. A store that cannot be reached never holds a load up: the instance loads
// alone.

enum LeaseOutcome: Sendable {
    /// Run the loader (`token`: this instance holds the lease with this token and releases it after
    /// landing; nil: it holds none).
    case load(token: [UInt8]?)
    /// Another instance's load stored this value (now kept locally): serve it, load nothing.
    case shared([UInt8])
}

extension RemotePolicy {
    /// Takes the lease of `call`'s key, or waits (asleep) for the holder's value, for at most the lease
    /// time.
    nonisolated(nonsending)
    func acquireLoad(_ call: LoaderCall) async -> LeaseOutcome {
        guard let leaseTime = remote.leaseTime else { return .load(token: nil) }
        let token = RemoteRecord.tokenBytes(RemoteRecord.newToken())
        let deadline = clock.now().saturatingAdd(leaseTime)
        var waited = false
        while true {
            // Registered before this round's looks, so that a change reported after them ends the wait.
            let wakeup = leaseWaiters.register(call.hash)
            if let outcome = await tryLease(call, token: token, for: leaseTime, waited: waited) {
                leaseWaiters.unregister(wakeup, for: call.hash)
                return outcome
            }
            if !waited {
                waited = true
                remote.counters.leaseWaits.add(1, ordering: .relaxed)
            }
            let now = clock.now()
            if now >= deadline || runtime.closed.load(ordering: .relaxed) {
                leaseWaiters.unregister(wakeup, for: call.hash)
                return .load(token: nil)
            }
            // Until the key or its lease changes in the store; at most the staleness bound (a change
            // made while the feed was down is never reported) and never past the lease.
            await leaseWaiters.wait(wakeup, for: call.hash, upTo: .milliseconds(min(deadline - now, remote.coherence.bound)))
            if Task.isCancelled { return .load(token: nil) }  // a flight's task is cancelled only at close
        }
    }

    /// One round: the holder's value if it is there (after a wait), else the lease taken; nil when another
    /// instance holds it.
    private func tryLease(_ call: LoaderCall, token: [UInt8], for leaseTime: Int64, waited: Bool) async -> LeaseOutcome? {
        let expiresAt = clock.now().saturatingAdd(leaseTime)
        if waited || call.readsWithLease {
            // After a wait the holder's value may be here (pushed) or in the store; a caller that did not
            // read the store (the key removed lately) asks for it now. One round trip for the value or the
            // lease, which the store takes only where it holds no value (a holder that stored its value and
            // ended its lease just before is no reason to load again).
            if let pushed = pushedValue(call) { return .shared(pushed) }
            let started = clock.now()
            let counter = remote.coherence.counter(call.hash)
            let read: RemoteTier.LeaseRead
            do {
                let (remote, name) = (remote, call.name)
                read = try await remote.onStore { () async throws(MagpieError) in try await remote.fetchOrLease(name, token: token, expiresAt: expiresAt) }
            } catch {
                remote.counters.failed(error)
                return .load(token: nil)
            }
            switch read {
            case .leased(let acquired):
                remote.counters.readMisses.add(1, ordering: .relaxed)
                guard acquired else { return nil }
                remote.counters.leasesAcquired.add(1, ordering: .relaxed)
                return .load(token: token)
            case .record(let record):
                remote.counters.readHits.add(1, ordering: .relaxed)
                let entry = await keep(record, name: call.name, hash: call.hash, fetchedAt: started, counter: counter)
                if !entry.freshness.negative {
                    remote.counters.sharedLoads.add(1, ordering: .relaxed)
                    return .shared(entry.value)
                }
                // A remembered absence, which this load replaces: the lease below.
            }
        }
        let acquired: Bool
        do {
            acquired = try await remote.takeLease(call.name, token: token, expiresAt: expiresAt)
        } catch {
            remote.counters.failed(error)
            return .load(token: nil)
        }
        guard acquired else { return nil }
        remote.counters.leasesAcquired.add(1, ordering: .relaxed)
        return .load(token: token)
    }

    /// The key's value, pushed here by the change message of another instance's load; counted.
    private func pushedValue(_ call: LoaderCall) -> [UInt8]? {
        let pushed = call.name.withUnsafeBytes { bytes in local.withServableValue(HashedKey(bytes, hash: call.hash), self) { [UInt8]($0) } }
        if pushed != nil { remote.counters.sharedLoads.add(1, ordering: .relaxed) }
        return pushed
    }

    /// Releases the lease this instance holds for `call`'s key with `token` (after its value landed): only
    /// while the store still holds that token.
    private func releaseLease(_ call: LoaderCall, token: [UInt8]) async { await remote.releaseLease(call.name, token: token) }

    /// Releases the lease `lease` holds, if any, once the load landed.
    nonisolated(nonsending)
    func releaseLoad(_ call: LoaderCall, _ lease: LeaseOutcome) async {
        if case .load(let token?) = lease { await releaseLease(call, token: token) }
    }

    /// A landed load's remote half and its lease's release: a store's write carries the release (one
    /// round trip where the store can: ``RemoteTier/write(_:forKey:releasing:)``); any other landing
    /// (a removal, nothing, a write that runs past ``RemoteTierOptions/writeWait`` in the background) is
    /// sent, then the lease released. Either way the value reaches the store before the lease goes (a
    /// waiter that then takes the lease finds it).
    nonisolated(nonsending)
    func sendLanding(_ write: RemoteSend?, _ call: LoaderCall, _ lease: LeaseOutcome) async {
        guard case .load(let token?) = lease, let write, case .store = write.operation, remote.writeWait == nil else {
            if let write { await send(write) }
            await releaseLoad(call, lease)
            return
        }
        await perform(write, releasing: token)
    }

    /// The version a load that starts now gives its value.
    func loadVersion() -> UInt64 { remote.versions.next() }

    /// Whether memory holds a servable copy of the key that `call` would serve without a load (fresh).
    func servableInMemory(_ call: LoaderCall, now: Int64) -> Bool {
        call.name.withUnsafeBytes { bytes in
            guard let held = local.memory.metadata(HashedKey(bytes, hash: call.hash)),
                remote.coherence.servable(stamp: held.stamp, now: now)
            else { return false }
            guard call.acceptsAbsence || !held.freshness.negative else { return false }
            return held.freshness.isFresh(at: now)
        }
    }
}
