import NIOCore
import Testing

@testable import MagpieRedis

// Round trips, splits, the incremental state, and RESPValue's accessors; malformed input, the limits and
// the channel pipeline are in RESPDecoderTests+Limits.swift.

// MARK: - Helpers

func bulk(_ text: String) -> RESPValue { .bulkString(ByteBuffer(string: text)) }

func bulk(_ bytes: [UInt8]) -> RESPValue { .bulkString(ByteBuffer(bytes: bytes)) }

func pair(_ key: RESPValue, _ value: RESPValue) -> RESPPair { RESPPair(key: key, value: value) }

func encoded(_ values: [RESPValue]) -> ByteBuffer {
    var buffer = ByteBuffer()
    for value in values { buffer.writeRESPValue(value) }
    return buffer
}

/// The value with every NaN double replaced by a marker, so that `==` treats NaN as equal to itself.
private func comparable(_ value: RESPValue) -> RESPValue {
    switch value {
    case .double(let number) where number.isNaN: return .simpleString("<NaN>")
    case .array(let elements): return .array(elements.map(comparable))
    case .set(let elements): return .set(elements.map(comparable))
    case .push(let elements): return .push(elements.map(comparable))
    case .map(let pairs): return .map(pairs.map { pair(comparable($0.key), comparable($0.value)) })
    case .attributed(let attributes, let annotated):
        return .attributed(
            attributes: attributes.map { pair(comparable($0.key), comparable($0.value)) }, value: comparable(annotated))
    default: return value
    }
}

/// Feeds `pieces` to one decoder the way `ByteToMessageHandler` does: each piece is appended to one cumulation
/// buffer and every complete value is taken out; with `discardingReadBytes`, the bytes read are then discarded
/// (which moves the reader index and the unread bytes, as NIO's reclaiming does).
private func feed(
    _ pieces: [ByteBuffer], limits: RESPDecoderLimits = .init(), discardingReadBytes: Bool = true
) throws -> (values: [RESPValue], leftover: Int, decoder: RESPDecoder) {
    var decoder = RESPDecoder(limits: limits)
    var cumulation = ByteBuffer()
    var values: [RESPValue] = []
    for var piece in pieces {
        cumulation.writeBuffer(&piece)
        while let value = try decoder.next(from: &cumulation) { values.append(value) }
        if discardingReadBytes { cumulation.discardReadBytes() }
    }
    return (values, cumulation.readableBytes, decoder)
}

/// `bytes` cut into pieces of `size` bytes (the last may be shorter).
func pieces(of bytes: ByteBuffer, size: Int) -> [ByteBuffer] {
    var bytes = bytes
    var pieces: [ByteBuffer] = []
    while bytes.readableBytes > 0 { pieces.append(bytes.readSlice(length: min(size, bytes.readableBytes))!) }
    return pieces
}

/// Decodes `text` (given whole) and returns the error it throws.
func decodingError(_ text: String, limits: RESPDecoderLimits = .init()) -> RESPProtocolError? {
    var decoder = RESPDecoder(limits: limits)
    var buffer = ByteBuffer(string: text)
    do {
        while try decoder.next(from: &buffer) != nil {}
        return nil
    } catch {
        return error
    }
}

