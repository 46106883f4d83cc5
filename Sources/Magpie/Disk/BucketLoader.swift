import Foundation
import Synchronization

// MARK: - Opening in constant time: bucket indexes load after the open
//
// `DiskTier.init` opens the bucket files and nothing more, so that it takes the same time whatever the
// directory holds. A bucket's index (from the snapshot a clean close left, or by scanning its file) is
// loaded under the bucket's lock by the first operation that needs it (`BucketState.loadIfNeeded`), and
// meanwhile by one background thread that loads every bucket in turn. An operation on a bucket not yet
// loaded waits for that one bucket only; `statistics` waits for all of them.
//
// Crash safety is unchanged: a bucket's snapshot is deleted when it is loaded, before the bucket's first
// write (as it was deleted at the open before), so a crash after that scans the file; a bucket never
// loaded keeps its file and its snapshot exactly as the last close left them, which is what the next
// open then finds. `close()` writes snapshots for loaded buckets only.

/// The thread that loads every bucket's index after the open, until all are loaded or the tier closes.
final class BucketLoader: Sendable {
    private let stopped = Atomic<Bool>(false)
    private let finished = Atomic<Bool>(false)

    /// Starts loading `buckets` in order on a thread of its own (with `start`; otherwise only their first
    /// use loads them).
    init(_ buckets: [Locked<BucketState>], start: Bool) {
        guard start else {
            finished.store(true, ordering: .relaxed)
            return
        }
        let thread = Thread { [self] in
            IOThreadPool.nameCurrentThread("magpie-io-loader")
            for bucket in buckets {
                if stopped.load(ordering: .relaxed) { break }
                // A failure leaves the bucket unloaded: its first operation tries again and throws.
                bucket.withLock { (state: inout BucketState) in try? state.loadIfNeeded() }
            }
            finished.store(true, ordering: .releasing)
        }
        thread.name = "magpie-io-loader"
        thread.start()
    }

    /// Asks the thread to stop after the bucket it is loading.
    func stop() { stopped.store(true, ordering: .relaxed) }

    /// Whether the thread has gone through every bucket (or stopped).
    var isFinished: Bool { finished.load(ordering: .acquiring) }
}
