import CZstd

/// A reusable zstd compression context over the system's libzstd.
///
/// Creating a context costs far more than compressing a 4 KiB blob, so a context is made once and
/// reused for every blob. A context is not thread-safe: it is `~Copyable` and not `Sendable`, so one
/// owner at a time uses it (the disk tier lends compression contexts out from a pool and keeps a
/// decompression context per thread, see ZstdPool.swift). `deinit` frees it.
///
/// This file is the only code that imports `CZstd`.
package struct ZstdCompressor: ~Copyable {
    // Invariant: a valid ZSTD_CCtx, owned by this value alone, freed exactly once in deinit.
    private let context: OpaquePointer

    /// The compression level in effect.
    package let level: Int

    /// The levels libzstd accepts (negative levels are its "fast" modes).
    package static var supportedLevels: ClosedRange<Int> {
        Int(ZSTD_minCLevel())...Int(ZSTD_maxCLevel())
    }

    /// The largest compressed size of `length` input bytes: a destination this large never overflows.
    package static func maximumCompressedLength(_ length: Int) -> Int {
        ZSTD_compressBound(length)
    }

    /// Creates a context.
    /// - Parameter level: a zstd level in ``supportedLevels``; 1 is fast with a good ratio, 3 is zstd's default.
    /// - Throws: ``MagpieError/Code/invalidConfiguration`` for a level outside the supported range,
    ///   ``MagpieError/Code/compressionFailed`` if libzstd cannot allocate the context.
    package init(level: Int = 1) throws(MagpieError) {
        guard Self.supportedLevels.contains(level) else {
            throw MagpieError(
                .invalidConfiguration, "zstd level \(level) is outside \(Self.supportedLevels)")
        }
        guard let context = ZSTD_createCCtx() else {
            throw MagpieError(.compressionFailed, "ZSTD_createCCtx failed (out of memory)")
        }
        let status = ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, Int32(level))
        if ZSTD_isError(status) != 0 {
            ZSTD_freeCCtx(context)
            throw MagpieError(.invalidConfiguration, "zstd level \(level): \(zstdErrorName(status))")
        }
        self.context = context
        self.level = level
    }

    deinit {
        ZSTD_freeCCtx(context)
    }

    /// Compresses `source` into `destination` as one zstd frame.
    /// - Returns: the number of bytes written to `destination`.
    /// - Throws: ``MagpieError/Code/compressionFailed`` when `destination` is too small (size it with
    ///   ``maximumCompressedLength(_:)`` to rule that out) or libzstd fails.
    package func compress(
        _ source: UnsafeRawBufferPointer, into destination: UnsafeMutableRawBufferPointer
    ) throws(MagpieError) -> Int {
        // ZSTD_compress2 reads `source.count` bytes and writes at most `destination.count`; both
        // base addresses may be nil only with a zero count, which libzstd accepts.
        let written = ZSTD_compress2(
            context, destination.baseAddress, destination.count, source.baseAddress, source.count)
        if ZSTD_isError(written) != 0 {
            throw MagpieError(.compressionFailed, "zstd compress: \(zstdErrorName(written))")
        }
        return written
    }

    /// Compresses bytes into a new array holding one zstd frame.
    package func compress(_ source: some Sequence<UInt8>) throws(MagpieError) -> [UInt8] {
        let input = Array(source)
        let bound = Self.maximumCompressedLength(input.count)
        var output = [UInt8](repeating: 0, count: bound)
        // Array's closures rethrow untyped errors, so the typed error travels back as a Result.
        let written = try input.withUnsafeBytes { src in
            output.withUnsafeMutableBytes { dst in
                Result { () throws(MagpieError) -> Int in try compress(src, into: dst) }
            }
        }.get()
        output.removeLast(bound - written)
        return output
    }
}

/// A reusable zstd decompression context over the system's libzstd.
///
/// Decompression always targets a buffer of the exact expected size: the caller knows the original
/// length (the disk record stores it under a checksum), so a corrupt or hostile frame can neither write
/// past the buffer nor make Magpie allocate what its header claims.
package struct ZstdDecompressor: ~Copyable {
    // Invariant: a valid ZSTD_DCtx, owned by this value alone, freed exactly once in deinit.
    private let context: OpaquePointer

    /// Creates a context.
    /// - Throws: ``MagpieError/Code/decompressionFailed`` if libzstd cannot allocate the context.
    package init() throws(MagpieError) {
        guard let context = ZSTD_createDCtx() else {
            throw MagpieError(.decompressionFailed, "ZSTD_createDCtx failed (out of memory)")
        }
        self.context = context
    }

    deinit {
        ZSTD_freeDCtx(context)
    }

    /// The original length a frame's header declares, or nil when the header is unreadable or the
    /// frame does not record it. Untrusted: use it for diagnostics, never to size an allocation.
    package static func declaredLength(of frame: UnsafeRawBufferPointer) -> Int? {
        let size = ZSTD_getFrameContentSize(frame.baseAddress, frame.count)
        if size == magpie_zstd_contentsize_unknown() || size == magpie_zstd_contentsize_error() {
            return nil
        }
        return size <= UInt64(Int.max) ? Int(size) : nil
    }

    /// Decompresses one or more complete frames into `destination`, which must be exactly the original size.
    /// - Returns: the number of bytes written, always `destination.count`.
    /// - Throws: ``MagpieError/Code/decompressionFailed`` when the input is corrupt or truncated, or
    ///   decompresses to any length other than `destination.count`.
    @discardableResult
    package func decompress(
        _ source: UnsafeRawBufferPointer, into destination: UnsafeMutableRawBufferPointer
    ) throws(MagpieError) -> Int {
        if source.isEmpty {
            throw MagpieError(.decompressionFailed, "zstd decompress: empty input is not a frame")
        }
        // libzstd never writes more than destination.count bytes; an output that would be longer
        // fails with "Destination buffer is too small".
        let written = ZSTD_decompressDCtx(
            context, destination.baseAddress, destination.count, source.baseAddress, source.count)
        if ZSTD_isError(written) != 0 {
            throw MagpieError(.decompressionFailed, "zstd decompress: \(zstdErrorName(written))")
        }
        guard written == destination.count else {
            throw MagpieError(
                .decompressionFailed,
                "zstd decompress: produced \(written) bytes, expected \(destination.count)")
        }
        return written
    }

    /// Decompresses bytes holding zstd frames into a new array of exactly `originalLength` bytes.
    /// - Throws: ``MagpieError/Code/decompressionFailed`` as ``decompress(_:into:)``.
    package func decompress(_ source: some Sequence<UInt8>, originalLength: Int) throws(MagpieError)
        -> [UInt8]
    {
        guard originalLength >= 0 else {
            throw MagpieError(.decompressionFailed, "negative original length \(originalLength)")
        }
        let input = Array(source)
        var output = [UInt8](repeating: 0, count: originalLength)
        _ = try input.withUnsafeBytes { src in
            output.withUnsafeMutableBytes { dst in
                Result { () throws(MagpieError) -> Int in try decompress(src, into: dst) }
            }
        }.get()
        return output
    }
}

private func zstdErrorName(_ code: Int) -> String {
    guard let name = ZSTD_getErrorName(code) else { return "error \(code)" }
    return String(cString: name)
}
