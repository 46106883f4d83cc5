import Glibc

/// A pool of zstd compression contexts shared by many threads: a caller takes a context, uses it outside
/// any lock, and gives it back. The pool holds at most as many contexts as were ever in use at once.
/// Decompression uses the calling thread's own context instead (``ThreadDecompressors``): it runs on every
/// disk read of a compressed value, compression only when a memtable is written.
final class ZstdPool: Sendable {
    /// A context in a box, so the pool can hold `~Copyable` contexts in an array.
    private final class CompressorBox {
        let compressor: ZstdCompressor
        init(_ compressor: consuming ZstdCompressor) { self.compressor = compressor }
    }

    private struct Free {
        var compressors: [CompressorBox] = []
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

    /// Decompresses one frame into exactly `originalLength` bytes, with the calling thread's context
    /// (``ThreadDecompressors``: no lock, no pool, for every disk read of a compressed value).
    func decompress(_ source: UnsafeRawBufferPointer, originalLength: Int) throws(MagpieError) -> [UInt8] {
        var failure: MagpieError? = nil
        let output = try ThreadDecompressors.withDecompressor { context in
            var frame = Decompression(source: source, context: context)
            let output = [UInt8](count: originalLength, filledBy: &frame)
            failure = frame.failure
            return output
        }
        if let failure { throw failure }
        return output
    }
}

/// Decompresses a frame into the array being built (``Swift/Array/init(count:filledBy:)``).
private struct Decompression: ByteFiller {
    let source: UnsafeRawBufferPointer
    // Invariant: the calling thread's context box, kept alive by the thread's slot for the whole of
    // `ThreadDecompressors.withDecompressor`, the only place a `Decompression` exists; unowned(unsafe), so
    // that building the filler costs no reference counting.
    unowned(unsafe) let context: ThreadDecompressors.Box
    var failure: MagpieError? = nil

    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        do throws(MagpieError) {
            // Fills the whole buffer or throws (an empty one too: an empty frame still has to parse).
            try context.decompressor.decompress(source, into: buffer)
        } catch {
            failure = error
            if !buffer.isEmpty { buffer.initializeMemory(as: UInt8.self, repeating: 0) }
        }
    }
}

/// The zstd decompression contexts of the process, one per thread that reads compressed values (see
/// ``ThreadContexts``). A read then takes no lock and touches no shared state: a pool of contexts took two
/// lock round trips and an array's pop and push per read. A context carries nothing from one frame to
/// the next (`ZSTD_decompressDCtx` starts each frame afresh, after a failure too) and is not configured,
/// so one serves every tier of the process.
///
/// What it costs: one context (about 100 KiB: libzstd's tables and literal buffer) per thread that ever
/// decompressed and still runs, where the pool held one per read in flight; a thread that ends hands its
/// context on (up to ``ThreadContexts/spareLimit`` wait for new threads).
enum ThreadDecompressors {
    /// A context in a box, so that a thread's slot and the spares can hold it.
    final class Box {
        let decompressor: ZstdDecompressor
        init(_ decompressor: consuming ZstdDecompressor) { self.decompressor = decompressor }
    }

    static let contexts = ThreadContexts<Box>(spareLimit: 8) { () throws(MagpieError) in Box(try ZstdDecompressor()) }

    /// Runs `body` with this thread's context (created, or taken from a thread that ended, on the
    /// thread's first call).
    @inline(__always)
    static func withDecompressor<R>(_ body: (Box) -> R) throws(MagpieError) -> R {
        try contexts.withContext(body)
    }
}

/// One context object per thread, for work that needs an expensive, single-owner context (a zstd
/// context) on every call: the thread's own, reached through a `pthread_key_t`, with no lock. A thread
/// that ends gives its context back (its key's destructor), where the next thread to need one takes it, so
/// that threads that come and go do not build a context each; beyond ``spareLimit`` waiting contexts, an
/// ending thread's is dropped.
final class ThreadContexts<Context: AnyObject>: Sendable {
    // Invariant: a thread's value under `key` is nil or a `ThreadSlot` retained once (`passRetained`),
    // owned by that thread alone: only it reads the slot (`withContext`, never re-entered with the same
    // instance while its body runs), and the key's destructor, at the thread's exit, takes the retain
    // over and gives the context back to its owner. So one thread at a time uses a context (which need
    // not be `Sendable`): it moves between threads only through `spare`, under its lock, after the
    // thread that used it has ended.
    private let key: pthread_key_t
    private let spare = Locked<[Context]>([])
    private let make: @Sendable () throws(MagpieError) -> Context

    /// How many contexts of threads that ended are kept for new threads.
    let spareLimit: Int

    /// - Parameters:
    ///   - spareLimit: how many contexts of threads that ended to keep for new threads.
    ///   - make: builds a context, on a thread's first call when no spare one waits.
    /// A process has a limited number of thread keys (`PTHREAD_KEYS_MAX`, 1,024 on Linux) and this type
    /// never frees its own: make few instances, for the process's life (tests make a few more).
    init(spareLimit: Int, make: @escaping @Sendable () throws(MagpieError) -> Context) {
        var key = pthread_key_t()
        // Fails only past PTHREAD_KEYS_MAX: the key is then unusable, and `withContext` builds a context
        // per call (correct, slower).
        if pthread_key_create(&key, { slot in
            guard let slot else { return }
            Unmanaged<ThreadSlot>.fromOpaque(slot).takeRetainedValue().threadEnded()
        }) != 0 {
            key = pthread_key_t.max
        }
        self.key = key
        self.spareLimit = spareLimit
        self.make = make
    }

    /// Runs `body` with the calling thread's context.
    /// - Throws: what `make` throws, when the thread has no context yet and none is spare.
    @inline(__always)
    func withContext<R>(_ body: (Context) -> R) throws(MagpieError) -> R {
        if key != pthread_key_t.max, let slot = pthread_getspecific(key) {
            return Unmanaged<ThreadSlot>.fromOpaque(slot)._withUnsafeGuaranteedRef { slot in
                // The slot was made by this instance's `withNewContext` (a key has one owner).
                body(unsafeDowncast(slot, to: Slot.self).context)
            }
        }
        return try withNewContext(body)
    }

    @inline(never)
    private func withNewContext<R>(_ body: (Context) -> R) throws(MagpieError) -> R {
        let context: Context
        if let reused = spare.withLock({ $0.popLast() }) {
            context = reused
        } else {
            context = try make()
        }
        // A thread that cannot keep it (setspecific fails only when memory runs out) still runs `body`.
        if key != pthread_key_t.max {
            let slot = Unmanaged.passRetained(Slot(context, owner: self) as ThreadSlot)
            if pthread_setspecific(key, slot.toOpaque()) != 0 { slot.release() }
        }
        return body(context)
    }

    /// How many contexts of ended threads wait for new threads now.
    var spareCount: Int { spare.withLock { $0.count } }

    fileprivate func giveBack(_ context: Context) {
        spare.withLock { spare in
            if spare.count < spareLimit { spare.append(context) }
        }
    }

    /// A thread's context, with the instance it came from (a key's destructor, a C function, cannot
    /// capture the generic instance: the slot carries it).
    private final class Slot: ThreadSlot {
        let context: Context
        let owner: ThreadContexts<Context>
        init(_ context: Context, owner: ThreadContexts<Context>) {
            self.context = context
            self.owner = owner
        }
        override func threadEnded() { owner.giveBack(context) }
    }
}

/// What a thread key's destructor sees of a ``ThreadContexts`` slot: not generic, so that a C function
/// pointer can name it.
class ThreadSlot {
    func threadEnded() {}
}
