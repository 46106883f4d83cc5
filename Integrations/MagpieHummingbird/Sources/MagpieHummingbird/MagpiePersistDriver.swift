import Hummingbird
import Magpie

/// Hummingbird's key-value persistence (`PersistDriver`) kept in a Magpie ``Cache``: in memory, on disk
/// across restarts, and, with a remote tier, shared by a fleet.
///
/// ```swift
/// let cache = try Cache(Cache.Configuration(directory: "/var/cache/sessions"))
/// let persist = MagpiePersistDriver(cache: cache)
/// try await persist.create(key: "session:\(id)", value: session, expires: .seconds(3600))
/// ```
///
/// The protocol's rules, exactly as Hummingbird's `MemoryPersistDriver` keeps them (one test suite runs
/// against both):
/// - `create` throws `PersistError.duplicate` when the key holds a value; an expired value counts as
///   absent (as with Redis's `SET NX`; `MemoryPersistDriver` still refuses until its tidy pass runs).
/// - `set` without an expiry keeps the expiry of the value it replaces (none when the key holds no
///   unexpired value: an expired or evicted value has none to keep); with one, sets it anew.
/// - `get` returns nil for an absent or expired key, and throws `PersistError.invalidConversion` when the
///   stored value does not decode as the type asked for.
/// - `getWithTTL` reports the time left until the value expires, nil for a value that never does.
///
/// Values are encoded by the cache's coder (JSON by default) after a 12-byte envelope: the magic `MPD`,
/// a format byte (1), and the expiry in milliseconds since 1970 (0: none), little endian. Each key is
/// stored under `keyPrefix` + the key, with ``EntryOptions/tiers`` = `tiers`; the cache expires the
/// entry at the same instant.
///
/// `create`, `set` and `remove` of one key are serialised through the driver (a striped async lock,
/// held across the cache call and never across anything else), so a `create` racing any number of
/// others through the same driver succeeds exactly once, and a `set` that keeps an expiry keeps the one
/// it replaced. The lock is the driver's, in one process: writes through another driver or process
/// (instances sharing a fleet tier) or through the ``Cache`` itself are not serialised with these.
public struct MagpiePersistDriver: PersistDriver {
    /// The cache that keeps the values.
    public let cache: Cache
    /// Prepended to every key (so that the driver's entries can share a cache with others).
    public let keyPrefix: String
    /// The tiers the driver's entries are kept in.
    public let tiers: Tiers
    /// Encodes and decodes the values.
    public let coder: any CacheCoder
    /// Whether ``shutdown()`` shuts the cache down too (flush, close), or only flushes it.
    public let shutsDownCache: Bool
    let locks = KeyLocks()

    /// A driver over `cache`.
    /// - Parameters:
    ///   - cache: where the values live.
    ///   - keyPrefix: prepended to every key.
    ///   - tiers: the tiers each value is kept in (`.memoryAndDisk` by default: values survive a restart
    ///     when the cache has a directory).
    ///   - coder: the values' encoding (JSON by default).
    ///   - shutsDownCache: true when the driver owns the cache: ``shutdown()`` (called when the driver runs
    ///     as a service and its group shuts down) then shuts the cache down; false (the default) flushes it.
    public init(
        cache: Cache, keyPrefix: String = "persist:", tiers: Tiers = .memoryAndDisk,
        coder: any CacheCoder = JSONCacheCoder(), shutsDownCache: Bool = false
    ) {
        self.cache = cache
        self.keyPrefix = keyPrefix
        self.tiers = tiers
        self.coder = coder
        self.shutsDownCache = shutsDownCache
    }

    public func create<Object: Codable & Sendable>(key: String, value: Object, expires: Duration?) async throws {
        let bytes = try coder.encode(value)
        try await locks.withLock(key) {
            let now = cache.configuration.clock.now()
            if try await current(key, now: now) != nil { throw PersistError.duplicate }
            try await store(bytes, key, deadline: expires.map { Self.deadline(now: now, after: $0) } ?? 0)
        }
    }

