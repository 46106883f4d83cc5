import NIOCore
import NIOEmbedded
import Testing

@testable import MagpieRedis

// What the decoder refuses (malformed input, streamed types, each limit) and the decoder in a channel
// pipeline. The helpers and the corpus are in RESPDecoderTests.swift.

extension RESPDecoderTests {
    // MARK: Malformed input

    @Test(
        "malformed input throws malformed",
        arguments: [
            "A\r\n", "\r\n", "\0", "+OK\n", "+OK\rX\r\n", "+O\nK\r\n",
            "$3\r\nfooXX", "$3\r\nfoo\n\r", "$3\r\nfoo\r\r",
            "$x\r\n", "$\r\n", "$1x\r\n", "$ 1\r\n", "$+1\r\n", "*1.5\r\n",
            "$-2\r\n", "$-0\r\n", "*-5\r\n", "%-1\r\n", "~-1\r\n", ">-1\r\n", "|-1\r\n", "!-1\r\n", "=-1\r\n",
            ":9223372036854775808\r\n", ":-9223372036854775809\r\n", ":99999999999999999999\r\n",
            ":\r\n", ":-\r\n", ":+\r\n", ":12a\r\n", ": 1\r\n", ":1 \r\n", ":--1\r\n",
            "#x\r\n", "#\r\n", "#tt\r\n", "#T\r\n", "#1\r\n",
            ",abc\r\n", ",1.\r\n", ",.5\r\n", ",1e\r\n", ",1e+\r\n", ",infinity\r\n", ",0x10\r\n", ",\r\n", ",INF\r\n",
            ",1.5 \r\n",
            "(12a\r\n", "(\r\n", "(-\r\n", "_x\r\n",
            "=3\r\ntxt\r\n", "=5\r\ntxtxy\r\n",
            "*2\r\n:1\r\n:x\r\n", "%1\r\n+k\r\n#y\r\n", "|1\r\n+k\r\n+v\r\n!x\r\n",
        ]
    )
    func malformed(_ text: String) {
        #expect(decodingError(text)?.kind == .malformed)
    }

    @Test(
        "streamed types are malformed",
        arguments: [
            "$?\r\n;4\r\nHell\r\n;0\r\n", "*?\r\n:1\r\n.\r\n", "%?\r\n", "~?\r\n", ">?\r\n", "|?\r\n", "!?\r\n",
            "=?\r\n", ";4\r\nHell\r\n", ".\r\n",
        ]
    )
    func streamed(_ text: String) {
        let error = decodingError(text)
        #expect(error?.kind == .malformed)
        #expect(error?.message.contains("stream") == true, "\(String(describing: error))")
    }

    @Test func anErrorLeavesTheDecoderUnusable() throws {
        var decoder = RESPDecoder()
        var buffer = ByteBuffer(string: "X\r\n+OK\r\n")
        #expect(throws: RESPProtocolError.self) { try decoder.next(from: &buffer) }
        var good = ByteBuffer(string: "+OK\r\n")
        let again = #expect(throws: RESPProtocolError.self) { try decoder.next(from: &good) }
        #expect(again?.kind == .malformed)
        #expect(good.readableBytes == 5)
    }

    // MARK: Limits

    @Test func anOversizedBulkFailsFromItsHeaderAlone() {
        #expect(decodingError("$600000000\r\n")?.kind == .bulkTooLong)
        #expect(decodingError("$99999999999999999999999999\r\n")?.kind == .bulkTooLong)
        let small = RESPDecoderLimits(maxBulkLength: 10)
        #expect(decodingError("$11\r\n", limits: small)?.kind == .bulkTooLong)
        #expect(decodingError("!11\r\n", limits: small)?.kind == .bulkTooLong)
        #expect(decodingError("=11\r\n", limits: small)?.kind == .bulkTooLong)
        #expect(decodingError("*1\r\n$11\r\n", limits: small)?.kind == .bulkTooLong)
        #expect(decodingError("$10\r\n0123456789\r\n", limits: small) == nil)
    }

