// The loader API's entry points: async and synchronous, for a loader that always finds a value and one
// that may find nothing. Each answers a fresh hit from its first probe; the protocol behind them is in
// Loading/LoadCoordinator.swift.

extension Cache {
    /// The value for `key`; when it is missing (or stale, see ``LoaderOptions``), `load` produces it, it
    /// is stored with `options`, and returned.
    ///
    /// Concurrent callers that need a load of the same key share one run of `load` (single flight): it
    /// runs once and every caller gets its value. If it throws, every waiting caller gets the error
    /// (or, with ``LoaderOptions/failSafeMaxAge``, the key's stale value) and nothing is cached.
    /// Cancelling one caller resumes that caller with `CancellationError` and leaves the load running for
    /// the others; when every caller has been cancelled, the load's task is cancelled (unless it is a
    /// background refresh, or a caller stopped waiting at a timeout: those loads always finish). A value
    /// that cannot be cached (say, larger than a bucket) is still returned, and the failure logged.
    /// A removal or store of the key while the load runs wins: the load's value is returned to its
    /// callers but not stored.
    /// - Parameters:
    ///   - key: the key, its UTF-8 bytes.
    ///   - options: how to store the loaded value (``EntryOptions/freshFor`` for stale-while-revalidate);
    ///     nil: ``Configuration/defaultOptions``.
    ///   - loader: what to do with stale values, failures and slow loads; nil:
    ///     ``Configuration/defaultLoaderOptions``.
    ///   - load: produces the value; runs in its own task (not the caller's).
    /// - Throws: what `load` throws, ``MagpieError/Code/loadTimedOut``, `CancellationError`, or the
    ///   cache's read errors.
    nonisolated(nonsending)
    public func value(
        forKey key: String, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () async throws -> [UInt8]
    ) async throws -> [UInt8] {
        try await value(forKey: key.utf8, options: options, loader: loader, load: load)
    }

    /// ``value(forKey:options:loader:load:)-(String,_,_,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func value(
        forKey key: some Sequence<UInt8>, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () async throws -> [UInt8]
    ) async throws -> [UInt8] {
        let probe = firstProbe(key, loader, acceptsAbsence: false)
        if case .served(let value) = probe { return value ?? [] }  // a load of this form never finds nothing
        let found = try await loads.loadingValue(Array(key), options, loader, .async { try await load() }, acceptsAbsence: false, probe)
        return found ?? []
    }

    /// The value for `key`, or nil when the origin has none: `load` returns nil for a key that does not
    /// exist (a loader that may find nothing). With ``LoaderOptions/negativeLifetime`` the absence is remembered (an entry that every
    /// read but this one treats as absent), so a missing key does not reach the origin on every request;
    /// without it, nil removes the key's stale value. Otherwise as
    /// ``value(forKey:options:loader:load:)-(String,_,_,_)``.
    nonisolated(nonsending)
    public func valueIfPresent(
        forKey key: String, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () async throws -> [UInt8]?
    ) async throws -> [UInt8]? {
        try await valueIfPresent(forKey: key.utf8, options: options, loader: loader, load: load)
    }

    /// ``valueIfPresent(forKey:options:loader:load:)-(String,_,_,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func valueIfPresent(
        forKey key: some Sequence<UInt8>, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () async throws -> [UInt8]?
    ) async throws -> [UInt8]? {
        let probe = firstProbe(key, loader, acceptsAbsence: true)
        if case .served(let value) = probe { return value }
        return try await loads.loadingValue(Array(key), options, loader, .async(load), acceptsAbsence: true, probe)
    }

    /// The synchronous form of ``value(forKey:options:loader:load:)-(String,_,_,_)``: blocks the calling
    /// thread while it waits for a load. A load the caller starts runs on the caller's thread, unless
    /// the caller may stop waiting for it (a soft or hard timeout applies): then, like background
    /// refreshes, it runs on one of ``Configuration/loaderThreadCount`` loader threads.
    public func loadValue(
        forKey key: String, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () throws -> [UInt8]
    ) throws -> [UInt8] {
        try loadValue(forKey: key.utf8, options: options, loader: loader, load: load)
    }

    /// ``loadValue(forKey:options:loader:load:)-(String,_,_,_)`` for a key of arbitrary bytes.
    public func loadValue(
        forKey key: some Sequence<UInt8>, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () throws -> [UInt8]
    ) throws -> [UInt8] {
        let probe = firstProbe(key, loader, acceptsAbsence: false)
        if case .served(let value) = probe { return value ?? [] }
        return try loads.loadingValueBlocking(Array(key), options, loader, .blocking { try load() }, acceptsAbsence: false, probe) ?? []
    }

    /// The synchronous form of ``valueIfPresent(forKey:options:loader:load:)-(String,_,_,_)``.
    public func loadValueIfPresent(
        forKey key: String, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () throws -> [UInt8]?
    ) throws -> [UInt8]? {
        try loadValueIfPresent(forKey: key.utf8, options: options, loader: loader, load: load)
    }

    /// ``loadValueIfPresent(forKey:options:loader:load:)-(String,_,_,_)`` for a key of arbitrary bytes.
    public func loadValueIfPresent(
        forKey key: some Sequence<UInt8>, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () throws -> [UInt8]?
    ) throws -> [UInt8]? {
        let probe = firstProbe(key, loader, acceptsAbsence: true)
        if case .served(let value) = probe { return value }
        return try loads.loadingValueBlocking(Array(key), options, loader, .blocking(load), acceptsAbsence: true, probe)
    }
}

