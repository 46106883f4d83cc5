import Foundation
import Synchronization

// MARK: - Opening in constant time: bucket indexes load after the open
//
// `DiskTier.init` reads no index, and after a clean close opens no bucket file either (SIZES gives
// their sizes: see DiskTier.swift, "Reopening"), so that it takes the same time whatever the directory
// holds. A bucket's file is opened and its index loaded (from the snapshot a clean close left, or by
// scanning its file) under the bucket's lock by the first operation that needs it
// (`BucketState.loadIfNeeded`), and meanwhile by one background thread that loads every bucket in
// turn. An operation on a bucket not yet loaded waits for that one bucket only; `statistics` waits for
// all of them.
//
// Crash safety: a snapshot is deleted before its bucket file first changes (and by this thread once it
// has loaded the bucket: Bucket+Snapshot.swift), and SIZES before any bucket file first changes, so a
// crash after a change scans that bucket's file and measures every file at the open; a bucket not
// written keeps its file and (unless this thread deleted it) its snapshot as the last close left them,
// which is what the next open then finds. (SIZES may then still name a snapshot this thread deleted:
// an over-charge until that bucket's load, never an under-charge.) `close()` stops this thread and waits
// for it before it writes anything; it writes snapshots for loaded buckets only.

/// The thread that loads every bucket's index after the open, until all are loaded or the tier closes.
/// (Not the loader API's: that one fills a cache from the caller's source, Loading/.)
final class IndexLoader: Sendable {
    private let stopped = Atomic<Bool>(false)
    private let finished = Atomic<Bool>(false)
    /// Entered while the thread runs: ``waitUntilFinished()`` waits on it (no polling).
    private let running = DispatchGroup()

    /// What the thread does after loading every bucket, unless stopped: remove the strays of `buckets/`
    /// that an open which read SIZES did not list (DiskTier.swift, "Reopening"), holding the compaction
    /// lock, so that no compaction's temporary file is taken for one (`close()` takes that lock after
    /// stopping the thread, before it writes anything in `buckets/`).
    struct Strays: Sendable {
        let directory: CacheDirectory
        let bucketCount: Int
        let lock: Locked<UInt64>
    }

    /// Starts loading `buckets` in order on a thread of its own (with `start`; otherwise only their first
    /// use loads them), then removes `strays` if given.
    init(_ buckets: [Locked<BucketState>], start: Bool, strays: Strays? = nil) {
        guard start else {
            finished.store(true, ordering: .relaxed)
            return
        }
        running.enter()
        let thread = Thread { [self] in
            defer { running.leave() }
            IOThreadPool.nameCurrentThread("magpie-io-loader")
            for bucket in buckets {
                if stopped.load(ordering: .relaxed) { break }
                // A failure leaves the bucket unloaded: its first operation tries again and throws.
                bucket.withLock { (state: inout BucketState) in
                    guard state.isOpen else { return }  // closed meanwhile: its files are the close's now
                    try? state.loadIfNeeded()
                    // The snapshot a get loaded the bucket from is deleted here, off the caller's path (a
                    // failure leaves it to the bucket's next write, which must delete it first).
                    try? state.retireSnapshot()
                }
            }
            if let strays, !stopped.load(ordering: .relaxed) {
                strays.lock.withLock { _ in
                    guard !stopped.load(ordering: .relaxed) else { return }
                    // Best effort: a stray that cannot be removed now is tried again by the next close.
                    try? DiskTier.removeStrays(in: strays.directory, count: strays.bucketCount, keepingSizes: true)
                }
            }
            finished.store(true, ordering: .releasing)
        }
        thread.name = "magpie-io-loader"
        thread.start()
    }

    /// Asks the thread to stop after the bucket it is loading.
    func stop() { stopped.store(true, ordering: .relaxed) }

    /// Whether the thread has gone through every bucket and the strays (or stopped).
    var isFinished: Bool { finished.load(ordering: .acquiring) }

    /// Waits until the thread has finished (see ``isFinished``).
    func waitUntilFinished() {
        running.wait()
    }
}