    public func set<Object: Codable & Sendable>(key: String, value: Object, expires: Duration?) async throws {
        let bytes = try coder.encode(value)
        try await locks.withLock(key) {
            let now = cache.configuration.clock.now()
            let deadline: Int64
            if let expires {
                deadline = Self.deadline(now: now, after: expires)
            } else {
                // Bytes that are not an envelope of this driver's have no expiry to keep (they are
                // replaced whole); any other failure to read the old value fails the set, so that a
                // value meant to expire never becomes permanent by accident.
                do {
                    deadline = try await current(key, now: now)?.deadline ?? 0
                } catch let error as PersistError where error == .invalidConversion {
                    deadline = 0
                }
            }
            try await store(bytes, key, deadline: deadline)
        }
    }

    public func get<Object: Codable & Sendable>(key: String, as type: Object.Type) async throws -> Object? {
        try await getWithTTL(key: key, as: type)?.object
    }

    public func getWithTTL<Object: Codable & Sendable>(key: String, as type: Object.Type) async throws -> (
        object: Object, ttl: Duration?
    )? {
        let now = cache.configuration.clock.now()
        guard let found = try await current(key, now: now) else { return nil }
        let object: Object
        do {
            object = try coder.decode(type, from: Array(found.body))
        } catch {
            throw PersistError.invalidConversion
        }
        return (object, found.deadline == 0 ? nil : .milliseconds(found.deadline - now))
    }

    public func remove(key: String) async throws {
        try await locks.withLock(key) {
            _ = try await cache.async.removeValue(forKey: keyPrefix + key)
        }
    }

    /// Flushes the cache (every store and removal made durable); when the driver owns the cache, shuts
    /// it down too.
    public func shutdown() async throws {
        if shutsDownCache {
            try await cache.shutdown()
        } else {
            try await cache.async.flush()
        }
    }

    // MARK: - The envelope

    /// A stored value: its expiry (ms since 1970, 0 = none) and its encoded bytes.
    struct Found {
        var deadline: Int64
        var body: ArraySlice<UInt8>
    }

    static let magic: [UInt8] = [0x4D, 0x50, 0x44, 0x01]  // "MPD", format 1
    static let headerLength = 12

    /// The key's unexpired value at `now`, nil when there is none; throws `invalidConversion` for a value
    /// that is not an envelope of this driver's.
    func current(_ key: String, now: Int64) async throws -> Found? {
        guard let bytes = try await cache.async.value(forKey: keyPrefix + key) else { return nil }
        guard let found = Self.open(bytes) else { throw PersistError.invalidConversion }
        if found.deadline != 0 && now >= found.deadline { return nil }
        return found
    }

    func store(_ body: [UInt8], _ key: String, deadline: Int64) async throws {
        var bytes = Self.magic
        bytes.reserveCapacity(Self.headerLength + body.count)
        withUnsafeBytes(of: deadline.littleEndian) { bytes.append(contentsOf: $0) }
        bytes.append(contentsOf: body)
        let expiry: Expiry = deadline == 0 ? .never : .at(millisecondsSince1970: deadline)
        try await cache.async.set(bytes, forKey: keyPrefix + key, options: EntryOptions(memoryExpiry: expiry, tiers: tiers))
    }

    static func open(_ bytes: [UInt8]) -> Found? {
        guard bytes.count >= headerLength, bytes[0..<4].elementsEqual(magic) else { return nil }
        var deadline: Int64 = 0
        for index in (4..<12).reversed() { deadline = deadline << 8 | Int64(bytes[index]) }
        guard deadline >= 0 else { return nil }
        return Found(deadline: deadline, body: bytes[headerLength...])
    }

    /// `now` + `duration` in milliseconds, rounded up (a positive duration never expires at once),
    /// saturating; at least 1 (0 means "none").
    static func deadline(now: Int64, after duration: Duration) -> Int64 {
        guard duration > .zero else { return max(1, now) }
        let (seconds, attoseconds) = duration.components
        let milliseconds = seconds > Int64.max / 1000 - 1 ? Int64.max : seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        let sum = now.addingReportingOverflow(milliseconds)
        return sum.overflow ? Int64.max : max(1, sum.partialValue)
    }
}
