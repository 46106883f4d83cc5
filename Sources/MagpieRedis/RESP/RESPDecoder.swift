import NIOCore

// MARK: - Limits

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
    fileprivate var clamped: RESPDecoderLimits {
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

// MARK: - Errors

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

// MARK: - Decoder

/// An incremental RESP3 decoder: feed it the bytes a connection reads, get whole replies back.
///
/// Call ``next(from:)`` with the bytes received so far, each time more arrive; it consumes what it can and
/// returns each complete top-level value in turn, or `nil` when it needs more bytes. Keep the unconsumed
/// bytes and append the next read to them, as `ByteToMessageHandler` does (``RESPFrameDecoder`` wraps this
/// decoder for a channel pipeline).
///
/// Bulk payloads are handed out as slices of the input buffer, without a copy. RESP2's null bulk string
/// (`$-1`) and null array (`*-1`) decode as ``RESPValue/null``. Redis never sends RESP3's streamed strings and
/// aggregates (`$?`, `*?`, `;`, `.`); they are treated as malformed.
///
/// After ``next(from:)`` has thrown, the decoder is unusable: the byte stream cannot be resynchronised, so
/// every later call throws the same error again, and the caller must close the connection.
///
/// ### Implementation Notes
///
/// An aggregate is never re-parsed from its start. Its header and each element are consumed from the buffer
/// as soon as they are complete, and the aggregates still open are kept on a stack, each with its elements
/// so far and how many are still to come. So a reply of *n* bytes that arrives in many reads costs O(*n*)
/// in all, however it is split. Only a scalar waits until it is complete: a line until its CRLF (the search
/// resumes where the previous call stopped), a bulk until `length + 2` bytes follow its header (checked in
/// O(1), leaving the header unconsumed; its few bytes are read again on the next call).
///
/// Each value is recognised in one pass over the buffer's bytes, inside one `withUnsafeReadableBytes`: type
/// byte, line end, number and, for a complete bulk, its closing CRLF. One pass, not one per check, because
/// every access to a `ByteBuffer`'s storage costs a dynamic exclusivity check.
///
/// No count the server claims is trusted for allocation: an aggregate reserves room for at most 1024
/// elements and grows as they arrive. The limits are checked against the claims, up front.
public struct RESPDecoder: Sendable {
    /// An aggregate whose header has been consumed and some of whose elements have not.
    private struct OpenAggregate: Sendable {
        enum Kind: Sendable {
            case array, set, push, map
            /// The attribute map of an `|` frame, still being read.
            case attributes
            /// A complete attribute map (in `pairs`), waiting for the one value it annotates.
            case attributed
        }

        var kind: Kind
        /// The values still to come; a map's key and value count as two.
        var remaining: Int
        /// The elements of an array, set or push, or the value an attribute annotates.
        var values: [RESPValue] = []
        /// The pairs of a map or attribute.
        var pairs: [RESPPair] = []
        /// A map's or attribute's key whose value has not arrived yet.
        var pendingKey: RESPValue? = nil
    }

    /// What the bytes at the reader index hold, as far as they have arrived.
    private enum Token {
        /// The line at the reader index has not ended yet. The first `clean` bytes after its type byte hold no
        /// CR or LF: the next search for its end starts after them.
        case incompleteLine(clean: Int)
        /// A complete scalar line, or RESP2's `$-1` or `*-1`, of `size` bytes.
        case scalar(RESPValue, size: Int)
        /// A bulk header of `headerSize` bytes (within the limits) announcing `length` payload bytes. When
        /// `complete`, the payload and its CRLF have all arrived and the CRLF (and a verbatim string's `xxx:`)
        /// has been checked.
        case bulk(type: UInt8, headerSize: Int, length: Int, complete: Bool)
        /// An aggregate header of `headerSize` bytes claiming `count` elements or pairs.
        case aggregate(type: UInt8, headerSize: Int, count: Int)
        /// The bytes are not RESP3, or exceed a limit checked during the scan.
        case failure(RESPProtocolError)
    }

    /// What one step of decoding did.
    private enum Step {
        /// The value at the reader index is not complete yet; nothing more was consumed.
        case needMoreBytes
        /// An aggregate header was consumed and the aggregate pushed on `stack`.
        case opened
        /// A whole value was consumed.
        case value(RESPValue)
    }

    /// The result of reading a length or count header (`$5`, `*-1`, `*?`).
    private enum LengthHeader {
        /// A count of zero or more. Counts above 10¹⁸ read as 10¹⁸: beyond any limit.
        case count(Int)
        /// `-1`, RESP2's null.
        case minusOne
        /// `?`, a streamed string or aggregate.
        case streamed
        /// Empty, non-digits, or a negative number other than `-1`.
        case invalid
    }

    private let limits: RESPDecoderLimits
    /// The aggregates open, outermost first.
    private var stack: [OpenAggregate] = []
    /// The values the current top-level reply has so far claimed, itself included.
    private var frameValues = 1
    /// The bytes of the current top-level reply consumed so far.
    private var frameBytes = 0
    /// How many bytes after the type byte of the line at the reader index are known to hold no CR or LF:
    /// where the search for its CRLF resumes. Zero whenever the reader index has moved.
    private var cleanLineBytes = 0
    /// The error thrown, after which the decoder is unusable.
    private var failure: RESPProtocolError?

    #if DEBUG
        /// The bytes read while looking for line ends, in all (debug builds only): for tests that show the
        /// work stays linear in the input, however it is split.
        internal private(set) var inspectedBytes = 0
    #endif

    /// A decoder with the given limits.
    ///
    /// - Parameter limits: The bounds a reply must stay within.
    public init(limits: RESPDecoderLimits = .init()) {
        self.limits = limits.clamped
    }

    /// Decodes the next complete top-level value from the front of `buffer`.
    ///
    /// Consumes the bytes it decodes. When the value is not complete yet, it consumes what it can keep (the
    /// headers and elements of open aggregates), returns `nil`, and continues from there on the next call;
    /// call again with the same buffer once more bytes have been appended to it. A partial line or bulk is
    /// left in the buffer.
    ///
    /// Cost: O(bytes consumed), plus the few bytes of a bulk header when the bulk is still incomplete.
    ///
    /// - Parameter buffer: The bytes received and not yet consumed.
    /// - Returns: The next top-level value, or `nil` when more bytes are needed.
    /// - Throws: ``RESPProtocolError`` when the bytes are not RESP3 or exceed the limits. The decoder is then
    ///   unusable: every later call throws the same error.
    public mutating func next(from buffer: inout ByteBuffer) throws(RESPProtocolError) -> RESPValue? {
        if let failure { throw failure }
        do throws(RESPProtocolError) {
            while true {
                switch try self.step(&buffer) {
                case .needMoreBytes:
                    return nil
                case .opened:
                    continue
                case .value(let value) where self.stack.isEmpty:
                    self.frameValues = 1
                    self.frameBytes = 0
                    return value
                case .value(let value):
                    if let complete = self.deliver(value) {
                        self.frameValues = 1
                        self.frameBytes = 0
                        return complete
                    }
                }
            }
        } catch {
            self.failure = error
            throw error
        }
    }

    // MARK: Steps

    /// Decodes the value, or the aggregate header, at the reader index.
    private mutating func step(_ buffer: inout ByteBuffer) throws(RESPProtocolError) -> Step {
        let limits = self.limits
        let clean = self.cleanLineBytes
        let frameBytesLeft = limits.maxFrameBytes - self.frameBytes
        let (token, inspected) = buffer.withUnsafeReadableBytes { bytes in
            Self.scan(bytes, clean: clean, limits: limits, frameBytesLeft: frameBytesLeft)
        }
        #if DEBUG
            self.inspectedBytes += inspected
        #endif
        switch token {
        case .incompleteLine(let clean):
            self.cleanLineBytes = clean
            return .needMoreBytes
        case .failure(let error):
            throw error
        case .scalar(let value, let size):
            try self.consume(size, of: &buffer)
            return .value(value)
        case .bulk(let type, let headerSize, let length, let complete):
            guard complete else {
                // The header's bytes hold no CR or LF: the next call finds its end at once.
                self.cleanLineBytes = headerSize - 3
                return .needMoreBytes
            }
            try self.consume(headerSize, of: &buffer)
            guard var payload = buffer.readSlice(length: length) else { return .needMoreBytes }  // `complete`
            try self.consume(2, countingAlso: length, of: &buffer)
            switch type {
            case RESPByte.bulkString:
                return .value(.bulkString(payload))
            case RESPByte.bulkError:
                return .value(.bulkError(String(buffer: payload)))
            default:  // RESPByte.verbatimString, its `xxx:` prefix checked by `scan`
                let format = payload.readString(length: 3) ?? ""
                payload.moveReaderIndex(forwardBy: 1)
                return .value(.verbatimString(format: format, text: payload))
            }
        case .aggregate(let type, let headerSize, let count):
            return try self.open(type: type, headerSize: headerSize, count: count, in: &buffer)
        }
    }

    /// Checks an aggregate header's claim against the limits, consumes it and opens the aggregate, or
    /// returns the empty aggregate it stands for.
    private mutating func open(
        type: UInt8, headerSize: Int, count: Int, in buffer: inout ByteBuffer
    ) throws(RESPProtocolError) -> Step {
        let kind: OpenAggregate.Kind
        switch type {
        case RESPByte.array: kind = .array
        case RESPByte.set: kind = .set
        case RESPByte.push: kind = .push
        case RESPByte.map: kind = .map
        default: kind = .attributes
        }
        let hasPairs = kind == .map || kind == .attributes
        guard count <= self.limits.maxAggregateCount else {
            throw RESPProtocolError(
                .aggregateTooLarge,
                "\(Self.name(of: type)) of \(count) \(hasPairs ? "pairs" : "elements") exceeds the limit of \(self.limits.maxAggregateCount)"
            )
        }
        guard self.stack.count < self.limits.maxDepth else {
            throw RESPProtocolError(.nestingTooDeep, "aggregates nested deeper than \(self.limits.maxDepth)")
        }
        // An attribute claims its pairs and the value it annotates. No overflow: the limits are clamped.
        let claimed = kind == .map ? 2 * count : kind == .attributes ? 2 * count + 1 : count
        guard self.frameValues + claimed <= self.limits.maxFrameElements else {
            throw RESPProtocolError(.frameTooLarge, "reply of more than \(self.limits.maxFrameElements) values")
        }
        self.frameValues += claimed
        try self.consume(headerSize, of: &buffer)

        var open = OpenAggregate(kind: kind, remaining: hasPairs ? 2 * count : count)
        switch kind {
        case .array, .set, .push:
            if count == 0 { return .value(kind == .array ? .array([]) : kind == .set ? .set([]) : .push([])) }
            open.values.reserveCapacity(min(count, 1024))
        case .map:
            if count == 0 { return .value(.map([])) }
            open.pairs.reserveCapacity(min(count, 1024))
        case .attributes, .attributed:
            if count == 0 {
                open.kind = .attributed
                open.remaining = 1
            } else {
                open.pairs.reserveCapacity(min(count, 1024))
            }
        }
        self.stack.append(open)
        return .opened
    }

    /// Adds a complete value to the innermost open aggregate and closes every aggregate that completes.
    ///
    /// - Returns: The top-level value, once the outermost aggregate closes (at once when none is open);
    ///   `nil` while some aggregate is still open.
    private mutating func deliver(_ value: consuming RESPValue) -> RESPValue? {
        while !self.stack.isEmpty {
            let top = self.stack.count - 1
            self.stack[top].remaining -= 1
            switch self.stack[top].kind {
            case .array, .set, .push, .attributed:
                self.stack[top].values.append(value)
            case .map, .attributes:
                if let key = self.stack[top].pendingKey {
                    self.stack[top].pairs.append(RESPPair(key: key, value: value))
                    self.stack[top].pendingKey = nil
                } else {
                    self.stack[top].pendingKey = value
                }
            }
            guard self.stack[top].remaining == 0 else { return nil }
            let closed = self.stack.removeLast()
            switch closed.kind {
            case .array: value = .array(closed.values)
            case .set: value = .set(closed.values)
            case .push: value = .push(closed.values)
            case .map: value = .map(closed.pairs)
            case .attributes:
                // The attribute map is complete: now wait, at the same depth, for the value it annotates.
                self.stack.append(OpenAggregate(kind: .attributed, remaining: 1, pairs: closed.pairs))
                return nil
            case .attributed:
                // `remaining` was 1, so `values` holds exactly the annotated value.
                value = .attributed(attributes: closed.pairs, value: closed.values[0])
            }
        }
        return value
    }

    /// Moves the reader index past `count` bytes of the current reply, checking the reply's byte limit.
    ///
    /// - Parameter extra: Bytes already consumed by other means (a bulk's payload, read as a slice).
    private mutating func consume(
        _ count: Int, countingAlso extra: Int = 0, of buffer: inout ByteBuffer
    ) throws(RESPProtocolError) {
        let total = self.frameBytes + count + extra
        guard total <= self.limits.maxFrameBytes else {
            throw RESPProtocolError(.frameTooLarge, "reply of more than \(self.limits.maxFrameBytes) bytes")
        }
        self.frameBytes = total
        self.cleanLineBytes = 0
        buffer.moveReaderIndex(forwardBy: count)
    }

    // MARK: Scanning

    /// Recognises the token at the start of `bytes`, the buffer's readable bytes.
    ///
    /// - Parameters:
    ///   - bytes: The readable bytes; only read, and only inside the caller's `withUnsafeReadableBytes`.
    ///   - clean: How many bytes after the type byte are known to hold no CR or LF.
    ///   - limits: The decoder's (clamped) limits.
    ///   - frameBytesLeft: How many more bytes the current reply may take.
    /// - Returns: The token, and how many bytes the search for the line end read.
    private static func scan(
        _ bytes: UnsafeRawBufferPointer, clean: Int, limits: RESPDecoderLimits, frameBytesLeft: Int
    ) -> (Token, inspected: Int) {
        // Invariant: every index read below is checked against `bytes.count` first (the line search reads
        // below `end` ≤ `bytes.count`, and `index + 1` once checked; a complete line has `1 + length + 2` ≤
        // `bytes.count` bytes; a complete bulk `headerSize + length + 2` ≤ `bytes.count`), and no pointer
        // outlives the caller's `withUnsafeReadableBytes` closure.
        guard let type = bytes.first else { return (.incompleteLine(clean: 0), 0) }
        switch type {
        case RESPByte.simpleString, RESPByte.simpleError, RESPByte.integer, RESPByte.null, RESPByte.boolean,
            RESPByte.double, RESPByte.bigNumber, RESPByte.bulkString, RESPByte.bulkError, RESPByte.verbatimString,
            RESPByte.array, RESPByte.set, RESPByte.push, RESPByte.map, RESPByte.attribute:
            break
        case RESPByte.streamedStringChunk, RESPByte.streamedAggregateEnd:
            let message = "streamed RESP3 type '\(Character(Unicode.Scalar(type)))': Redis never streams replies"
            return (.failure(RESPProtocolError(.malformed, message)), 0)
        default:
            return (.failure(RESPProtocolError(.malformed, "unknown RESP type byte \(hex(type))")), 0)
        }

        // Find the CRLF. The CR of a line of `maxLineLength` bytes is at index `maxLineLength + 1`: no CR up
        // to there means the line is too long, and the search never goes further, however much is buffered.
        let maxLength = limits.maxLineLength
        let start = 1 + clean
        let end = min(bytes.count, maxLength + 2)
        var index = start
        while index < end {
            let byte = bytes[index]
            if byte == RESPByte.cr || byte == RESPByte.lf { break }
            index += 1
        }
        let inspected = max(min(index, end - 1) - start + 1, 0)
        guard index < end else {
            if bytes.count >= maxLength + 2 {
                return (.failure(RESPProtocolError(.lineTooLong, "line longer than \(maxLength) bytes")), inspected)
            }
            return (.incompleteLine(clean: max(end - 1, 0)), inspected)
        }
        guard bytes[index] == RESPByte.cr else {
            return (.failure(RESPProtocolError(.malformed, "line feed without carriage return")), inspected)
        }
        guard index + 1 < bytes.count else { return (.incompleteLine(clean: index - 1), inspected) }
        guard bytes[index + 1] == RESPByte.lf else {
            return (.failure(RESPProtocolError(.malformed, "carriage return without line feed")), inspected + 1)
        }
        let length = index - 1
        let line = UnsafeRawBufferPointer(rebasing: bytes[1..<index])
        let size = length + 3

        switch type {
        case RESPByte.bulkString, RESPByte.bulkError, RESPByte.verbatimString:
            return (
                bulk(type: type, header: line, in: bytes, limits: limits, frameBytesLeft: frameBytesLeft), inspected + 1
            )
        case RESPByte.array, RESPByte.set, RESPByte.push, RESPByte.map, RESPByte.attribute:
            switch parseLength(line) {
            case .count(let count):
                return (.aggregate(type: type, headerSize: size, count: count), inspected + 1)
            case .minusOne where type == RESPByte.array:
                return (.scalar(.null, size: size), inspected + 1)
            case .minusOne, .invalid:
                let message = "invalid \(name(of: type)) count \(excerpt(line))"
                return (.failure(RESPProtocolError(.malformed, message)), inspected + 1)
            case .streamed:
                return (.failure(streamed(type)), inspected + 1)
            }
        default:
            return (lineValue(type: type, line: line, size: size), inspected + 1)
        }
    }

    /// The value of a complete line of the given type.
    private static func lineValue(type: UInt8, line: UnsafeRawBufferPointer, size: Int) -> Token {
        switch type {
        case RESPByte.simpleString:
            return .scalar(.simpleString(String(decoding: line, as: UTF8.self)), size: size)
        case RESPByte.simpleError:
            return .scalar(.simpleError(String(decoding: line, as: UTF8.self)), size: size)
        case RESPByte.integer:
            guard let value = parseInt64(line) else { return .failure(invalid("integer", line)) }
            return .scalar(.integer(value), size: size)
        case RESPByte.null:
            guard line.isEmpty else { return .failure(invalid("null", line)) }
            return .scalar(.null, size: size)
        case RESPByte.boolean:
            switch line.count == 1 ? line[0] : 0 {
            case UInt8(ascii: "t"): return .scalar(.boolean(true), size: size)
            case UInt8(ascii: "f"): return .scalar(.boolean(false), size: size)
            default: return .failure(invalid("boolean", line))
            }
        case RESPByte.double:
            guard let value = parseDouble(line) else { return .failure(invalid("double", line)) }
            return .scalar(.double(value), size: size)
        default:  // RESPByte.bigNumber
            guard isBigNumber(line) else { return .failure(invalid("big number", line)) }
            return .scalar(.bigNumber(String(decoding: line, as: UTF8.self)), size: size)
        }
    }

    /// Reads a complete bulk header and checks the limits; when the payload has arrived, checks its CRLF.
    private static func bulk(
        type: UInt8, header: UnsafeRawBufferPointer, in bytes: UnsafeRawBufferPointer, limits: RESPDecoderLimits,
        frameBytesLeft: Int
    ) -> Token {
        let headerSize = header.count + 3
        let length: Int
        switch parseLength(header) {
        case .count(let count):
            length = count
        case .minusOne where type == RESPByte.bulkString:
            return .scalar(.null, size: headerSize)
        case .minusOne, .invalid:
            return .failure(RESPProtocolError(.malformed, "invalid \(name(of: type)) length \(excerpt(header))"))
        case .streamed:
            return .failure(streamed(type))
        }
        guard length <= limits.maxBulkLength else {
            let message = "\(name(of: type)) of \(length) bytes exceeds the limit of \(limits.maxBulkLength)"
            return .failure(RESPProtocolError(.bulkTooLong, message))
        }
        // No overflow: every term is at most 2⁵⁹ (the limits are clamped).
        let total = headerSize + length + 2
        guard total <= frameBytesLeft else {
            let message =
                "\(name(of: type)) of \(length) bytes takes the reply past the limit of \(limits.maxFrameBytes) bytes"
            return .failure(RESPProtocolError(.frameTooLarge, message))
        }
        guard type != RESPByte.verbatimString || length >= 4 else {
            return .failure(RESPProtocolError(.malformed, "verbatim string of \(length) bytes has no 'xxx:' prefix"))
        }
        guard bytes.count >= total else {
            return .bulk(type: type, headerSize: headerSize, length: length, complete: false)
        }
        guard bytes[total - 2] == RESPByte.cr, bytes[total - 1] == RESPByte.lf else {
            return .failure(RESPProtocolError(.malformed, "\(name(of: type)) of \(length) bytes not followed by CRLF"))
        }
        guard type != RESPByte.verbatimString || bytes[headerSize + 3] == UInt8(ascii: ":") else {
            return .failure(RESPProtocolError(.malformed, "verbatim string without a 'xxx:' format prefix"))
        }
        return .bulk(type: type, headerSize: headerSize, length: length, complete: true)
    }

    // MARK: Errors

    private static func name(of type: UInt8) -> String {
        switch type {
        case RESPByte.bulkString: "bulk string"
        case RESPByte.bulkError: "bulk error"
        case RESPByte.verbatimString: "verbatim string"
        case RESPByte.array: "array"
        case RESPByte.set: "set"
        case RESPByte.push: "push"
        case RESPByte.map: "map"
        default: "attribute"
        }
    }

    private static func streamed(_ type: UInt8) -> RESPProtocolError {
        let header = "\(Character(Unicode.Scalar(type)))?"
        return RESPProtocolError(.malformed, "streamed \(name(of: type)) ('\(header)'): Redis never streams replies")
    }

    private static func invalid(_ what: String, _ line: UnsafeRawBufferPointer) -> RESPProtocolError {
        RESPProtocolError(.malformed, "invalid \(what) \(excerpt(line))")
    }

    /// The start of a line, quoted for an error message.
    private static func excerpt(_ line: UnsafeRawBufferPointer) -> String {
        let shown = String(decoding: UnsafeRawBufferPointer(rebasing: line.prefix(32)), as: UTF8.self)
        return "'\(shown)\(line.count > 32 ? "…" : "")'"
    }

    // MARK: Numbers

    /// Parses `[+-]digits` into an `Int64`; `nil` when empty, not digits, or out of range.
    private static func parseInt64(_ bytes: UnsafeRawBufferPointer) -> Int64? {
        var index = 0
        var negative = false
        if let first = bytes.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            negative = first == UInt8(ascii: "-")
            index = 1
        }
        guard index < bytes.count else { return nil }
        var value: Int64 = 0
        if bytes.count - index <= 18 {
            // 18 digits cannot overflow: the common case, without the checks.
            while index < bytes.count {
                let digit = bytes[index] &- UInt8(ascii: "0")
                guard digit < 10 else { return nil }
                value = value &* 10 &+ Int64(digit)
                index += 1
            }
            return negative ? -value : value
        }
        while index < bytes.count {
            let digit = bytes[index] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            let (times10, overflowMultiply) = value.multipliedReportingOverflow(by: 10)
            // Accumulated negatively for negative numbers, so that Int64.min parses.
            let (next, overflowAdd) =
                negative
                ? times10.subtractingReportingOverflow(Int64(digit)) : times10.addingReportingOverflow(Int64(digit))
            guard !overflowMultiply, !overflowAdd else { return nil }
            value = next
            index += 1
        }
        return value
    }

    /// Parses a length or count header: digits, `-1` or `?`.
    private static func parseLength(_ bytes: UnsafeRawBufferPointer) -> LengthHeader {
        guard let first = bytes.first else { return .invalid }
        if first == UInt8(ascii: "?") { return bytes.count == 1 ? .streamed : .invalid }
        if first == UInt8(ascii: "-") {
            return bytes.count == 2 && bytes[1] == UInt8(ascii: "1") ? .minusOne : .invalid
        }
        var value = 0
        for byte in bytes {
            let digit = byte &- UInt8(ascii: "0")
            guard digit < 10 else { return .invalid }
            // Saturates at 10¹⁸, beyond every (clamped) limit; below 10¹⁷, one more digit cannot overflow.
            value = value < 100_000_000_000_000_000 ? value &* 10 &+ Int(digit) : 1_000_000_000_000_000_000
        }
        return .count(value)
    }

    /// Parses a RESP3 double: `inf`, `-inf`, `nan`, or `[+-]digits[.digits][(e|E)[+-]digits]`.
    private static func parseDouble(_ bytes: UnsafeRawBufferPointer) -> Double? {
        if bytes.elementsEqual("inf".utf8) || bytes.elementsEqual("+inf".utf8) { return .infinity }
        if bytes.elementsEqual("-inf".utf8) { return -.infinity }
        if bytes.elementsEqual("nan".utf8) || bytes.elementsEqual("-nan".utf8) { return .nan }
        var index = 0
        func digits() -> Int {
            let start = index
            while index < bytes.count, bytes[index] &- UInt8(ascii: "0") < 10 { index += 1 }
            return index - start
        }
        func sign() {
            if index < bytes.count, bytes[index] == UInt8(ascii: "-") || bytes[index] == UInt8(ascii: "+") {
                index += 1
            }
        }
        sign()
        guard digits() > 0 else { return nil }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { return nil }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            sign()
            guard digits() > 0 else { return nil }
        }
        guard index == bytes.count else { return nil }
        return Double(String(decoding: bytes, as: UTF8.self))
    }

    /// Whether the bytes are `[+-]digits`.
    private static func isBigNumber(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var digits = bytes[...]
        if let first = digits.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            digits = digits.dropFirst()
        }
        return !digits.isEmpty && digits.allSatisfy { $0 &- UInt8(ascii: "0") < 10 }
    }
}

