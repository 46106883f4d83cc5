import Synchronization

// The tokens a remote record is checked against: the namespace's ("a") and each group's ("g" + group,
// RemoteRecord.swift). A record is current only while it carries the tokens the store holds now; a
// removal of everything or of a group replaces the token, so every record written under the old one is
// outdated at once. The tokens read are cached here, stamped as a local copy is (Coherence.swift), so
// that a lost message of their partition drops them like any copy.

/// The remote tier's cache of group and namespace tokens (``RemoteTier/tokens``), and the tokens this
/// instance created.
final class RemoteTokens: Sendable {
    private let store: any RemoteStore
    private let coherence: Coherence
    private let clock: CacheClock
    private let cache = Locked(TokenCache())
    /// The tokens this instance created where there was none (``knows(_:group:now:)``), oldest first.
    private let created = Locked<[UInt64]>([])

    private struct TokenCache {
        var namespace: (token: UInt64, stamp: Int64)? = nil
        var groups: [String: (token: UInt64, stamp: Int64)] = [:]
    }

    init(store: any RemoteStore, coherence: Coherence, clock: CacheClock) {
        self.store = store
        self.coherence = coherence
        self.clock = clock
    }

    /// The token of `group` (nil: the namespace's) cached and servable at `now`, or nil.
    func cached(group: String?, now: Int64) -> UInt64? {
        let cached = cache.withLock { tokens in group.map { tokens.groups[$0] } ?? tokens.namespace }
        guard let cached, coherence.servable(stamp: cached.stamp, now: now) else { return nil }
        return cached.token
    }

    /// Whether a pushed record is current by the tokens cached now (its namespace's, its group's); false
    /// when a token is not cached (the copy is then dropped, not replaced).
    func current(_ record: RemoteRecord, now: Int64) -> Bool {
        guard let namespace = cached(group: nil, now: now), namespace == record.namespaceToken else { return false }
        guard let group = record.group else { return true }
        return cached(group: group, now: now) == record.groupToken
    }

    /// Whether a report that the token key of `group` (nil: the namespace's) now holds `token` is no
    /// change to this instance: the token it holds already, or one it created (the last 64; with foreign
    /// writes reported, the echo of a creation may come before the creator cached the token).
    func knows(_ token: UInt64, group: String?, now: Int64) -> Bool {
        token != 0 && (token == cached(group: group, now: now) || created.withLock { $0.contains(token) })
    }

    /// `token` is about to be stored by this instance where there was none.
    func noteCreated(_ token: UInt64) {
        created.withLock { created in
            if created.count >= 64 { created.removeFirst() }
            created.append(token)
        }
    }

    /// Keeps `token`, read at `stamp`, unless a change of the tokens was reported since `generation`.
    func remember(_ token: UInt64, group: String?, stamp: Int64, generation: UInt64) {
        // Stamped as a local copy of its key is (Coherence.swift): a lost message of its partition drops it.
        let stamp = Coherence.stamp(at: stamp, partition: store.partition(of: group.map { RemoteKey.group($0) } ?? RemoteKey.namespaceKey))
        cache.withLock { tokens in
            // A token invalidated while it was being read is not kept (it may be the old one).
            guard coherence.tokenGeneration.load(ordering: .acquiring) == generation else { return }
            if let group {
                if tokens.groups.count >= 10_000 { tokens.groups.removeAll() }
                tokens.groups[group] = (token, stamp)
            } else {
                tokens.namespace = (token, stamp)
            }
        }
    }

    /// The token of `group` (nil: the namespace's); with `create`, one is stored when there is none (so
    /// every record carries a token that is never 0). Throws the store's errors.
    func token(group: String?, create: Bool) async throws(MagpieError) -> UInt64 {
        let started = clock.now()
        if let cached = cached(group: group, now: started) { return cached }
        let generation = coherence.tokenGeneration.load(ordering: .acquiring)
        let key = group.map { RemoteKey.group($0) } ?? RemoteKey.namespaceKey
        for _ in 0..<3 {
            var token = RemoteRecord.token(try await store.onExecutor { [store] () async throws(MagpieError) in try await store.values(forKeys: [key]) }.first ?? nil)
            if token == 0 && create {
                let fresh = RemoteRecord.newToken()
                noteCreated(fresh)
                let created = try await store.onExecutor { [store] () async throws(MagpieError) in
                    try await store.store(RemoteRecord.tokenBytes(fresh), forKey: key, expiresAt: 0, onlyIfAbsent: true)
                }
                if created {
                    token = fresh
                } else {
                    continue  // another writer created it: read theirs
                }
            }
            if token != 0 { remember(token, group: group, stamp: started, generation: generation) }
            return token
        }
        throw MagpieError(.remoteUnavailable, "the token of \(group.map { "group \($0)" } ?? "the namespace") keeps changing")
    }

    /// Forgets cached tokens after "g" + group or "a" changed (a token being read then is not kept).
    func forget(group: String?) {
        coherence.tokenGeneration.add(1, ordering: .acquiringAndReleasing)
        cache.withLock { tokens in
            if let group { tokens.groups[group] = nil } else { tokens = TokenCache() }
        }
    }

    /// Drops the cached token of `group` (nil: every token), before a removal replaces it in the store.
    func drop(group: String?) {
        cache.withLock { tokens in
            if let group { _ = tokens.groups.removeValue(forKey: group) } else { tokens = TokenCache() }
        }
    }
}
