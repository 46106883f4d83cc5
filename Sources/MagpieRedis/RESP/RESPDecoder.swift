import NIOCore

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
    enum Token {
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
}
