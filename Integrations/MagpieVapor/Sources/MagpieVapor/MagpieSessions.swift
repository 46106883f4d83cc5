import Magpie
import Vapor

extension Application.Sessions.Provider {
    /// Vapor's sessions kept in a Magpie cache, with a sliding lifetime:
    /// `app.sessions.use(.magpie(cache))`.
    ///
    /// ```swift
    /// let sessions = try Magpie.Cache(Magpie.Cache.Configuration(
    ///     directory: "/var/lib/my-app/sessions", memoryBudget: 32 << 20, diskBudget: 2 << 30))
    /// app.sessions.use(.magpie(sessions, lifetime: .seconds(30 * 60)))
    /// app.middleware.use(app.sessions.middleware)
    /// ```
    ///
    /// See ``MagpieSessions`` for the rules, and for why sessions deserve a cache of their own.
    /// - Parameters:
    ///   - cache: where the sessions live (memory and disk; with a remote tier, every instance).
    ///   - lifetime: how long a session lives unused (default 7 days, the lifetime of Vapor's default
    ///     session cookie).
    ///   - refreshAfter: how long after its last write an unchanged session is written again to extend
    ///     its lifetime; nil: a tenth of `lifetime`.
    ///   - keyPrefix: prepended to every session ID in the cache.
    ///   - group: the group the sessions are stored in (`cache.removeAll(inGroup:)` then ends them all);
    ///     nil for none.
    ///   - tiers: the tiers the sessions are kept in (memory and disk by default).
    public static func magpie(
        _ cache: Magpie.Cache, lifetime: Duration = .seconds(7 * 24 * 3600), refreshAfter: Duration? = nil,
        keyPrefix: String = "vapor-session:", group: String? = nil, tiers: Tiers = .memoryAndDisk
    ) -> Self {
        let driver = MagpieSessions(
            cache: cache, lifetime: lifetime, refreshAfter: refreshAfter, keyPrefix: keyPrefix, group: group, tiers: tiers)
        return .init { application in
            application.sessions.use { _ in driver }
        }
    }
}

/// Vapor's sessions (`AsyncSessionDriver`) kept in a Magpie ``Magpie/Cache``, with a sliding lifetime:
/// registered with `app.sessions.use(.magpie(cache))`.
///
/// - **Create** stores the data under a new random ID (256 bits, base64url) for ``lifetime``.
/// - **Read** returns the data, or nil for an unknown, expired or unreadable ID (Vapor then starts a
///   new session, as for any unknown cookie). A read never writes.
/// - **Update** (`SessionsMiddleware` calls it on every response of a request that has a session)
///   writes only when the data changed since this request read it, or when the session was last
///   written ``refreshAfter`` ago or more: an unchanged session is not rewritten on every response, and
///   a session in use is written again at most once per ``refreshAfter`` to extend its lifetime. So a
///   session expires after ``lifetime`` without requests, give or take ``refreshAfter`` (from
///   `lifetime - refreshAfter` to `lifetime` after its last request).
/// - **Delete** removes it.
///
/// Sessions are kept in the cache's tiers (``tiers``, memory and disk by default): they survive a
/// restart when the cache has a directory, and every instance of a fleet shares them when it has a
/// remote tier. Each is stored as a 20-byte header (`MVS`, a format byte, the time it was written and
/// the time it expires, in milliseconds since 1970, little endian) and the data as JSON; the cache
/// expires the entry at the same instant.
///
/// ## A session evicted for space logs its user out
///
/// A cache keeps its byte budgets by evicting entries, and a session is an entry like any other: in a
/// cache shared with other values, a burst of those can evict sessions, and their users find
/// themselves logged out. Give sessions a cache of their own, budgeted for them: with a disk tier, a
/// session evicted from memory is still read from disk, so the disk budget is the one that must hold
/// every live session (sessions × their encoded size, with room to spare); the memory budget only
/// decides how many are read without touching the disk.
///
/// ```swift
/// // About 10 million sessions of 200 bytes fit in 2 GiB on disk; the 32 MiB in memory hold the active ones.
/// let sessions = try Magpie.Cache(Magpie.Cache.Configuration(
///     directory: "/var/lib/my-app/sessions", memoryBudget: 32 << 20, diskBudget: 2 << 30))
/// app.sessions.use(.magpie(sessions, lifetime: .seconds(30 * 60)))
/// // Values cached for speed live elsewhere, where eviction costs only a recomputation:
/// app.caches.use(.magpie(try Magpie.Cache(Magpie.Cache.Configuration(directory: "/var/cache/my-app"))))
/// ```
///
/// Also make the session cookie live as long as the session (`app.sessions.configuration`'s
/// `cookieFactory`; Vapor's default cookie lives a week, and is set again on every response).
public struct MagpieSessions: AsyncSessionDriver {
    /// The cache that keeps the sessions.
    public let cache: Magpie.Cache
    /// How long a session lives without a request that writes it.
    public let lifetime: Duration
    /// How long after its last write an unchanged session in use is written again.
    public let refreshAfter: Duration
    /// Prepended to every session ID in the cache.
    public let keyPrefix: String
    /// The group the sessions are stored in, if any.
    public let group: String?
    /// The tiers the sessions are kept in.
    public let tiers: Tiers
    let lifetimeMilliseconds: Int64
    let refreshMilliseconds: Int64

