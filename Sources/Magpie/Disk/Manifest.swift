/// The MANIFEST: what a directory was created with. Written once, atomically, at creation.
///
/// 56 bytes, little-endian: 16-byte magic "MAGPIE-MANIFEST\n" | u32 format version | u32 bucket count |
/// u64 hash seed | i64 creation time (ms since 1970) | u64 reserved (0) | u64 XXH3-64 of bytes 0..<48.
struct Manifest: Equatable {
    static let size = 56
    static let magic = Array("MAGPIE-MANIFEST\n".utf8)
    static let formatVersion: UInt32 = 1

    var formatVersion: UInt32 = Manifest.formatVersion
    var bucketCount: Int
    var seed: UInt64
    var created: Int64

    func encoded() -> [UInt8] {
        var bytes = Self.magic + [UInt8](repeating: 0, count: Self.size - Self.magic.count)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: formatVersion.littleEndian, toByteOffset: 16, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 20, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: created.littleEndian, toByteOffset: 32, as: Int64.self)
            let sum = KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: raw[0..<48]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self)
        }
        return bytes
    }

    /// Nil when the bytes are not an intact manifest (of any version).
    static func decode(_ bytes: [UInt8]) -> Manifest? {
        guard bytes.count == size, Array(bytes[0..<16]) == magic else { return nil }
        return bytes.withUnsafeBytes { raw -> Manifest? in
            let sum = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
            guard sum == KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: raw[0..<48])) else { return nil }
            return Manifest(
                formatVersion: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: UInt32.self)),
                bucketCount: Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 20, as: UInt32.self))),
                seed: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self)),
                created: Int64(littleEndian: raw.loadUnaligned(fromByteOffset: 32, as: Int64.self)))
        }
    }
}
