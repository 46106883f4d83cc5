// Fleet-wide single flight. A load in a cache with a remote tier first takes the key's lease in the
// store (`SET <namespace>l<key> <token> NX PX <lease>`, the token random per load): the holder runs the
// loader, its value goes through to the store when it lands, and the lease is released, by its holder
// only (removed only while it still holds the holder's token: a holder whose lease expired cannot
// release its successor's). An instance that finds the lease taken runs no loader: it sleeps (the
// task, never a thread: 2 ms, doubling to 50 ms) and looks for the value, trying the lease again each
// time, so it loads itself only when the holder gave up (released the lease without a value) or the
// lease expired. A store that cannot be reached never holds a load up: the instance loads alone.

enum LeaseOutcome: Sendable {
    /// Run the loader (`token`: this instance holds the lease with this token and releases it after
    /// landing; nil: it holds none).
    case load(token: [UInt8]?)
    /// Another instance's load stored this value (now kept locally): serve it, load nothing.
    case shared([UInt8])
}

extension Cache {
    /// Takes the lease of `call`'s key, or waits (asleep) for the holder's value, for at most the lease
    /// time.
    func leaseOrShared(_ call: LoaderCall, _ remote: RemoteTier) async -> LeaseOutcome {
        guard let leaseTime = remote.leaseTime else { return .load(token: nil) }
        let leaseKey = [RemoteKey.lease] + call.name
        let token = RemoteRecord.tokenBytes(RemoteRecord.newToken())
        let deadline = clock.now().saturatingAdd(leaseTime)
        var delay = 2
        var waited = false
        while true {
            // The holder's value, once it is there (a waiter looks before taking a lease the holder may
            // have released just after storing it).
            if waited, let shared = await sharedValue(call, remote) { return .shared(shared) }
            let acquired: Bool
            do {
                let expiresAt = clock.now().saturatingAdd(leaseTime)
                acquired = try await remote.store.store(token, forKey: leaseKey, expiresAt: expiresAt, onlyIfAbsent: true)
            } catch {
                remote.counters.errors.add(1, ordering: .relaxed)
                return .load(token: nil)
            }
            if acquired {
                if waited, let shared = await sharedValue(call, remote) {
                    await releaseLease(call, token: token, remote)
                    return .shared(shared)
                }
                remote.counters.leasesAcquired.add(1, ordering: .relaxed)
                return .load(token: token)
            }
            if !waited {
                waited = true
                remote.counters.leaseWaits.add(1, ordering: .relaxed)
            }
            if clock.now() >= deadline || closed.load(ordering: .relaxed) { return .load(token: nil) }
            do {
                try await Task.sleep(for: .milliseconds(delay))
            } catch {
                return .load(token: nil)  // cancelled: the load runs (a flight's task is cancelled only at close)
            }
            delay = min(delay * 2, 50)
        }
    }

    /// The key's value in the store, stored by another instance's load (kept locally), counted.
    private func sharedValue(_ call: LoaderCall, _ remote: RemoteTier) async -> [UInt8]? {
        guard let found = await remoteEntry(call.name, hash: call.hash, remote), !found.freshness.negative else { return nil }
        remote.counters.sharedLoads.add(1, ordering: .relaxed)
        return found.value
    }

    /// Releases the lease this instance holds for `call`'s key with `token` (after its value landed):
    /// only while the store still holds that token.
    func releaseLease(_ call: LoaderCall, token: [UInt8], _ remote: RemoteTier) async {
        do {
            _ = try await remote.store.remove([RemoteKey.lease] + call.name, ifValue: token)
        } catch {
            remote.counters.errors.add(1, ordering: .relaxed)  // it expires on its own
        }
    }

    /// Whether memory holds a servable copy of the key that a call would serve without a load (fresh).
    func fleetServableInMemory(_ call: LoaderCall, _ remote: RemoteTier) -> Bool {
        call.name.withUnsafeBytes { bytes in
            let now = clock.now()
            guard let entry = memory.entry(HashedKey(bytes, hash: call.hash)), remote.coherence.servable(stamp: entry.stamp, now: now)
            else { return false }
            guard call.acceptsAbsence || !entry.freshness.negative else { return false }
            return entry.freshness.isFresh(at: now)
        }
    }
}
