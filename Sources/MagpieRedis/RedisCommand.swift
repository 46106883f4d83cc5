import NIOCore

/// One argument of a command: sent as a RESP bulk string.
public enum RedisArgument: Sendable, Hashable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral {
    case string(String)
    case bytes([UInt8])
    case buffer(ByteBuffer)
    case integer(Int64)

    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }

    /// The argument's bytes, as the server will see them.
    public var bytes: [UInt8] {
        switch self {
        case .string(let s): return Array(s.utf8)
        case .bytes(let b): return b
        case .buffer(let b): return Array(b.readableBytesView)
        case .integer(let i): return Array(String(i).utf8)
        }
    }
}

/// A command ready to send: encoded once, when it is made, as a RESP array of bulk strings.
///
/// A command knows its name (for metrics, logs and the subscription protocol) and, when it has keys, the
/// cluster hash slot of its first key (``slot``), so a cluster client can route it without parsing it
/// again. Commands are values: a batch or a retry resends the same bytes.
public struct RedisCommand: Sendable {
    /// The command's name, upper case (`GET`, `SET`, `CLIENT`).
    public let name: String
    /// The RESP encoding: `*<n>\r\n` then `$<len>\r\n<bytes>\r\n` per argument (the name first).
    public let encoded: ByteBuffer
    /// The hash slot of the first key (0…16383), or nil for a command with no key.
    public let slot: UInt16?
    /// Whether the command only reads (may be sent to a replica; safe to retry after a connection loss).
    public let isReadOnly: Bool

    /// A command from its name and arguments. `keyIndices` name the arguments that are keys (used for
    /// cluster routing: the slot of the first key).
    public init(_ name: String, _ arguments: [RedisArgument] = [], keyIndices: [Int] = [], readOnly: Bool = false) {
        self.name = name.uppercased()
        var buffer = ByteBufferAllocator().buffer(capacity: 16 + name.utf8.count + arguments.count * 24)
        buffer.writeRESPArrayHeader(arguments.count + 1)
        buffer.writeRESPBulk(name.utf8)
        var slot: UInt16?
        for (index, argument) in arguments.enumerated() {
            switch argument {
            case .string(let s): buffer.writeRESPBulk(s.utf8)
            case .bytes(let b): buffer.writeRESPBulk(b)
            case .buffer(let b): buffer.writeRESPBulk(b.readableBytesView)
            case .integer(let i): buffer.writeRESPBulk(String(i).utf8)
            }
            if slot == nil, keyIndices.contains(index) {
                switch argument {
                case .string(let s): slot = RedisHashSlot.slot(of: s.utf8)
                case .bytes(let b): slot = RedisHashSlot.slot(of: b)
                case .buffer(let b): slot = RedisHashSlot.slot(of: b.readableBytesView)
                case .integer(let i): slot = RedisHashSlot.slot(of: String(i).utf8)
                }
            }
        }
        self.encoded = buffer
        self.slot = slot
        self.isReadOnly = readOnly
    }

    /// `GET key`
    @inlinable
    public static func get<Key: Collection<UInt8>>(_ key: Key) -> RedisCommand {
        if let command = key.withContiguousStorageIfAvailable({ get(bytes: UnsafeRawBufferPointer($0)) }) {
            return command
        }
        return Array(key).withUnsafeBytes { get(bytes: $0) }
    }

    /// `GET key`
    public static func get(_ key: String) -> RedisCommand {
        var key = key
        return key.withUTF8 { get(bytes: UnsafeRawBufferPointer($0)) }
    }

    /// `GET key` with the key's raw bytes (the non-generic core of the other forms).
    public static func get(bytes key: UnsafeRawBufferPointer) -> RedisCommand {
        var buffer = ByteBufferAllocator().buffer(capacity: 24 + key.count)
        buffer.writeStaticString("*2\r\n$3\r\nGET\r\n")
        buffer.writeRESPBulk(raw: key)
        return RedisCommand(name: "GET", encoded: buffer, slot: RedisHashSlot.slot(ofBytes: key), isReadOnly: true)
    }

    /// `SET key value [PX milliseconds] [NX|XX]`
    @inlinable
    public static func set<Key: Collection<UInt8>, Value: Collection<UInt8>>(
        _ key: Key, _ value: Value, expiration: Duration? = nil, condition: RedisSetCondition = .always
    ) -> RedisCommand {
        let command = key.withContiguousStorageIfAvailable { key in
            value.withContiguousStorageIfAvailable { value in
                set(bytes: UnsafeRawBufferPointer(key), UnsafeRawBufferPointer(value), expiration: expiration, condition: condition)
            }
        }
        if let command = command ?? nil { return command }
        return Array(key).withUnsafeBytes { key in
            Array(value).withUnsafeBytes { value in
                set(bytes: key, value, expiration: expiration, condition: condition)
            }
        }
    }