// MARK: - Channel handler

/// ``RESPDecoder`` as a SwiftNIO decoder: `ByteToMessageHandler(RESPFrameDecoder(limits: limits))` turns a
/// connection's bytes into one ``RESPValue`` per top-level reply or push.
///
/// Create one per channel: it holds the state of the reply being received. A protocol error is thrown into
/// the pipeline (as `errorCaught`); the connection must then be closed.
public struct RESPFrameDecoder: NIOSingleStepByteToMessageDecoder, Sendable {
    /// The decoded value: one top-level reply or push.
    public typealias InboundOut = RESPValue

    private var decoder: RESPDecoder

    /// A decoder with the given limits.
    ///
    /// - Parameter limits: The bounds a reply must stay within.
    public init(limits: RESPDecoderLimits = .init()) {
        self.decoder = RESPDecoder(limits: limits)
    }

    /// Decodes the next complete value from the cumulated bytes; see ``RESPDecoder/next(from:)``.
    ///
    /// - Parameter buffer: The bytes received and not yet consumed.
    /// - Returns: The next top-level value, or `nil` when more bytes are needed.
    /// - Throws: ``RESPProtocolError`` when the bytes are not RESP3 or exceed the limits.
    public mutating func decode(buffer: inout ByteBuffer) throws(RESPProtocolError) -> RESPValue? {
        try self.decoder.next(from: &buffer)
    }

