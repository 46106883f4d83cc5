import Glibc
import Synchronization

/// An index table: a 16-byte header holding the bucket mask, then the buckets (8 bytes each, atomic: a
/// lock-free reader loads them while the shard's writer stores them). One allocation, so that a reader
/// gets the buckets and their count from one pointer; free it with `free`.
enum IndexTable {
    static let headerSize = 16

    /// A zeroed table of `buckets` (a power of two); nil when memory runs out.
    static func allocate(buckets: Int) -> UnsafeMutableRawPointer? {
        guard let table = calloc(1, headerSize + buckets * MemoryLayout<UInt64>.stride) else { return nil }
        table.storeBytes(of: buckets - 1, as: Int.self)
        _ = (table + headerSize).bindMemory(to: Atomic<UInt64>.self, capacity: buckets)
        return table
    }

    @inline(__always)
    static func mask(_ table: UnsafeRawPointer) -> Int { table.load(as: Int.self) }

    @inline(__always)
    static func buckets(_ table: UnsafeMutableRawPointer) -> UnsafeMutablePointer<Atomic<UInt64>> {
        (table + headerSize).assumingMemoryBound(to: Atomic<UInt64>.self)
    }
}

/// `calloc` for `count` values of a trivial type whose all-zero bit pattern is valid; nil on failure.
func allocateZeroed<T>(_ type: T.Type, _ count: Int) -> UnsafeMutablePointer<T>? {
    calloc(count, MemoryLayout<T>.stride)?.bindMemory(to: T.self, capacity: count)
}
