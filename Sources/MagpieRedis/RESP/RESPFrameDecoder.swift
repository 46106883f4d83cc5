import NIOCore

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
