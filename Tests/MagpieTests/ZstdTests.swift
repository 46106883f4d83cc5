import Magpie
import MagpieTestSupport
import Testing

@Suite("Zstd wrapper")
struct ZstdTests {
    static func incompressible(_ count: Int) -> [UInt8] {
        var generator = SeededGenerator(seed: 7)
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    static func compressible(_ count: Int) -> [UInt8] {
        let line = Array(#"{"user":"magpie","items":[1,2,3],"active":true}"#.utf8)
        return (0..<count).map { line[$0 % line.count] }
    }

    @Test("round trips", arguments: [0, 1, 4096, 1 << 20])
    func roundTrip(length: Int) throws {
        let compressor = try ZstdCompressor(level: 1)
        let decompressor = try ZstdDecompressor()
        for input in [Self.compressible(length), Self.incompressible(length)] {
            let frame = try compressor.compress(input)
            #expect(try decompressor.decompress(frame, originalLength: input.count) == input)
        }
    }

    @Test("contexts are reused across many blobs and levels")
    func reuse() throws {
        for level in [-5, 1, 3, 19] {
            let compressor = try ZstdCompressor(level: level)
            let decompressor = try ZstdDecompressor()
            for n in 0..<50 {
                let input = Self.compressible(100 + n * 37)
                let frame = try compressor.compress(input)
                #expect(try decompressor.decompress(frame, originalLength: input.count) == input)
            }
        }
    }

    @Test("compressible input shrinks; incompressible input stays within the bound")
    func ratio() throws {
        let compressor = try ZstdCompressor(level: 1)
        #expect(try compressor.compress(Self.compressible(1 << 20)).count < (1 << 20) / 20)
        let random = Self.incompressible(1 << 16)
        let frame = try compressor.compress(random)
        #expect(frame.count <= ZstdCompressor.maximumCompressedLength(random.count))
        #expect(ZstdDecompressor.declaredLength(of: frame.withUnsafeBytes { $0 }) == random.count)
    }

    @Test("corrupt, truncated and empty input is a clear error, never a wrong result")
    func corruptInput() throws {
        let compressor = try ZstdCompressor(level: 3)
        let decompressor = try ZstdDecompressor()
        let input = Self.compressible(8192)
        let frame = try compressor.compress(input)

        #expect(throws: MagpieError.self) { try decompressor.decompress([UInt8](), originalLength: 0) }
        #expect(throws: MagpieError.self) { try decompressor.decompress(frame.dropLast(5), originalLength: input.count) }
        #expect(throws: MagpieError.self) { try decompressor.decompress(Self.incompressible(200), originalLength: 100) }
        var garbled = frame
        garbled[0] ^= 0xff  // magic number
        let error = #expect(throws: MagpieError.self) { try decompressor.decompress(garbled, originalLength: input.count) }
        #expect(error?.code == .decompressionFailed)

        // A wrong expected length is refused in both directions.
        #expect(throws: MagpieError.self) { try decompressor.decompress(frame, originalLength: input.count - 1) }
        #expect(throws: MagpieError.self) { try decompressor.decompress(frame, originalLength: input.count + 1) }

        // Flipping any single byte of the payload either fails or (zstd has no checksum here) yields
        // bytes that are then caught by the record checksum of the disk tier; it never traps.
        for offset in stride(from: 0, to: frame.count, by: 3) {
            var flipped = frame
            flipped[offset] ^= 0x5a
            _ = try? decompressor.decompress(flipped, originalLength: input.count)
        }
    }

    @Test("a destination that is too small is an error")
    func smallDestination() throws {
        let compressor = try ZstdCompressor(level: 1)
        let input = Self.incompressible(1000)
        var output = [UInt8](repeating: 0, count: 10)
        let result = input.withUnsafeBytes { src in
            output.withUnsafeMutableBytes { dst in
                Result { () throws(MagpieError) -> Int in try compressor.compress(src, into: dst) }
            }
        }
        #expect(throws: MagpieError.self) { try result.get() }
    }

    @Test("levels outside libzstd's range are refused")
    func invalidLevel() {
        let error = #expect(throws: MagpieError.self) { _ = try ZstdCompressor(level: 1000) }
        #expect(error?.code == .invalidConfiguration)
        #expect(ZstdCompressor.supportedLevels.contains(1))
        #expect(ZstdCompressor.supportedLevels.contains(19))
    }
}
