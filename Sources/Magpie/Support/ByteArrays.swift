// Byte arrays written in place, through the standard library's specialised allocation.
//
// Every `[UInt8]` the disk tier returns is allocated and then written once: a raw payload copied out of a
// file's mapping, a zstd frame decompressed. `Array(unsafeUninitializedCapacity:initializingWith:)` is the
// obvious way, but on Swift 6.3 / Linux it allocates through `Array._allocateBufferUninitialized`, which
// is `@inline(never)` and generic: every call asks the runtime for `_ContiguousArrayStorage<UInt8>`'s
// metadata (a hash-table look-up, about 350 instructions per array, measured with callgrind:
// docs/lab-notes/disk.md, the read path's arrays). `Array(_:)` over a collection allocates through inlinable
// code instead, specialised for `UInt8` in the caller, and hands the new storage to the collection's
// `_copyContents(initializing:)` to fill. ``FilledBytes`` is such a collection: its elements are whatever
// a ``ByteFiller`` writes.
//
// `_copyContents(initializing:)` is a public requirement of `Sequence` (underscored: a customisation
// point, not API for callers). Should a later standard library build the array another way (by iterating
// the collection, say), the filler would not have run: ``Swift/Array/init(count:filledBy:)`` checks that
// it did and otherwise builds the array again through `init(unsafeUninitializedCapacity:)`, so the bytes
// are the filler's whatever the library does; only the speed would be lost.

/// Writes the bytes of an array being built by ``Swift/Array/init(count:filledBy:)``.
protocol ByteFiller {
    /// Initialises every byte of `buffer`, exactly once per call. Whatever fails is kept in `self` for the
    /// caller to read afterwards (the array is then discarded), and the buffer must still be written
    /// whole (zeros will do): the array is built with all its bytes counted as initialised.
    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer)
}

/// `count` bytes written by the filler at `filler`, as a collection the standard library copies into a
/// new array in one `_copyContents` call.
struct FilledBytes<Filler: ByteFiller>: Collection {
    // Invariant: `filler` and `ran` point at the caller's variables (``Swift/Array/init(count:filledBy:)``),
    // which outlive this value: it exists only inside that initialiser's `withUnsafeMutablePointer` calls.
    private let filler: UnsafeMutablePointer<Filler>
    private let ran: UnsafeMutablePointer<Bool>
    let count: Int

    init(count: Int, filler: UnsafeMutablePointer<Filler>, ran: UnsafeMutablePointer<Bool>) {
        self.count = count
        self.filler = filler
        self.ran = ran
    }

    var startIndex: Int { 0 }
    var endIndex: Int { count }
    func index(after i: Int) -> Int { i + 1 }
    /// Never the filler's bytes: only `_copyContents` produces those (see the top of this file).
    subscript(position: Int) -> UInt8 { 0 }

    func _copyContents(initializing buffer: UnsafeMutableBufferPointer<UInt8>) -> (IndexingIterator<Self>, Int) {
        // The standard library passes the new array's storage, `count` bytes (it asked for `count`). Any
        // other buffer is zeroed, and `ran` stays false: the caller then builds the array again.
        if buffer.count == count {
            filler.pointee.fill(UnsafeMutableRawBufferPointer(buffer))
            ran.pointee = true
        } else if let base = buffer.baseAddress {
            base.initialize(repeating: 0, count: buffer.count)
        }
        return (IndexingIterator(_elements: self, _position: count), buffer.count)
    }
}

extension Array where Element == UInt8 {
    /// An array of `count` bytes, written once by `filler` (which keeps any failure for the caller to
    /// read). About 350 instructions cheaper per array than `init(unsafeUninitializedCapacity:)` on
    /// Swift 6.3 / Linux (see the top of this file).
    @inline(__always)
    init<Filler: ByteFiller>(count: Int, filledBy filler: inout Filler) {
        if count <= 0 {
            // Not through either initialiser: with a zero capacity `init(unsafeUninitializedCapacity:)`
            // writes into the shared empty-array storage (a benign race Thread Sanitizer reports).
            filler.fill(UnsafeMutableRawBufferPointer(start: nil, count: 0))
            self = []
            return
        }
        var ran = false
        let built = withUnsafeMutablePointer(to: &filler) { filler in
            withUnsafeMutablePointer(to: &ran) { ran in [UInt8](FilledBytes(count: count, filler: filler, ran: ran)) }
        }
        if ran {
            self = built
            return
        }
        self.init(unsafeUninitializedCapacity: count) { buffer, initialized in
            filler.fill(UnsafeMutableRawBufferPointer(buffer))
            initialized = count
        }
    }
}
