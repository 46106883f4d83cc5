import NIOCore

// MARK: - Encoding

extension ByteBuffer {
    /// Appends `value` in RESP3 wire form, as a server sends it (for tests and fake servers).
    ///
    /// Every case is written in its RESP3 form; ``RESPValue/null`` is written as `_\r\n`, never as RESP2's
    /// `$-1`. Doubles are written as `inf`, `-inf`, `nan`, or the shortest decimal that reads back as the same
    /// value. The caller keeps simple strings, simple errors and big numbers free of CR and LF, and gives
    /// verbatim strings a three-byte format: other values are written as they are and do not decode.
    ///
    /// - Parameter value: The value to write.
    public mutating func writeRESPValue(_ value: RESPValue) {
        switch value {
        case .simpleString(let text):
            self.writeRESPLine(type: "+", text)
        case .simpleError(let text):
            self.writeRESPLine(type: "-", text)
        case .integer(let number):
            self.writeRESPLine(type: ":", String(number))
        case .bulkString(let bytes):
            self.writeRESPLine(type: "$", String(bytes.readableBytes))
            self.writeImmutableBuffer(bytes)
            self.writeStaticString("\r\n")
        case .array(let elements):
            self.writeRESPAggregate(type: "*", elements)
        case .null:
            self.writeStaticString("_\r\n")
        case .boolean(let flag):
            self.writeStaticString(flag ? "#t\r\n" : "#f\r\n")
        case .double(let number):
            let text: String
            if number.isNaN {
                text = "nan"
            } else if number.isInfinite {
                text = number < 0 ? "-inf" : "inf"
            } else {
                text = number.description
            }
            self.writeRESPLine(type: ",", text)
        case .bigNumber(let digits):
            self.writeRESPLine(type: "(", digits)
        case .bulkError(let text):
            self.writeRESPLine(type: "!", String(text.utf8.count))
            self.writeString(text)
            self.writeStaticString("\r\n")
        case .verbatimString(let format, let text):
            self.writeRESPLine(type: "=", String(format.utf8.count + 1 + text.readableBytes))
            self.writeString(format)
            self.writeStaticString(":")
            self.writeImmutableBuffer(text)
            self.writeStaticString("\r\n")
        case .map(let pairs):
            self.writeRESPPairs(type: "%", pairs)
        case .set(let elements):
            self.writeRESPAggregate(type: "~", elements)
        case .attributed(let attributes, let annotated):
            self.writeRESPPairs(type: "|", attributes)
            self.writeRESPValue(annotated)
        case .push(let elements):
            self.writeRESPAggregate(type: ">", elements)
        }
    }

    /// Writes the type byte, `text` and CRLF.
    private mutating func writeRESPLine(type: Unicode.Scalar, _ text: String) {
        self.writeInteger(UInt8(ascii: type))
        self.writeString(text)
        self.writeStaticString("\r\n")
    }

    private mutating func writeRESPAggregate(type: Unicode.Scalar, _ elements: [RESPValue]) {
        self.writeRESPLine(type: type, String(elements.count))
        for element in elements { self.writeRESPValue(element) }
    }

    private mutating func writeRESPPairs(type: Unicode.Scalar, _ pairs: [RESPPair]) {
        self.writeRESPLine(type: type, String(pairs.count))
        for pair in pairs {
            self.writeRESPValue(pair.key)
            self.writeRESPValue(pair.value)
        }
    }
}

// MARK: - Accessors

extension RESPValue {
    /// The value with any attributes stripped: the value an ``attributed(attributes:value:)`` annotates (at
    /// every level of attributes), or the value itself.
    ///
    /// The other accessors look through attributes the same way.
    public var value: RESPValue {
        var value = self
        while case .attributed(_, let annotated) = value { value = annotated }
        return value
    }

    /// The bytes of a ``bulkString(_:)``, or the text of a ``verbatimString(format:text:)``; `nil` for
    /// every other case.
    public var bulkBytes: ByteBuffer? {
        switch self.value {
        case .bulkString(let bytes): return bytes
        case .verbatimString(_, let text): return text
        default: return nil
        }
    }

    /// The text of a ``simpleString(_:)``, ``bulkString(_:)`` or ``verbatimString(format:text:)``, decoded as
    /// UTF-8 (invalid sequences repaired with U+FFFD); `nil` for every other case.
    public var string: String? {
        switch self.value {
        case .simpleString(let text): return text
        case .bulkString(let bytes): return String(buffer: bytes)
        case .verbatimString(_, let text): return String(buffer: text)
        default: return nil
        }
    }

    /// The number of an ``integer(_:)``; `nil` for every other case (a bulk string of digits included).
    public var integerValue: Int64? {
        if case .integer(let number) = self.value { return number }
        return nil
    }

    /// The elements of an ``array(_:)``, ``set(_:)`` or ``push(_:)``; `nil` for every other case.
    public var arrayValue: [RESPValue]? {
        switch self.value {
        case .array(let elements), .set(let elements), .push(let elements): return elements
        default: return nil
        }
    }