    /// A driver over `cache`; see ``Vapor/Application/Sessions/Provider/magpie(_:lifetime:refreshAfter:keyPrefix:group:tiers:)``
    /// for the parameters.
    public init(
        cache: Magpie.Cache, lifetime: Duration = .seconds(7 * 24 * 3600), refreshAfter: Duration? = nil,
        keyPrefix: String = "vapor-session:", group: String? = nil, tiers: Tiers = .memoryAndDisk
    ) {
        self.cache = cache
        let lifetime = max(lifetime, .milliseconds(1))
        self.lifetime = lifetime
        self.keyPrefix = keyPrefix
        self.group = group
        self.tiers = tiers
        lifetimeMilliseconds = Self.milliseconds(lifetime)
        let refresh = refreshAfter.map { min(max($0, .zero), lifetime) } ?? lifetime / 10
        self.refreshAfter = refresh
        refreshMilliseconds = Self.milliseconds(refresh)
    }

    public func createSession(_ data: SessionData, for request: Request) async throws -> SessionID {
        let id = SessionID(string: Self.newID())
        try await write(data, id, for: request)
        return id
    }

    public func readSession(_ sessionID: SessionID, for request: Request) async throws -> SessionData? {
        guard let bytes = try await cache.async.value(forKey: keyPrefix + sessionID.string),
            let record = Record(bytes), cache.configuration.clock.now() < record.expires
        else { return nil }
        // Vapor's `SessionData` decodes from a JSON object of strings; anything else under the key
        // (written by something other than this driver) is no session of ours.
        guard let data = try? JSONDecoder().decode(SessionData.self, from: Data(record.body)) else { return nil }
        request.storage[ReadKey.self] = Read(id: sessionID, data: data, written: record.written)
        return data
    }

    public func updateSession(_ sessionID: SessionID, to data: SessionData, for request: Request) async throws -> SessionID {
        if let read = request.storage[ReadKey.self], read.id == sessionID, read.data == data,
            cache.configuration.clock.now() - read.written < refreshMilliseconds
        {
            return sessionID  // unchanged, and written recently enough
        }
        try await write(data, sessionID, for: request)
        return sessionID
    }

    public func deleteSession(_ sessionID: SessionID, for request: Request) async throws {
        _ = try await cache.async.removeValue(forKey: keyPrefix + sessionID.string)
        if request.storage[ReadKey.self]?.id == sessionID { request.storage[ReadKey.self] = nil }
    }

    // MARK: - The record

    func write(_ data: SessionData, _ id: SessionID, for request: Request) async throws {
        let body = try JSONEncoder().encode(data)
        let now = cache.configuration.clock.now()
        let (sum, overflow) = now.addingReportingOverflow(lifetimeMilliseconds)
        let expires = overflow ? Int64.max : sum
        let bytes = Record.encode(written: now, expires: expires, body: body)
        try await cache.async.set(
            bytes, forKey: keyPrefix + id.string,
            options: EntryOptions(memoryExpiry: .at(millisecondsSince1970: expires), group: group, tiers: tiers))
        request.storage[ReadKey.self] = Read(id: id, data: data, written: now)
    }

    /// A stored session: when it was written and expires (ms since 1970) and its JSON.
    struct Record {
        static let magic: [UInt8] = [0x4D, 0x56, 0x53, 0x01]  // "MVS", format 1
        static let headerLength = 20

        var written: Int64
        var expires: Int64
        var body: ArraySlice<UInt8>

        init?(_ bytes: [UInt8]) {
            guard bytes.count >= Self.headerLength, bytes[0..<4].elementsEqual(Self.magic) else { return nil }
            func int64(at offset: Int) -> Int64 {
                var value: Int64 = 0
                for index in (offset..<offset + 8).reversed() { value = value << 8 | Int64(bytes[index]) }
                return value
            }
            written = int64(at: 4)
            expires = int64(at: 12)
            body = bytes[Self.headerLength...]
        }

        static func encode(written: Int64, expires: Int64, body: Data) -> [UInt8] {
            var bytes = magic
            bytes.reserveCapacity(headerLength + body.count)
            for value in [written, expires] {
                for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: value >> Int64(shift))) }
            }
            bytes.append(contentsOf: body)
            return bytes
        }
    }

    /// What this request read (or last wrote) of its session: the update compares against it.
    struct Read: Sendable {
        var id: SessionID
        var data: SessionData
        var written: Int64
    }

    struct ReadKey: StorageKey {
        typealias Value = Read
    }

    /// 32 random bytes from the system's generator, base64url without padding (43 characters, safe in a
    /// cookie and a cache key).
    static func newID() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes = [UInt8]()
        bytes.reserveCapacity(32)
        for _ in 0..<4 {
            let word: UInt64 = generator.next()
            for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? 0 : Int64.max }
        let (sum, sumOverflow) = whole.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        return sumOverflow ? Int64.max : max(0, sum)
    }
}