/// Values of every RESP3 type, alone and nested.
private let corpus: [RESPValue] = [
    .simpleString("OK"),
    .simpleString(""),
    .simpleString("héllo wörld"),
    .simpleError("ERR unknown command 'FOO'"),
    .simpleError("MOVED 3999 127.0.0.1:6381"),
    .integer(0),
    .integer(1),
    .integer(-1),
    .integer(1_234_567_890_123),
    .integer(-987_654_321),
    .integer(.max),
    .integer(.min),
    bulk(""),
    bulk("hello"),
    bulk([0x0D, 0x0A, 0x00, 0xFF, 0x0D, 0x0A, 0x24, 0x33, 0x0D, 0x0A]),
    bulk("$5\r\nhello\r\n*2\r\n"),
    bulk(String(repeating: "x", count: 300)),
    .array([]),
    .array([bulk("GET"), bulk("key"), .integer(7)]),
    .array([.array([.integer(1), .array([.integer(2), .array([])])]), .null, .array([.null])]),
    .null,
    .boolean(true),
    .boolean(false),
    .double(0),
    .double(1.5),
    .double(-2.25),
    .double(-0.0),
    .double(.pi),
    .double(1e300),
    .double(-1.7976931348623157e308),
    .double(.leastNonzeroMagnitude),
    .double(.infinity),
    .double(-.infinity),
    .double(.nan),
    .bigNumber("3492890328409238509324850943850943825024385"),
    .bigNumber("-12345678901234567890123"),
    .bulkError("SYNTAX invalid syntax"),
    .bulkError(""),
    .bulkError("ERR with\r\nline breaks"),
    .verbatimString(format: "txt", text: ByteBuffer(string: "Some string")),
    .verbatimString(format: "mkd", text: ByteBuffer()),
    .verbatimString(format: "txt", text: ByteBuffer(string: "a\r\nb")),
    .map([]),
    .map([pair(bulk("first"), .integer(1)), pair(.simpleString("second"), .array([.boolean(true), .null]))]),
    .map([pair(.map([pair(.integer(1), .integer(2))]), .set([.double(1.5)]))]),
    .set([]),
    .set([.integer(1), bulk("two"), .double(3)]),
    .attributed(
        attributes: [pair(bulk("key-popularity"), .map([pair(bulk("a"), .double(0.1923))]))],
        value: .array([.integer(2039123), .integer(9543892)])),
    .attributed(attributes: [], value: .simpleString("OK")),
    .attributed(
        attributes: [pair(.simpleString("ttl"), .integer(3600))],
        value: .attributed(attributes: [pair(.simpleString("k"), .null)], value: .integer(1))),
    .array([.attributed(attributes: [pair(.simpleString("x"), .integer(1))], value: bulk("v")), .integer(2)]),
    .map([pair(.attributed(attributes: [], value: .integer(1)), .attributed(attributes: [], value: .map([])))]),
    .push([bulk("message"), bulk("channel"), bulk("payload")]),
    .push([]),
    .push([bulk("invalidate"), .array([bulk("k1"), bulk("k2")])]),
]

/// RESP2 frames the encoder never writes, with what they decode to.
private let resp2Text = "*-1\r\n$-1\r\n*2\r\n$-1\r\n*-1\r\n*3\r\n$3\r\nfoo\r\n:-5\r\n$0\r\n\r\n"
private let resp2Values: [RESPValue] = [
    .null, .null, .array([.null, .null]), .array([bulk("foo"), .integer(-5), bulk("")]),
]

// MARK: - Round trip

@Suite("RESPDecoder")
struct RESPDecoderTests {
    @Test("every RESP3 type round-trips through writeRESPValue", arguments: corpus)
    func roundTrip(_ value: RESPValue) throws {
        var buffer = encoded([value])
        var decoder = RESPDecoder()
        let decoded = try #require(try decoder.next(from: &buffer))
        #expect(comparable(decoded) == comparable(value))
        #expect(buffer.readableBytes == 0)
        #expect(try decoder.next(from: &buffer) == nil)
    }

    @Test func nanAndSignedZeroSurvive() throws {
        var buffer = ByteBuffer(string: ",nan\r\n,-0.0\r\n,-inf\r\n,1E+3\r\n,+2.5e-1\r\n,inf\r\n")
        var decoder = RESPDecoder()
        let nan = try #require(try decoder.next(from: &buffer))
        guard case .double(let number) = nan else { Issue.record("not a double: \(nan)"); return }
        #expect(number.isNaN)
        guard case .double(let zero) = try decoder.next(from: &buffer) else { Issue.record("not a double"); return }
        #expect(zero == 0 && zero.sign == .minus)
        #expect(try decoder.next(from: &buffer) == .double(-.infinity))
        #expect(try decoder.next(from: &buffer) == .double(1000))
        #expect(try decoder.next(from: &buffer) == .double(0.25))
        #expect(try decoder.next(from: &buffer) == .double(.infinity))
    }

    @Test func encoderWritesTheWireFormat() {
        let cases: [(RESPValue, String)] = [
            (.simpleString("OK"), "+OK\r\n"),
            (.simpleError("ERR x"), "-ERR x\r\n"),
            (.integer(.min), ":-9223372036854775808\r\n"),
            (bulk("hello"), "$5\r\nhello\r\n"),
            (bulk(""), "$0\r\n\r\n"),
            (.array([.integer(1), .null]), "*2\r\n:1\r\n_\r\n"),
            (.boolean(true), "#t\r\n"),
            (.double(1.5), ",1.5\r\n"),
            (.double(.infinity), ",inf\r\n"),
            (.double(-.infinity), ",-inf\r\n"),
            (.double(.nan), ",nan\r\n"),
            (.bigNumber("123"), "(123\r\n"),
            (.bulkError("SYNTAX x"), "!8\r\nSYNTAX x\r\n"),
            (.verbatimString(format: "txt", text: ByteBuffer(string: "Some string")), "=15\r\ntxt:Some string\r\n"),
            (.map([pair(.simpleString("a"), .integer(1))]), "%1\r\n+a\r\n:1\r\n"),
            (.set([.boolean(false)]), "~1\r\n#f\r\n"),
            (.attributed(attributes: [pair(.simpleString("a"), .integer(1))], value: .null), "|1\r\n+a\r\n:1\r\n_\r\n"),
            (.push([bulk("x")]), ">1\r\n$1\r\nx\r\n"),
        ]
        for (value, text) in cases {
            #expect(encoded([value]) == ByteBuffer(string: text), "\(value)")
        }
    }