    @Test func anOversizedAggregateFailsFromItsHeaderAlone() {
        #expect(decodingError("*16777217\r\n")?.kind == .aggregateTooLarge)
        #expect(decodingError("*99999999999999999999999999\r\n")?.kind == .aggregateTooLarge)
        let small = RESPDecoderLimits(maxAggregateCount: 3)
        for type in ["*", "~", ">", "%", "|"] {
            #expect(decodingError("\(type)4\r\n", limits: small)?.kind == .aggregateTooLarge, "\(type)")
        }
        #expect(
            decodingError("*3\r\n:1\r\n:2\r\n:3\r\n%3\r\n:1\r\n:1\r\n:2\r\n:2\r\n:3\r\n:3\r\n", limits: small) == nil)
    }

    @Test func nestingDeeperThanTheLimitFails() {
        let deepest = String(repeating: "*1\r\n", count: 32) + ":1\r\n"
        #expect(decodingError(deepest) == nil)
        #expect(decodingError(String(repeating: "*1\r\n", count: 33))?.kind == .nestingTooDeep)
        let two = RESPDecoderLimits(maxDepth: 2)
        #expect(decodingError("*1\r\n*0\r\n", limits: two) == nil)
        #expect(decodingError("*1\r\n*1\r\n*0\r\n", limits: two)?.kind == .nestingTooDeep)
        #expect(decodingError("%1\r\n+k\r\n~1\r\n>0\r\n", limits: two)?.kind == .nestingTooDeep)
        // An attribute counts like an aggregate, both for its pairs and for the value it annotates.
        #expect(decodingError("|1\r\n+k\r\n*0\r\n*1\r\n*0\r\n", limits: two)?.kind == .nestingTooDeep)
        #expect(decodingError("|1\r\n+k\r\n*1\r\n*0\r\n:1\r\n", limits: two)?.kind == .nestingTooDeep)
        #expect(decodingError("|0\r\n*1\r\n:1\r\n", limits: two) == nil)
    }

    @Test func aLineLongerThanTheLimitFailsWithoutWaitingForItsEnd() throws {
        let eight = RESPDecoderLimits(maxLineLength: 8)
        // Eight bytes, then the CR, then the LF: still a line that may end within the limit.
        for text in ["+aaaaaaaa", "+aaaaaaaa\r"] {
            var decoder = RESPDecoder(limits: eight)
            var buffer = ByteBuffer(string: text)
            #expect(try decoder.next(from: &buffer) == nil, "\(text)")
            buffer.writeString(text.hasSuffix("\r") ? "\n" : "\r\n")
            #expect(try decoder.next(from: &buffer) == .simpleString("aaaaaaaa"))
        }
        #expect(decodingError("+aaaaaaaaa", limits: eight)?.kind == .lineTooLong)
        #expect(decodingError("-aaaaaaaaa\r", limits: eight)?.kind == .lineTooLong)
        #expect(decodingError("$123456789", limits: eight)?.kind == .lineTooLong)
        #expect(decodingError("*1\r\n:1234567890", limits: eight)?.kind == .lineTooLong)

        let line = String(repeating: "a", count: 64 * 1024)
        #expect(decodingError("+" + line) == nil)
        #expect(decodingError("+" + line + "\r") == nil)
        #expect(decodingError("+" + line + "a")?.kind == .lineTooLong)
    }

    @Test func valuesNestedWithinTheLimitsCannotMultiplyPastTheFrameLimit() {
        let ten = RESPDecoderLimits(maxFrameElements: 10)
        // 1 + 4 + 4 values claimed so far: within the limit; the next `*4` would make 13.
        #expect(decodingError("*4\r\n*4\r\n", limits: ten) == nil)
        #expect(decodingError("*4\r\n*4\r\n:1\r\n:1\r\n:1\r\n:1\r\n*4\r\n", limits: ten)?.kind == .frameTooLarge)
        #expect(decodingError("%5\r\n", limits: ten)?.kind == .frameTooLarge)
        #expect(decodingError("|4\r\n", limits: ten) == nil)
        #expect(decodingError("|5\r\n", limits: ten)?.kind == .frameTooLarge)
        // The count starts again with each top-level value.
        let eight = "*2\r\n*3\r\n:1\r\n:2\r\n:3\r\n*2\r\n:4\r\n:5\r\n"
        #expect(decodingError(eight + eight + eight, limits: ten) == nil)
    }

    @Test func aFrameOverTheByteLimitFailsFromTheBulkHeader() {
        let fifty = RESPDecoderLimits(maxFrameBytes: 50)
        let twenty = String(repeating: "z", count: 20)
        // 4 + 27 bytes, then a second bulk header that claims 27 more: it fails before its payload arrives.
        #expect(decodingError("*2\r\n$20\r\n\(twenty)\r\n$20\r\n", limits: fifty)?.kind == .frameTooLarge)
        // 4 + 28 + 28 bytes of lines.
        let line = String(repeating: "z", count: 25)
        #expect(decodingError("*2\r\n+\(line)\r\n+\(line)\r\n", limits: fifty)?.kind == .frameTooLarge)
        // The count starts again with each top-level value.
        let frame = "*2\r\n$20\r\n\(twenty)\r\n:1\r\n"
        #expect(decodingError(frame + frame + frame, limits: fifty) == nil)
    }

    @Test func limitsKeepTheirDefaults() {
        let limits = RESPDecoderLimits()
        #expect(limits == RESPDecoderLimits(maxDepth: 32))
        #expect(limits.maxBulkLength == 512 * 1024 * 1024)
        #expect(limits.maxAggregateCount == 1 << 24)
        #expect(limits.maxLineLength == 64 * 1024)
        #expect(limits.maxFrameElements == 1 << 24)
        #expect(limits.maxFrameBytes == 1 << 30)
        // Extreme limits are clamped, not trapped on, and a length past any Int still exceeds them.
        let huge = RESPDecoderLimits(
            maxBulkLength: .max, maxAggregateCount: .max, maxDepth: .max, maxLineLength: .max, maxFrameElements: .max,
            maxFrameBytes: .max)
        #expect(decodingError("+OK\r\n$5\r\nhello\r\n*1\r\n%1\r\n:1\r\n:2\r\n", limits: huge) == nil)
        #expect(decodingError("$99999999999999999999999999\r\n", limits: huge)?.kind == .bulkTooLong)
        #expect(decodingError("$1000000000000000000\r\n", limits: huge)?.kind == .bulkTooLong)
        #expect(decodingError("*99999999999999999999999999\r\n", limits: huge)?.kind == .aggregateTooLarge)
        #expect(decodingError("%9223372036854775807\r\n", limits: huge)?.kind == .aggregateTooLarge)
        let noLines = RESPDecoderLimits(maxLineLength: -1)
        #expect(decodingError("+\r\n", limits: noLines) == nil)
        #expect(decodingError("+a", limits: noLines)?.kind == .lineTooLong)
        #expect(decodingError("*0\r\n", limits: RESPDecoderLimits(maxDepth: -1))?.kind == .nestingTooDeep)
        #expect(decodingError("$0\r\n\r\n", limits: RESPDecoderLimits(maxBulkLength: -1)) == nil)
        #expect(decodingError("+\r\n", limits: RESPDecoderLimits(maxFrameBytes: -1))?.kind == .frameTooLarge)
    }

    // MARK: Channel pipeline

    @Test func theFrameDecoderDeliversValuesAcrossSplitWrites() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(RESPFrameDecoder(limits: .init())))
        let values: [RESPValue] = [
            .simpleString("OK"), .array([bulk("a"), .integer(2)]), .push([bulk("message"), bulk("c"), bulk("p")]),
            bulk(String(repeating: "q", count: 5000)), .map([pair(.simpleString("k"), .set([.boolean(true)]))]),
        ]
        var received: [RESPValue] = []
        for piece in pieces(of: encoded(values), size: 7) {
            try channel.writeInbound(piece)
            while let value = try channel.readInbound(as: RESPValue.self) { received.append(value) }
        }
        #expect(received == values)
        // A partial reply at EOF is dropped.
        try channel.writeInbound(ByteBuffer(string: "*2\r\n:1\r\n"))
        #expect(try channel.readInbound(as: RESPValue.self) == nil)
        #expect(try channel.finish().isClean)
    }

    @Test func theFrameDecoderThrowsProtocolErrorsIntoThePipeline() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            ByteToMessageHandler(RESPFrameDecoder(limits: RESPDecoderLimits(maxBulkLength: 4))))
        #expect(throws: RESPProtocolError.self) { try channel.writeInbound(ByteBuffer(string: "+OK\r\n$5\r\n")) }
        #expect(try channel.readInbound(as: RESPValue.self) == .simpleString("OK"))
        _ = try? channel.finish()
    }
}
