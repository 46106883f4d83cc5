/// Bounds on what one reply may make the client hold in memory, so that a broken or hostile server cannot
/// make it allocate without end.
///
/// Each limit is checked as soon as the server *claims* a size — in a bulk length or an aggregate count —
/// before the bytes it announces arrive, so an oversized reply fails at once instead of being buffered.
/// Exceeding a limit throws a ``RESPProtocolError``; the connection is then closed.
public struct RESPDecoderLimits: Sendable, Hashable {
    /// The longest bulk string, bulk error or verbatim string accepted: its payload in bytes, without the
    /// header or the closing CRLF. Longer ones throw ``RESPProtocolError/Kind-swift.struct/bulkTooLong``.
    ///
    /// Default: 512 MiB, the largest value Redis stores by default (`proto-max-bulk-len`).
    public var maxBulkLength: Int = 512 * 1024 * 1024

    /// The most elements one array, set or push may have, and the most key–value pairs one map or attribute
    /// may have. More throw ``RESPProtocolError/Kind-swift.struct/aggregateTooLarge``.
    ///
    /// Default: 2²⁴ (16 777 216).
    public var maxAggregateCount: Int = 1 << 24

    /// The most aggregates (arrays, sets, pushes, maps, attributes) open inside one another: a top-level
    /// array of scalars has depth 1, an array of arrays depth 2. Deeper ones throw
    /// ``RESPProtocolError/Kind-swift.struct/nestingTooDeep``.
    ///
    /// Default: 32.
    public var maxDepth: Int = 32

    /// The longest line accepted, in bytes between the type byte and the CRLF: simple strings and errors,
    /// integers, doubles, big numbers, and every length or count header. A longer line throws
    /// ``RESPProtocolError/Kind-swift.struct/lineTooLong`` as soon as `maxLineLength + 1` of its bytes have
    /// arrived with no CR among them, without waiting for its end.
    ///
    /// Default: 64 KiB.
    public var maxLineLength: Int = 64 * 1024

    /// The most values one top-level reply may contain, counting itself and every nested value (each key
    /// and each value of a map or attribute counts once). This stops aggregates that are each within
    /// ``maxAggregateCount`` from multiplying when nested. Checked against the counts the headers claim;
    /// more throw ``RESPProtocolError/Kind-swift.struct/frameTooLarge``.
    ///
    /// Default: 2²⁴ (16 777 216).
    public var maxFrameElements: Int = 1 << 24

    /// The most bytes one top-level reply may take on the wire, headers and CRLFs included. A bulk whose
    /// header would take the reply past it throws ``RESPProtocolError/Kind-swift.struct/frameTooLarge``
    /// before its payload arrives.
    ///
    /// Default: 1 GiB.
    public var maxFrameBytes: Int = 1 << 30

    /// The default limits.
    public init() {}

    /// Limits with the given values; each one not given keeps its default.
    ///
    /// The decoder treats values below zero as zero, and values above 2⁵⁹ as 2⁵⁹.
    ///
    /// - Parameters:
    ///   - maxBulkLength: See ``maxBulkLength``.
    ///   - maxAggregateCount: See ``maxAggregateCount``.
    ///   - maxDepth: See ``maxDepth``.
    ///   - maxLineLength: See ``maxLineLength``.
    ///   - maxFrameElements: See ``maxFrameElements``.
    ///   - maxFrameBytes: See ``maxFrameBytes``.
    public init(
        maxBulkLength: Int = 512 * 1024 * 1024,
        maxAggregateCount: Int = 1 << 24,
        maxDepth: Int = 32,
        maxLineLength: Int = 64 * 1024,
        maxFrameElements: Int = 1 << 24,
        maxFrameBytes: Int = 1 << 30
    ) {
        self.maxBulkLength = maxBulkLength
        self.maxAggregateCount = maxAggregateCount
        self.maxDepth = maxDepth
        self.maxLineLength = maxLineLength
        self.maxFrameElements = maxFrameElements
        self.maxFrameBytes = maxFrameBytes
    }

    /// The limits with every value brought into `0 ... 2⁵⁹`: below the 10¹⁸ that oversized lengths read as,
    /// and small enough that sums of a few of them never overflow.
    var clamped: RESPDecoderLimits {
        func clamp(_ value: Int) -> Int { min(max(value, 0), 1 << 59) }
        return RESPDecoderLimits(
            maxBulkLength: clamp(maxBulkLength),
            maxAggregateCount: clamp(maxAggregateCount),
            maxDepth: clamp(maxDepth),
            maxLineLength: clamp(maxLineLength),
            maxFrameElements: clamp(maxFrameElements),
            maxFrameBytes: clamp(maxFrameBytes)
        )
    }
}