    /// `SET key value …` with a string key.
    @inlinable
    public static func set<Value: Collection<UInt8>>(
        _ key: String, _ value: Value, expiration: Duration? = nil, condition: RedisSetCondition = .always
    ) -> RedisCommand {
        set(Array(key.utf8), value, expiration: expiration, condition: condition)
    }

    /// `SET key value [PX milliseconds] [NX|XX]` with raw bytes (the non-generic core of the other forms).
    public static func set(
        bytes key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer, expiration: Duration? = nil,
        condition: RedisSetCondition = .always
    ) -> RedisCommand {
        var count = 3
        if expiration != nil { count += 2 }
        if condition != .always { count += 1 }
        var buffer = ByteBufferAllocator().buffer(capacity: 64 + key.count + value.count)
        buffer.writeRESPArrayHeader(count)
        buffer.writeStaticString("$3\r\nSET\r\n")
        buffer.writeRESPBulk(raw: key)
        buffer.writeRESPBulk(raw: value)
        if let expiration {
            buffer.writeStaticString("$2\r\nPX\r\n")
            let ms = max(1, expiration.components.seconds * 1000 + expiration.components.attoseconds / 1_000_000_000_000_000)
            buffer.writeRESPBulk(String(ms).utf8)
        }
        switch condition {
        case .always: break
        case .ifNotExists: buffer.writeStaticString("$2\r\nNX\r\n")
        case .ifExists: buffer.writeStaticString("$2\r\nXX\r\n")
        }
        return RedisCommand(name: "SET", encoded: buffer, slot: RedisHashSlot.slot(ofBytes: key), isReadOnly: false)
    }

    /// `DEL key…` (all keys should share a slot in a cluster).
    public static func del(_ keys: [String]) -> RedisCommand {
        RedisCommand("DEL", keys.map { .string($0) }, keyIndices: Array(keys.indices))
    }

    /// `PING`
    public static let ping = RedisCommand("PING", readOnly: true)

    /// `ASKING` (sent before a command redirected by `-ASK`).
    static let asking = RedisCommand("ASKING")

    init(name: String, encoded: ByteBuffer, slot: UInt16?, isReadOnly: Bool) {
        self.name = name
        self.encoded = encoded
        self.slot = slot
        self.isReadOnly = isReadOnly
    }
}

/// The condition of a `SET`.
public enum RedisSetCondition: Sendable, Hashable {
    case always
    /// `NX`: only if the key does not exist.
    case ifNotExists
    /// `XX`: only if the key exists.
    case ifExists
}

extension ByteBuffer {
    @inlinable
    mutating func writeRESPArrayHeader(_ count: Int) {
        writeInteger(UInt8(ascii: "*"))
        writeDecimal(count)
        writeInteger(UInt16(0x0D0A))  // "\r\n", big endian
    }

    mutating func writeRESPBulk(raw bytes: UnsafeRawBufferPointer) {
        writeInteger(UInt8(ascii: "$"))
        writeDecimal(bytes.count)
        writeInteger(UInt16(0x0D0A))
        writeBytes(bytes)
        writeInteger(UInt16(0x0D0A))
    }

    @inlinable
    mutating func writeRESPBulk<Bytes: Collection<UInt8>>(_ bytes: Bytes) {
        writeInteger(UInt8(ascii: "$"))
        writeDecimal(bytes.count)
        writeInteger(UInt16(0x0D0A))
        writeBytes(bytes)
        writeInteger(UInt16(0x0D0A))
    }

    /// A non-negative integer in decimal ASCII, without a String.
    @inlinable
    mutating func writeDecimal(_ value: Int) {
        if value < 10 {
            writeInteger(UInt8(48 + value))
            return
        }
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // up to 24 digits
        var count = 0
        var v = value
        withUnsafeMutableBytes(of: &digits) { raw in
            while v > 0 {
                raw[23 - count] = UInt8(48 + v % 10)
                v /= 10
                count += 1
            }
        }
        withUnsafeBytes(of: &digits) { raw in
            _ = writeBytes(UnsafeRawBufferPointer(rebasing: raw[(24 - count)...]))
        }
    }
}