    /// Whether this is ``null`` (RESP3's `_`, or RESP2's `$-1` and `*-1`).
    public var isNull: Bool {
        if case .null = self.value { return true }
        return false
    }

    /// A ``simpleError(_:)`` or ``bulkError(_:)`` parsed into a ``RedisServerError``; `nil` for every other
    /// case.
    public var serverError: RedisServerError? {
        switch self.value {
        case .simpleError(let message), .bulkError(let message): return RedisServerError(message)
        default: return nil
        }
    }
}

// MARK: - Description

extension RESPValue: CustomStringConvertible {
    /// A short human form, for logs and test failures: `OK`, `"bytes"`, `42`, `[1, 2]`, `{"k": "v"}`,
    /// `(error) ERR …`, `(nil)`.
    ///
    /// Long strings are cut after 64 bytes with their full length noted, aggregates after 16 elements, and
    /// the whole text after about 1024 characters, so a huge reply never makes a huge log line.
    public var description: String {
        var text = ""
        var budget = 1024
        self.describe(into: &text, budget: &budget)
        return text
    }

    private func describe(into text: inout String, budget: inout Int) {
        guard budget > 0 else {
            text += "…"
            return
        }
        let start = text.utf8.count
        defer { budget -= text.utf8.count - start }
        switch self {
        case .simpleString(let string):
            Self.describeText(string, into: &text)
        case .simpleError(let message), .bulkError(let message):
            text += "(error) "
            Self.describeText(message, into: &text)
        case .integer(let number):
            text += String(number)
        case .bulkString(let bytes):
            Self.describeBytes(bytes.readableBytesView, into: &text)
        case .array(let elements):
            Self.describe(elements, open: "[", close: "]", into: &text, budget: &budget)
        case .null:
            text += "(nil)"
        case .boolean(let flag):
            text += flag ? "true" : "false"
        case .double(let number):
            text += number.description
        case .bigNumber(let digits):
            text += "(big) "
            Self.describeText(digits, into: &text)
        case .verbatimString(let format, let body):
            text += format + ":"
            Self.describeBytes(body.readableBytesView, into: &text)
        case .map(let pairs):
            Self.describe(pairs, open: "{", into: &text, budget: &budget)
        case .set(let elements):
            Self.describe(elements, open: "~[", close: "]", into: &text, budget: &budget)
        case .attributed(let attributes, let annotated):
            Self.describe(attributes, open: "|{", into: &text, budget: &budget)
            text += " "
            annotated.describe(into: &text, budget: &budget)
        case .push(let elements):
            Self.describe(elements, open: ">[", close: "]", into: &text, budget: &budget)
        }
    }

    private static let elementsShown = 16
    private static let bytesShown = 64

    private static func describe(
        _ elements: [RESPValue], open: String, close: String, into text: inout String, budget: inout Int
    ) {
        text += open
        for (index, element) in elements.prefix(elementsShown).enumerated() {
            if index > 0 { text += ", " }
            element.describe(into: &text, budget: &budget)
            if budget <= 0 { break }
        }
        if elements.count > elementsShown || (budget <= 0 && !elements.isEmpty) {
            text += ", … (\(elements.count) elements)"
        }
        text += close
    }

    private static func describe(_ pairs: [RESPPair], open: String, into text: inout String, budget: inout Int) {
        text += open
        for (index, pair) in pairs.prefix(elementsShown).enumerated() {
            if index > 0 { text += ", " }
            pair.key.describe(into: &text, budget: &budget)
            text += ": "
            pair.value.describe(into: &text, budget: &budget)
            if budget <= 0 { break }
        }
        if pairs.count > elementsShown || (budget <= 0 && !pairs.isEmpty) {
            text += ", … (\(pairs.count) pairs)"
        }
        text += "}"
    }

    /// Writes up to ``bytesShown`` characters of a line of text as they are, noting the full length of a
    /// longer one.
    private static func describeText(_ line: String, into text: inout String) {
        guard line.utf8.count > bytesShown else {
            text += line
            return
        }
        text += line.prefix(bytesShown) + "… (\(line.utf8.count) bytes)"
    }

    /// Writes up to ``bytesShown`` bytes in quotes, printable ASCII as is and the rest escaped, noting the full
    /// length of a longer run.
    private static func describeBytes<Bytes: Collection<UInt8>>(_ bytes: Bytes, into text: inout String) {
        text += "\""
        for byte in bytes.prefix(bytesShown) {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                text += "\\"
                text.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: "\r"): text += "\\r"
            case UInt8(ascii: "\n"): text += "\\n"
            case UInt8(ascii: "\t"): text += "\\t"
            case 0x20..<0x7F: text.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let digits = Array("0123456789abcdef")
                text += "\\x\(digits[Int(byte >> 4)])\(digits[Int(byte & 0xF)])"
            }
        }
        text += "\""
        if bytes.count > bytesShown { text += "… (\(bytes.count) bytes)" }
    }
}
