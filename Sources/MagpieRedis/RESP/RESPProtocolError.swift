/// The server sent bytes that are not RESP3, or a reply beyond the ``RESPDecoderLimits``.
///
/// The stream cannot be resynchronised after one: the connection must be closed.
public struct RESPProtocolError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What was wrong with the input. New kinds may be added.
    public struct Kind: Sendable, Hashable, CustomStringConvertible {
        private enum Base: Sendable, Hashable {
            case malformed, bulkTooLong, aggregateTooLarge, nestingTooDeep, lineTooLong, frameTooLarge
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The bytes are not RESP3 as Redis sends it: an unknown type byte, a missing CRLF, a bad number,
        /// a streamed type, and so on.
        public static let malformed = Kind(.malformed)
        /// A bulk string, bulk error or verbatim string longer than ``RESPDecoderLimits/maxBulkLength``.
        public static let bulkTooLong = Kind(.bulkTooLong)
        /// An aggregate with more elements (or pairs) than ``RESPDecoderLimits/maxAggregateCount``.
        public static let aggregateTooLarge = Kind(.aggregateTooLarge)
        /// Aggregates nested deeper than ``RESPDecoderLimits/maxDepth``.
        public static let nestingTooDeep = Kind(.nestingTooDeep)
        /// A line longer than ``RESPDecoderLimits/maxLineLength``.
        public static let lineTooLong = Kind(.lineTooLong)
        /// A reply beyond ``RESPDecoderLimits/maxFrameElements`` or ``RESPDecoderLimits/maxFrameBytes``.
        public static let frameTooLarge = Kind(.frameTooLarge)

        /// The kind's name, such as `malformed`.
        public var description: String { "\(base)" }
    }

    /// What was wrong.
    public let kind: Kind
    /// What was wrong, for people.
    public let message: String

    /// An error of the given kind.
    ///
    /// - Parameters:
    ///   - kind: What was wrong.
    ///   - message: What was wrong, for people.
    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// The kind and the message, such as `malformed: unknown RESP type byte 0x41`.
    public var description: String { "\(kind): \(message)" }
}
