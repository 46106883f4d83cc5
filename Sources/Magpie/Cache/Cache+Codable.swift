import Foundation

/// Turns values into the bytes a ``Cache`` stores, and back. ``JSONCacheCoder`` is the default;
/// conform your own type for a binary format (property lists, protobuf, …).
public protocol CacheCoder: Sendable {
    /// The bytes that represent `value`.
    func encode<Value: Encodable>(_ value: Value) throws -> [UInt8]
    /// The value of type `type` that `bytes` represent; throws if they do not represent one.
    func decode<Value: Decodable>(_ type: Value.Type, from bytes: [UInt8]) throws -> Value
}

/// A ``CacheCoder`` that stores values as JSON (Foundation's `JSONEncoder`/`JSONDecoder`, sorted keys
/// so equal values give equal bytes).
public struct JSONCacheCoder: CacheCoder {
    /// A JSON coder.
    public init() {}

    /// The JSON bytes of `value` (keys sorted).
    public func encode<Value: Encodable>(_ value: Value) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return [UInt8](try encoder.encode(value))
    }

    /// The `type` value that the JSON `bytes` describe; throws a `DecodingError` if they describe none.
    public func decode<Value: Decodable>(_ type: Value.Type, from bytes: [UInt8]) throws -> Value {
        try JSONDecoder().decode(type, from: Data(bytes))
    }
}

/// A typed view of a ``Cache``: `Codable` values in, the same values out, through a ``CacheCoder``.
///
/// ```swift
/// struct Profile: Codable, Sendable { var name: String; var avatar: URL }
/// let profiles = cache.typed(Profile.self)
/// try profiles.set(profile, forKey: "profile:42", options: .expiring(.after(.seconds(600))))
/// let again = try profiles.value(forKey: "profile:42")   // Profile?
/// ```
///
/// Typed views share the cache's keys: a key written as one type and read as another throws
/// ``MagpieError/Code/decodingFailed`` (when the coder can tell: JSON that happens to fit both types
/// decodes).
public struct TypedCache<Value: Codable & Sendable>: Sendable {
    /// The cache underneath.
    public let cache: Cache
    /// The coder in use.
    public let coder: any CacheCoder

    /// A typed view of `cache` using `coder`.
    public init(_ cache: Cache, coder: any CacheCoder = JSONCacheCoder()) {
        self.cache = cache
        self.coder = coder
    }

    /// The value for `key`, decoded; nil on a miss.
    /// - Throws: ``MagpieError/Code/decodingFailed`` when the stored bytes are not a `Value`; the
    ///   cache's read errors.
    public func value(forKey key: String) throws(MagpieError) -> Value? {
        guard let bytes = try cache.value(forKey: key) else { return nil }
        return try decode(bytes, key: key)
    }

