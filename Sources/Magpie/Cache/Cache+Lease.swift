import Glibc

// Fleet-wide single flight. A load in a cache with a remote tier first takes the key's lease in the
// store (`SET <namespace>l<key> <token> NX PX <lease>`): the holder runs the loader, its value goes
// through to the store when it lands, and the lease is released. An instance that finds the lease taken
// runs no loader: it polls the store (2 ms, doubling to 50 ms) for the value, trying the lease again
// each time, so it loads itself only when the holder gave up (released the lease without a value) or
// the lease expired. A store that cannot be reached never holds a load up: the instance loads alone.

enum LeaseOutcome: Sendable {
    /// Run the loader (`holding`: this instance holds the lease and releases it after landing).
    case load(holding: Bool)
    /// Another instance's load stored this value (now kept locally): serve it, load nothing.
    case shared([UInt8])
}

extension Cache {
    /// Takes the lease of `call`'s key, or waits for the holder's value. Blocks the calling thread (an
    /// I/O or loader thread) for at most the lease time.
    func leaseOrShared(_ call: LoaderCall, _ remote: RemoteTier) -> LeaseOutcome {
        guard let leaseTime = remote.leaseTime else { return .load(holding: false) }
        let leaseKey = [RemoteKey.lease] + call.name
        let token = RemoteRecord.tokenBytes(RemoteRecord.newToken())
        let deadline = clock.now().saturatingAdd(leaseTime)
        var delay: UInt32 = 2_000
        var waited = false
        while true {
            // The holder's value, once it is there (a waiter looks before taking a lease the holder may
            // have released just after storing it).
            if waited, let shared = sharedValue(call, remote) { return .shared(shared) }
            let acquired: Bool
            do {
                let expiresAt = clock.now().saturatingAdd(leaseTime)
                acquired = try remote.store.runBlocking { () async throws(MagpieError) -> Bool in
                    try await remote.store.store(token, forKey: leaseKey, expiresAt: expiresAt, onlyIfAbsent: true)
                }
            } catch {
                remote.counters.errors.add(1, ordering: .relaxed)
                return .load(holding: false)
            }
            if acquired {
                if waited, let shared = sharedValue(call, remote) {
                    releaseLease(call, remote)
                    return .shared(shared)
                }
                remote.counters.leasesAcquired.add(1, ordering: .relaxed)
                return .load(holding: true)
            }
            if !waited {
                waited = true
                remote.counters.leaseWaits.add(1, ordering: .relaxed)
            }
            if clock.now() >= deadline || closed.load(ordering: .relaxed) { return .load(holding: false) }
            usleep(delay)
            delay = min(delay * 2, 50_000)
        }
    }

    /// The key's value in the store, stored by another instance's load (kept locally), counted.
    private func sharedValue(_ call: LoaderCall, _ remote: RemoteTier) -> [UInt8]? {
        let found = call.name.withUnsafeBytes { bytes in remoteEntry(HashedKey(bytes, hash: call.hash), remote) }
        guard let found, !found.freshness.negative else { return nil }
        remote.counters.sharedLoads.add(1, ordering: .relaxed)
        return found.value
    }

    /// Releases the lease this instance held for `call`'s key (after its value landed).
    func releaseLease(_ call: LoaderCall, _ remote: RemoteTier) {
        let leaseKey = [RemoteKey.lease] + call.name
        do {
            try remote.store.runBlocking { () async throws(MagpieError) in try await remote.store.remove(keys: [leaseKey]) }
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)  // it expires on its own
        }
    }

    /// Whether memory holds a servable copy of the key that a call would serve without a load (fresh).
    func fleetServableInMemory(_ call: LoaderCall, _ remote: RemoteTier) -> Bool {
        call.name.withUnsafeBytes { bytes in
            let now = clock.now()
            guard let entry = memory.entry(HashedKey(bytes, hash: call.hash)),
                let stamp = LocalStamp.stamp(of: entry.value), remote.coherence.servable(stamp: stamp, now: now)
            else { return false }
            guard call.acceptsAbsence || !entry.freshness.negative else { return false }
            return entry.freshness.isFresh(at: now)
        }
    }
}
