import Glibc

/// Tells Thread Sanitizer, when it is there, that a reply handed to a caller through a continuation was
/// published before the caller reads it.
///
/// The event loop resumes a caller's continuation with the reply (bytes it allocated and wrote); the caller
/// reads them on another thread. The concurrency runtime orders the two, but with atomics TSan does not see
/// on one path (a continuation resumed before its task has suspended: swiftlang/swift#57803), so `make
/// tsan` reported the reply's bytes as a race, now and then. The handler calls ``published()`` before it
/// resumes anyone, the connection calls ``received()`` after its await returns: TSan's own release and
/// acquire on one address, looked up at run time. Without TSan in the process both are a nil check.
/// The node pool does the same for the connection it hands to callers that waited for one (seen: a
/// connection's fields, written by the connecting task, reported as a race with the waiter's first send),
/// and the I/O threads for the results they hand to async callers (seen: a remote write's fields, made on
/// an I/O thread, reported as a race with the caller's read of them).
package enum ThreadSanitizerHandOff {
    private typealias Annotation = @convention(c) (UnsafeMutableRawPointer?) -> Void

    // Invariant: dlsym's result, when not nil, is TSan's `void __tsan_release(void *)` /
    // `void __tsan_acquire(void *)`, whose C signature the bit cast matches; RTLD_DEFAULT is the null handle
    // on glibc. The address passed is only a name for TSan's clock: it is never dereferenced.
    private static let release: Annotation? = lookup("__tsan_release")
    private static let acquire: Annotation? = lookup("__tsan_acquire")
    /// One byte allocated for the process's life, kept as its address (a plain integer).
    private static let address = UInt(bitPattern: UnsafeMutableRawPointer.allocate(byteCount: 1, alignment: 1))

    private static func lookup(_ name: String) -> Annotation? {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else { return nil }
        return unsafeBitCast(symbol, to: Annotation.self)
    }

    /// Before a continuation is resumed with what this thread wrote.
    @inline(__always)
    package static func published() {
        if let release { release(UnsafeMutableRawPointer(bitPattern: address)) }
    }

    /// After an await whose continuation another thread resumed.
    @inline(__always)
    package static func received() {
        if let acquire { acquire(UnsafeMutableRawPointer(bitPattern: address)) }
    }
}