extension Cache {
    /// The first read of a loader call (async or synchronous), itself synchronous and in place (no copy
    /// of the key, no closure built): a fresh memory hit with no refresh due is served from here, which
    /// is what most calls are, and so is a stale hit whose refresh already runs or whose key is
    /// throttled. Anything else goes on to the full protocol (`loadingValue`, `loadingValueBlocking`)
    /// with what it found. A value without a fresh lifetime is judged without reading the clock.
    @inline(__always)
    func firstProbe(_ key: some Sequence<UInt8>, _ loader: LoaderOptions?, acceptsAbsence: Bool) -> LoaderProbe {
        withBytes(key) { bytes -> LoaderProbe in
            guard bytes.count <= Self.maximumKeyLength, !runtime.closed.load(ordering: .relaxed) else { return .refused }
            let key = HashedKey(bytes, hasher: hasher)
            guard let entry = memory.entry(key) else { return .missed(key.hash) }
            // A cache with a remote tier serves a copy from here only while its coherence stamp is
            // servable: a few loads of atomics beside the clock (Remote/Coherence.swift). A copy it may
            // not serve goes to the full protocol, which asks the remote tier (and keeps this copy as the
            // unverified fallback) without reading memory again.
            if let coherent = composition.coherent, !coherent.servable(stamp: entry.stamp, now: runtime.clock.now()) {
                return .unserved(entry, key.hash)
            }
            guard acceptsAbsence || !entry.freshness.negative else { return .found(entry, key.hash) }
            let freshness = entry.freshness
            if freshness.freshUntil == 0 {
                if freshness.negative {
                    runtime.count(.negativeHits)
                    return .served(nil)
                }
                runtime.count(.freshHits)
                return .served(entry.value)
            }
            let now = runtime.clock.now()
            guard freshness.isFresh(at: now) else {
                // Stale, and served at once when a refresh already runs (stale-while-revalidate) or the
                // key is throttled: the common stale hit costs a look-up, not a call's set-up.
                let revalidates = loader?.staleWhileRevalidate ?? loads.defaultLoaderOptions.staleWhileRevalidate
                guard (revalidates && loads.loadRunning(key.hash, bytes)) || loads.isThrottled(key.hash, bytes, now: now)
                else { return .found(entry, key.hash) }
                runtime.count(.staleHits)
                return .served(entry.value)
            }
            let eager = loader == nil ? loads.defaultLoaderOptions.eagerRefresh : loader.unsafelyUnwrapped.eagerRefresh
            guard eager == nil
                || !LoaderOptions.eagerRefreshDue(eager, freshUntil: freshness.freshUntil, loadedAt: freshness.loadedAt, now: now)
            else { return .found(entry, key.hash) }
            runtime.count(.freshHits)
            return .served(entry.value)
        }
    }
}

/// What a loader call's first, synchronous read found.
enum LoaderProbe: Sendable {
    /// Served (nil: a remembered absence).
    case served([UInt8]?)
    /// An entry the full protocol must judge (stale, due a refresh, or negative for a call that needs a
    /// value), and the key's hash.
    case found(StoredEntry, UInt64)
    /// Not in memory; the key's hash.
    case missed(UInt64)
    /// A copy in memory that the remote tier's coherence policy may not serve (past its bound, or older
    /// than a loss of messages), and the key's hash: the full protocol asks the remote tier, with this
    /// copy as the unverified fallback.
    case unserved(StoredEntry, UInt64)
    /// The key is too long or the cache closed: the full protocol throws the error.
    case refused

    /// The entry found and the key's hash, when the probe got that far.
    var found: (StoredEntry?, UInt64?) {
        switch self {
        case .found(let entry, let hash): (entry, hash)
        case .missed(let hash), .unserved(_, let hash): (nil, hash)
        case .served, .refused: (nil, nil)
        }
    }

    /// What the probe's read of memory left for the full protocol's first walk: nothing at all
    /// (`.nothing`), a copy the policy may not serve, or nil (the walk reads memory itself).
    var memory: MemorySeen? {
        switch self {
        case .missed: .nothing
        case .unserved(let entry, _): .unserved(entry)
        default: nil
        }
    }
}