    /// Decodes what complete values remain when the channel closes; a partial reply is dropped.
    ///
    /// - Parameters:
    ///   - buffer: The bytes received and not yet consumed.
    ///   - seenEOF: Whether the peer closed its side.
    /// - Returns: The next top-level value, or `nil` when no complete one remains.
    /// - Throws: ``RESPProtocolError`` when the bytes are not RESP3 or exceed the limits.
    public mutating func decodeLast(
        buffer: inout ByteBuffer, seenEOF: Bool
    ) throws(RESPProtocolError) -> RESPValue? {
        try self.decoder.next(from: &buffer)
    }
}

// MARK: - Bytes

/// The bytes RESP3 gives meaning to.
private enum RESPByte {
    static let simpleString = UInt8(ascii: "+")
    static let simpleError = UInt8(ascii: "-")
    static let integer = UInt8(ascii: ":")
    static let bulkString = UInt8(ascii: "$")
    static let array = UInt8(ascii: "*")
    static let null = UInt8(ascii: "_")
    static let boolean = UInt8(ascii: "#")
    static let double = UInt8(ascii: ",")
    static let bigNumber = UInt8(ascii: "(")
    static let bulkError = UInt8(ascii: "!")
    static let verbatimString = UInt8(ascii: "=")
    static let map = UInt8(ascii: "%")
    static let attribute = UInt8(ascii: "|")
    static let set = UInt8(ascii: "~")
    static let push = UInt8(ascii: ">")
    static let streamedStringChunk = UInt8(ascii: ";")
    static let streamedAggregateEnd = UInt8(ascii: ".")
    static let cr = UInt8(ascii: "\r")
    static let lf = UInt8(ascii: "\n")
}

/// `0x41`.
private func hex(_ byte: UInt8) -> String {
    let digits = Array("0123456789abcdef")
    return "0x\(digits[Int(byte >> 4)])\(digits[Int(byte & 0xF)])"
}