    @Test func resp2NullsDecodeAsNull() throws {
        let result = try feed([ByteBuffer(string: resp2Text)])
        #expect(result.values == resp2Values)
        #expect(result.leftover == 0)
    }

    // MARK: Splits

    @Test("each frame decodes the same split in two at every byte", arguments: corpus)
    func everySplitOfOneFrame(_ value: RESPValue) throws {
        let bytes = encoded([value])
        for split in 0...bytes.readableBytes {
            let first = bytes.getSlice(at: 0, length: split)!
            let second = bytes.getSlice(at: split, length: bytes.readableBytes - split)!
            let result = try feed([first, second], discardingReadBytes: split % 2 == 0)
            #expect(result.values.map(comparable) == [comparable(value)], "split at \(split)")
            #expect(result.leftover == 0, "split at \(split)")
        }
    }

    @Test func manyFramesInOneBufferDecodeTheSameAtEverySplit() throws {
        var bytes = encoded(corpus)
        bytes.writeString(resp2Text)
        let expected = (corpus + resp2Values).map(comparable)
        for split in 0...bytes.readableBytes {
            let first = bytes.getSlice(at: 0, length: split)!
            let second = bytes.getSlice(at: split, length: bytes.readableBytes - split)!
            let result = try feed([first, second], discardingReadBytes: split % 2 == 1)
            guard result.values.map(comparable) == expected, result.leftover == 0 else {
                Issue.record(
                    "split at \(split) of \(bytes.readableBytes): \(result.values.count) values, \(result.leftover) left"
                )
                return
            }
        }
    }

    @Test func manyFramesDecodeTheSameOneByteAtATime() throws {
        var bytes = encoded(corpus)
        bytes.writeString(resp2Text)
        for discarding in [false, true] {
            let result = try feed(pieces(of: bytes, size: 1), discardingReadBytes: discarding)
            #expect(result.values.map(comparable) == (corpus + resp2Values).map(comparable))
            #expect(result.leftover == 0)
        }
    }

    // MARK: Incremental state

    @Test func anIncompleteAggregateIsConsumedAsFarAsItGoes() throws {
        var decoder = RESPDecoder()
        var buffer = ByteBuffer(string: "*3\r\n:1\r\n:2")
        #expect(try decoder.next(from: &buffer) == nil)
        // The header and the first element were consumed; the partial integer waits in the buffer.
        #expect(buffer == ByteBuffer(string: ":2"))
        buffer.writeString("\r\n$3\r\nab")
        #expect(try decoder.next(from: &buffer) == nil)
        // A partial bulk is left untouched, header included.
        #expect(buffer == ByteBuffer(string: "$3\r\nab"))
        buffer.writeString("c\r\n+OK\r\n")
        #expect(try decoder.next(from: &buffer) == .array([.integer(1), .integer(2), bulk("abc")]))
        #expect(try decoder.next(from: &buffer) == .simpleString("OK"))
        #expect(buffer.readableBytes == 0)
    }

    @Test func bulkPayloadsAreSlicesOfTheInput() throws {
        var buffer = ByteBuffer(string: "$5\r\nhello\r\n")
        let base = buffer.withUnsafeReadableBytes { Int(bitPattern: $0.baseAddress) }
        var decoder = RESPDecoder()
        let value = try #require(try decoder.next(from: &buffer))
        let payload = try #require(value.bulkBytes)
        #expect(payload.withUnsafeReadableBytes { Int(bitPattern: $0.baseAddress) } == base + 4)
    }

    @Test func aHugeClaimedCountWithinTheLimitsCostsNothingUpFront() throws {
        for text in ["*16000000\r\n:1\r\n~1\r\n", "%8000000\r\n+a\r\n"] {
            var decoder = RESPDecoder()
            var buffer = ByteBuffer(string: text)
            #expect(try decoder.next(from: &buffer) == nil)
            #expect(buffer.readableBytes == 0)
        }
    }

