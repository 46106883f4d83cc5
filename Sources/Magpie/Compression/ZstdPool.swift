/// A pool of zstd contexts shared by many threads: a caller takes a context, uses it outside any lock,
/// and gives it back. The pool holds at most as many contexts of each kind as were ever in use at once.
final class ZstdPool: Sendable {
    /// A context in a box, so the pool can hold `~Copyable` contexts in an array.
    private final class CompressorBox {
        let compressor: ZstdCompressor
        init(_ compressor: consuming ZstdCompressor) { self.compressor = compressor }
    }

    private final class DecompressorBox {
        let decompressor: ZstdDecompressor
        init(_ decompressor: consuming ZstdDecompressor) { self.decompressor = decompressor }
    }

    private struct Free {
        var compressors: [CompressorBox] = []
        var decompressors: [DecompressorBox] = []
    }

    let level: Int
    private let free = Locked(Free())

    /// - Throws: ``MagpieError/Code/invalidConfiguration`` for a level libzstd does not support.
    init(level: Int) throws(MagpieError) {
        guard ZstdCompressor.supportedLevels.contains(level) else {
            throw MagpieError(.invalidConfiguration, "zstd level \(level) is outside \(ZstdCompressor.supportedLevels)")
        }
        self.level = level
    }

    /// The compressed form of `source`, or nil when it would not be smaller.
    func compress(_ source: UnsafeRawBufferPointer) throws(MagpieError) -> [UInt8]? {
        // Nothing is smaller than an empty input (and see decompress on zero capacities).
        if source.isEmpty { return nil }
        let box: CompressorBox
        if let reused = free.withLock({ $0.compressors.popLast() }) {
            box = reused
        } else {
            box = CompressorBox(try ZstdCompressor(level: level))
        }
        defer { free.withLock { $0.compressors.append(box) } }
        // A destination as large as the input: zstd fails exactly when the output would not be smaller.
        var fits = false
        let output = [UInt8](unsafeUninitializedCapacity: source.count) { buffer, initialized in
            let written = try? box.compressor.compress(source, into: UnsafeMutableRawBufferPointer(buffer))
            fits = written.map { $0 < source.count } ?? false
            initialized = fits ? written! : 0
        }
        return fits ? output : nil
    }

    /// Decompresses one frame into exactly `originalLength` bytes.
    func decompress(_ source: UnsafeRawBufferPointer, originalLength: Int) throws(MagpieError) -> [UInt8] {
        let box: DecompressorBox
        if let reused = free.withLock({ $0.decompressors.popLast() }) {
            box = reused
        } else {
            box = DecompressorBox(try ZstdDecompressor())
        }
        defer { free.withLock { $0.decompressors.append(box) } }
        if originalLength == 0 {
            // Not through init(unsafeUninitializedCapacity:): for a zero capacity it writes into the
            // stdlib's shared empty-array storage, a (benign) race that Thread Sanitizer reports.
            _ = try box.decompressor.decompress(source, into: UnsafeMutableRawBufferPointer(start: nil, count: 0))
            return []
        }
        var failure: MagpieError? = nil
        // decompress(_:into:) either fills the whole buffer or throws; only then is it counted initialised.
        let output = [UInt8](unsafeUninitializedCapacity: originalLength) { buffer, initialized in
            do throws(MagpieError) {
                initialized = try box.decompressor.decompress(source, into: UnsafeMutableRawBufferPointer(buffer))
            } catch {
                failure = error
                initialized = 0
            }
        }
        if let failure { throw failure }
        return output
    }
}
