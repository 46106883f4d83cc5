import NIOCore

/// One RESP3 value, as a Redis or Valkey server sends it (RESP2's null bulk string and null array
/// decode as ``null``).
///
/// Bulk payloads are `ByteBuffer` slices of what the connection read: no copy is made to hand them out.
/// Under Thread Sanitizer, SwiftNIO's reuse of a receive buffer after another thread has read and dropped
/// a slice of it can be reported as a race: the two are ordered by the Swift runtime's reference count,
/// which TSan does not see. `scripts/tsan-suppressions.txt` has the line that silences that report.
public enum RESPValue: Sendable, Hashable {
    /// `+OK\r\n`
    case simpleString(String)
    /// `-ERR message\r\n`: the whole line after the `-`.
    case simpleError(String)
    /// `:42\r\n`
    case integer(Int64)
    /// `$5\r\nhello\r\n`
    case bulkString(ByteBuffer)
    /// `*2\r\n…`
    case array([RESPValue])
    /// `_\r\n`, and RESP2's `$-1\r\n` and `*-1\r\n`.
    case null
    /// `#t\r\n` / `#f\r\n`
    case boolean(Bool)
    /// `,1.5\r\n` (also `inf`, `-inf`, `nan`).
    case double(Double)
    /// `(3492890328409238509324850943850943825024385\r\n`: the digits, as sent.
    case bigNumber(String)
    /// `!21\r\nSYNTAX invalid syntax\r\n`
    case bulkError(String)
    /// `=15\r\ntxt:Some string\r\n`: the three-letter format and the text.
    case verbatimString(format: String, text: ByteBuffer)
    /// `%2\r\n…`: key–value pairs in the order sent.
    case map([RESPPair])
    /// `~3\r\n…`
    case set([RESPValue])
    /// `|1\r\n…` followed by the value it annotates.
    indirect case attributed(attributes: [RESPPair], value: RESPValue)
    /// `>3\r\n…`: out-of-band data (invalidations, pub/sub messages), never the reply to a command.
    case push([RESPValue])
}

/// A key–value pair of a RESP3 map or attribute.
public struct RESPPair: Sendable, Hashable {
    public var key: RESPValue
    public var value: RESPValue

    public init(key: RESPValue, value: RESPValue) {
        self.key = key
        self.value = value
    }
}
