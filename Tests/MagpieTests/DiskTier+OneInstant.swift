import MagpieTestSupport

@testable import Magpie

extension DiskTier {
    /// Runs `body` holding every bucket's lock, so that what it reads of the bucket files is one instant of
    /// them. The tier changes a bucket's file only under that bucket's lock — but for a seal's deferred write,
    /// whose `pwrite` runs without it: each bucket's deferred write is settled (its write waited for) as its
    /// lock is taken, and no new one starts without the lock (Bucket+RecordWrite.swift). The tier never holds
    /// two bucket locks (BucketSet.swift), so taking them all in order cannot deadlock with it. (Without
    /// settling, a copy racing a deferred write's `pwrite` can take a page from before the write and the next one from after
    /// it, which no crash leaves — a kill cuts a `pwrite` short, a prefix of it written: seen once in 12
    /// churn seeds, a crash image whose recovery counted a record corrupt.) Without the locks, a reader
    /// racing the sealer thread sees each file at a different moment: it can count a lender's file before
    /// the lender gave up room and the borrower's after it grew into that room (seen: 4.58 MB counted in a
    /// 4 MiB tier whose files, read holding the locks, never passed 4.12 MB), or copy an older and a newer
    /// part of one file, which no crash leaves.
    func holdingEveryBucket<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        func holding(from index: Int) throws(E) -> R {
            guard index < buckets.count else { return try body() }
            return try buckets[index].withLock { (state: inout BucketState) throws(E) -> R in
                state.settleDeferredWrite()
                return try holding(from: index + 1)
            }
        }
        return try holding(from: 0)
    }

    /// The bytes of the regular files under `path` (this tier's directory, or a part of it), read at one
    /// instant of the tier (`holdingEveryBucket`): what a budget check of a tier still writing must count.
    func directoryBytes(_ path: String) -> Int {
        holdingEveryBucket { MagpieTestSupport.directoryBytes(path) }
    }
}