    #if DEBUG
        @Test func aLargeArrayInSmallPiecesDecodesInLinearWork() throws {
            let count = 100_000
            // Written by hand (through an array, fast in debug builds), as the encoder is not what this measures.
            var raw = Array("*\(count)\r\n".utf8)
            var elements: [RESPValue] = []
            elements.reserveCapacity(count)
            for index in 0..<count {
                if index % 2 == 0 {
                    raw += ":\(index)\r\n".utf8
                    elements.append(.integer(Int64(index)))
                } else {
                    let text = "v\(index % 1000)"
                    raw += "$\(text.utf8.count)\r\n\(text)\r\n".utf8
                    elements.append(bulk(text))
                }
            }
            let bytes = ByteBuffer(bytes: raw)
            let result = try feed(pieces(of: bytes, size: 1024))
            #expect(result.values == [.array(elements)])
            #expect(result.leftover == 0)
            // Each line end is looked for once, plus a bulk header re-read at most once per piece: re-parsing
            // the array from its start on each of the ~1000 pieces would inspect hundreds of times more.
            #expect(result.decoder.inspectedBytes <= bytes.readableBytes + 32 * (bytes.readableBytes / 1024 + 1))
        }

        @Test func aLongLineArrivingByteByByteIsScannedOnce() throws {
            let text = "+" + String(repeating: "a", count: 20_000) + "\r\n"
            let result = try feed(pieces(of: ByteBuffer(string: text), size: 1))
            #expect(result.values == [.simpleString(String(repeating: "a", count: 20_000))])
            #expect(result.decoder.inspectedBytes <= text.utf8.count)
        }

        @Test func aLargeBulkArrivingInPiecesRereadsOnlyItsHeader() throws {
            let payload = [UInt8](repeating: 0x41, count: 1 << 20)
            let bytes = encoded([bulk(payload)])
            let result = try feed(pieces(of: bytes, size: 1024))
            #expect(result.values == [bulk(payload)])
            #expect(result.decoder.inspectedBytes <= 10 * (bytes.readableBytes / 1024 + 1))
        }
    #endif

    // MARK: Accessors and description

    @Test func accessorsReadTheCasesTheyName() {
        let verbatim = RESPValue.verbatimString(format: "txt", text: ByteBuffer(string: "text"))
        #expect(bulk("abc").bulkBytes == ByteBuffer(string: "abc"))
        #expect(verbatim.bulkBytes == ByteBuffer(string: "text"))
        #expect(RESPValue.simpleString("abc").bulkBytes == nil)
        #expect(RESPValue.simpleString("abc").string == "abc")
        #expect(bulk("héllo").string == "héllo")
        #expect(verbatim.string == "text")
        #expect(RESPValue.integer(3).string == nil)
        #expect(RESPValue.integer(-3).integerValue == -3)
        #expect(bulk("3").integerValue == nil)
        #expect(RESPValue.array([.null]).arrayValue == [.null])
        #expect(RESPValue.set([.integer(1)]).arrayValue == [.integer(1)])
        #expect(RESPValue.push([]).arrayValue == [])
        #expect(RESPValue.map([]).arrayValue == nil)
        #expect(RESPValue.null.isNull)
        #expect(!bulk("").isNull)
        #expect(RESPValue.simpleError("WRONGTYPE Operation").serverError?.kind == .wrongType)
        #expect(
            RESPValue.bulkError("MOVED 1 h:1").serverError?.kind
                == .moved(slot: 1, to: RedisEndpoint(host: "h", port: 1)))
        #expect(RESPValue.simpleString("ERR").serverError == nil)
        let attributed = RESPValue.attributed(
            attributes: [pair(.simpleString("a"), .null)], value: .attributed(attributes: [], value: .integer(5)))
        #expect(attributed.value == .integer(5))
        #expect(attributed.integerValue == 5)
        #expect(RESPValue.integer(5).value == .integer(5))
    }

    @Test func descriptionsAreShort() {
        #expect(RESPValue.simpleString("OK").description == "OK")
        #expect(RESPValue.simpleString("héllo").description == "héllo")
        #expect(RESPValue.simpleString(String(repeating: "s", count: 100)).description.hasSuffix("… (100 bytes)"))
        #expect(bulk("a\"b\r\n\u{1}").description == #""a\"b\r\n\x01""#)
        #expect(RESPValue.array([.integer(1), .null, .boolean(true)]).description == "[1, (nil), true]")
        #expect(RESPValue.simpleError("ERR x").description == "(error) ERR x")
        #expect(RESPValue.map([pair(bulk("k"), .double(1.5))]).description == #"{"k": 1.5}"#)
        let long = bulk(String(repeating: "x", count: 10_000)).description
        #expect(long.count < 100 && long.hasSuffix("(10000 bytes)"))
        let wide = RESPValue.array((0..<1000).map { .integer(Int64($0)) }).description
        #expect(wide.count < 200 && wide.hasSuffix("(1000 elements)]"))
        var deep = RESPValue.array((0..<16).map { .integer(Int64($0)) })
        for _ in 0..<8 { deep = .array(Array(repeating: deep, count: 16)) }
        #expect(deep.description.count < 2000)
    }
}
