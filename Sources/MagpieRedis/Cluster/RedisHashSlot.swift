/// Redis Cluster's key → slot mapping: CRC16 (XMODEM: polynomial 0x1021, initial 0) of the key, or of
/// its hash tag (the bytes between the first `{` and the next `}`, when that is not empty), mod 16384.
public enum RedisHashSlot {
    /// The number of slots in a cluster.
    public static let count = 16384

    /// The slot of a key.
    @inlinable
    public static func slot<Key: Collection<UInt8>>(of key: Key) -> UInt16 {
        if let slot = key.withContiguousStorageIfAvailable({ slot(ofBytes: UnsafeRawBufferPointer($0)) }) {
            return slot
        }
        return Array(key).withUnsafeBytes { slot(ofBytes: $0) }
    }

    /// The slot of a key given as raw bytes (the non-generic core every other form calls).
    public static func slot(ofBytes key: UnsafeRawBufferPointer) -> UInt16 {
        let count = key.count
        var start = 0
        var end = count
        // Hash tag: from the first "{" to the next "}", when the tag is not empty.
        if let open = key.firstIndex(of: UInt8(ascii: "{")) {
            var close = open + 1
            while close < count, key[close] != UInt8(ascii: "}") { close += 1 }
            if close < count, close > open + 1 {
                start = open + 1
                end = close
            }
        }
        return crc16(UnsafeRawBufferPointer(rebasing: key[start..<end])) & 0x3FFF
    }

    /// CRC16-XMODEM.
    @inlinable
    public static func crc16<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> UInt16 {
        if let crc = bytes.withContiguousStorageIfAvailable({ crc16(UnsafeRawBufferPointer($0)) }) { return crc }
        return Array(bytes).withUnsafeBytes { crc16($0) }
    }

    /// CRC16-XMODEM of raw bytes.
    public static func crc16(_ bytes: UnsafeRawBufferPointer) -> UInt16 {
        table.withUnsafeBufferPointer { table in
            var crc: UInt16 = 0
            for byte in bytes {
                crc = (crc << 8) ^ table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ byte)]
            }
            return crc
        }
    }

    private static let table: [UInt16] = (0..<256).map { index -> UInt16 in
        var crc = UInt16(index) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }

    /// A short hash tag for each slot: `{tag}` in a key puts it in that slot (the first tag, in base 36
    /// order, whose CRC16 falls there). Computed once, on first use.
    public static func tag(for slot: UInt16) -> [UInt8] {
        tags[Int(slot & 0x3FFF)]
    }

    private static let tags: [[UInt8]] = {
        var tags = [[UInt8]](repeating: [], count: count)
        var missing = count
        var candidate = 0
        while missing > 0 {
            let tag = Array(String(candidate, radix: 36).utf8)
            let slot = Int(crc16(tag) & 0x3FFF)
            if tags[slot].isEmpty {
                tags[slot] = tag
                missing -= 1
            }
            candidate += 1
        }
        return tags
    }()
}
