// Recognising one token at the reader index, in one pass over the buffer's bytes (see the notes on
// ``RESPDecoder``): the line end, the scalar values, the bulk headers and their limits, and the numbers.
// The decoding steps that consume what a scan found are in RESPDecoder.swift.

extension RESPDecoder {
    // MARK: Scanning

    /// Recognises the token at the start of `bytes`, the buffer's readable bytes.
    ///
    /// - Parameters:
    ///   - bytes: The readable bytes; only read, and only inside the caller's `withUnsafeReadableBytes`.
    ///   - clean: How many bytes after the type byte are known to hold no CR or LF.
    ///   - limits: The decoder's (clamped) limits.
    ///   - frameBytesLeft: How many more bytes the current reply may take.
    /// - Returns: The token, and how many bytes the search for the line end read.
    static func scan(
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

    static func name(of type: UInt8) -> String {
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

/// `0x41`.
private func hex(_ byte: UInt8) -> String {
    let digits = Array("0123456789abcdef")
    return "0x\(digits[Int(byte >> 4)])\(digits[Int(byte & 0xF)])"
}
