// MARK: - Index snapshots: fast reopen after a clean close
//
// `close()` writes each bucket's index to `buckets/<name>.index` (format in Format/OnDiskFormat.swift).
// Opening uses a snapshot only if it is intact, names this bucket, count and seed, and the bucket
// file still has the size it records; then it is deleted before anything else happens to the bucket
// (it is loaded at its first use, or by the loader thread: BucketLoader.swift), so a crash later can
// never bring back an index older than the file. Even a snapshot that passes these checks
// is not trusted with data: every read still verifies the record's checksum, key and liveness.

extension BucketState {
    var snapshotName: String { context.name + ".index" }

    /// The bytes of this bucket's snapshot now.
    var snapshotLength: Int { IndexSnapshot.length(slotCount: index.slots.count) }

    /// The bytes a bucket not loaded holds in the directory: its file and the snapshot it may have.
    var unloadedBytes: Int {
        let file = (try? FileIO.size(fd, path: context.path)) ?? 0
        return file + context.directory.size(.buckets, snapshotName)
    }

    /// Writes the index snapshot (after a flush, on close). Best effort: a failure only means the
    /// next open scans the file.
    func writeSnapshot() {
        guard buffer.isEmpty else { return }  // only an index of records that are all in the file
        let snapshot = IndexSnapshot(
            bucketIndex: context.number, bucketCount: context.bucketCount, seed: context.hasher.seed, fileSize: size,
            liveBytes: liveBytes, maximumSequence: maximumSequence, slots: index.slots, liveCount: index.count)
        _ = try? context.directory.writeAtomically(.buckets, snapshotName, snapshot.encoded())
    }

    /// Loads and deletes the snapshot if it fits the bucket file of `fileSize` bytes. True if loaded.
    mutating func loadSnapshot(fileSize: Int) -> Bool {
        guard let bytes = try? context.directory.readFile(.buckets, snapshotName) else {
            try? context.directory.unlink(.buckets, snapshotName)  // a link or not ours: never read later
            return false
        }
        defer { try? context.directory.unlink(.buckets, snapshotName) }
        guard let snapshot = IndexSnapshot.decode(bytes), snapshot.bucketIndex == context.number,
            snapshot.bucketCount == context.bucketCount, snapshot.seed == context.hasher.seed, snapshot.fileSize == fileSize
        else { return false }
        index = BucketIndex(slots: snapshot.slots, count: snapshot.liveCount)
        liveBytes = snapshot.liveBytes
        maximumSequence = snapshot.maximumSequence
        written = fileSize
        return true
    }
}