    /// ``value(forKey:)-(String)`` for a key of arbitrary bytes.
    public func value(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Value? {
        let key = Array(key)
        guard let bytes = try cache.value(forKey: key) else { return nil }
        return try decode(bytes, key: Self.describe(key))
    }

    /// Encodes `value` and stores it for `key`.
    /// - Throws: ``MagpieError/Code/encodingFailed``; the cache's store errors.
    public func set(_ value: Value, forKey key: String, options: EntryOptions? = nil) throws(MagpieError) {
        try cache.set(try encode(value, key: key), forKey: key, options: options)
    }

    /// ``set(_:forKey:options:)-(_,String,_)`` for a key of arbitrary bytes.
    public func set(_ value: Value, forKey key: some Sequence<UInt8>, options: EntryOptions? = nil) throws(MagpieError) {
        let key = Array(key)
        try cache.set(try encode(value, key: Self.describe(key)), forKey: key, options: options)
    }

    /// Removes `key`; see `Cache.removeValue(forKey:)`.
    @discardableResult
    public func removeValue(forKey key: String) throws(MagpieError) -> Bool {
        try cache.removeValue(forKey: key)
    }

    /// ``removeValue(forKey:)-(String)`` for a key of arbitrary bytes.
    @discardableResult
    public func removeValue(forKey key: some Sequence<UInt8>) throws(MagpieError) -> Bool {
        try cache.removeValue(forKey: key)
    }

    /// The decoded value for `key`, nil on a miss or any error. Assigning encodes and stores; nil
    /// removes. A failure is logged and counted in ``CacheStatistics/subscriptFailures``.
    public subscript(key: String) -> Value? {
        get { cache.subscriptRead { () throws(MagpieError) in try value(forKey: key) } ?? nil }
        nonmutating set {
            cache.subscriptWrite { () throws(MagpieError) in
                if let newValue { try set(newValue, forKey: key) } else { try removeValue(forKey: key) }
            }
        }
    }

    /// ``subscript(_:)-(String)`` for a key of arbitrary bytes.
    public subscript<Key: Sequence<UInt8>>(key: Key) -> Value? {
        get { cache.subscriptRead { () throws(MagpieError) in try value(forKey: key) } ?? nil }
        nonmutating set {
            cache.subscriptWrite { () throws(MagpieError) in
                if let newValue { try set(newValue, forKey: key) } else { try removeValue(forKey: key) }
            }
        }
    }

    /// The asynchronous forms (disk I/O on the cache's I/O threads); see ``Cache/async``.
    public var async: AsyncTypedCache<Value> { AsyncTypedCache(typed: self) }

    /// The value for `key`, or on a miss (or, per `loader`, when stale) the value `load` produces,
    /// stored with `options`; concurrent callers share one load. See
    /// ``Cache/value(forKey:options:loader:load:)-(String,_,_,_)``.
    nonisolated(nonsending)
    public func value(
        forKey key: String, options: EntryOptions? = nil, loader: LoaderOptions? = nil,
        load: @escaping @Sendable () async throws -> Value
    ) async throws -> Value {
        let coder = self.coder
        let bytes = try await cache.value(forKey: key, options: options, loader: loader) {
            let value = try await load()
            do {
                return try coder.encode(value)
            } catch {
                throw MagpieError(.encodingFailed, "could not encode a \(Value.self) for key '\(key)': \(error)")
            }
        }
        return try decode(bytes, key: key)
    }

    /// A key's bytes for messages: as text when they are UTF-8, else in hex.
    static func describe(_ key: [UInt8]) -> String {
        if let text = String(validating: key, as: UTF8.self) { return text }
        return "0x" + key.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    func decoded(_ bytes: [UInt8], key: String) throws(MagpieError) -> Value { try decode(bytes, key: key) }
    func encoded(_ value: Value, key: String) throws(MagpieError) -> [UInt8] { try encode(value, key: key) }

    private func decode(_ bytes: [UInt8], key: String) throws(MagpieError) -> Value {
        do {
            return try coder.decode(Value.self, from: bytes)
        } catch {
            throw MagpieError(.decodingFailed, "the value for key '\(key)' does not decode as \(Value.self): \(error)")
        }
    }

    private func encode(_ value: Value, key: String) throws(MagpieError) -> [UInt8] {
        do {
            return try coder.encode(value)
        } catch {
            throw MagpieError(.encodingFailed, "could not encode a \(Value.self) for key '\(key)': \(error)")
        }
    }
}

/// The asynchronous view of a ``TypedCache`` (see ``TypedCache/async``): disk I/O on the cache's I/O
/// threads, a memory hit without a hop.
public struct AsyncTypedCache<Value: Codable & Sendable>: Sendable {
    /// The typed view underneath.
    public let typed: TypedCache<Value>

    /// The value for `key`, decoded; see ``TypedCache/value(forKey:)-(String)``.
    nonisolated(nonsending)
    public func value(forKey key: String) async throws -> Value? {
        guard let bytes = try await typed.cache.async.value(forKey: key) else { return nil }
        return try typed.decoded(bytes, key: key)
    }

    /// ``value(forKey:)-(String)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func value(forKey key: some Sequence<UInt8>) async throws -> Value? {
        let key = Array(key)
        guard let bytes = try await typed.cache.async.value(forKey: key) else { return nil }
        return try typed.decoded(bytes, key: TypedCache<Value>.describe(key))
    }

    /// Encodes `value` and stores it for `key`; see ``TypedCache/set(_:forKey:options:)-(_,String,_)``.
    nonisolated(nonsending)
    public func set(_ value: Value, forKey key: String, options: EntryOptions? = nil) async throws {
        try await typed.cache.async.set(try typed.encoded(value, key: key), forKey: key, options: options)
    }

    /// ``set(_:forKey:options:)-(_,String,_)`` for a key of arbitrary bytes.
    nonisolated(nonsending)
    public func set(_ value: Value, forKey key: some Sequence<UInt8>, options: EntryOptions? = nil) async throws {
        let key = Array(key)
        try await typed.cache.async.set(try typed.encoded(value, key: TypedCache<Value>.describe(key)), forKey: key, options: options)
    }

    /// Removes `key`; see ``TypedCache/removeValue(forKey:)-(String)``.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: String) async throws -> Bool {
        try await typed.cache.async.removeValue(forKey: key)
    }

    /// ``removeValue(forKey:)-(String)`` for a key of arbitrary bytes.
    @discardableResult nonisolated(nonsending)
    public func removeValue(forKey key: some Sequence<UInt8>) async throws -> Bool {
        try await typed.cache.async.removeValue(forKey: key)
    }
}

extension Cache {
    /// A typed view of this cache for `Codable` values of `type`, coded by `coder` (JSON by default).
    public func typed<Value: Codable & Sendable>(_ type: Value.Type, coder: any CacheCoder = JSONCacheCoder()) -> TypedCache<Value> {
        TypedCache(self, coder: coder)
    }

    /// The value for `key` decoded as `type` by `coder`; nil on a miss.
    /// - Throws: ``MagpieError/Code/decodingFailed`` when the stored bytes are not a `type`.
    public func value<Value: Codable & Sendable>(forKey key: String, as type: Value.Type, coder: any CacheCoder = JSONCacheCoder())
        throws(MagpieError) -> Value?
    {
        try TypedCache<Value>(self, coder: coder).value(forKey: key)
    }

    /// ``value(forKey:as:coder:)-(String,_,_)`` for a key of arbitrary bytes.
    public func value<Value: Codable & Sendable>(
        forKey key: some Sequence<UInt8>, as type: Value.Type, coder: any CacheCoder = JSONCacheCoder()
    ) throws(MagpieError) -> Value? {
        try TypedCache<Value>(self, coder: coder).value(forKey: key)
    }
}
