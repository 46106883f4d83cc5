import Glibc

// MARK: - Index snapshots: fast reopen after a clean close
//
// `close()` writes each bucket's index to `buckets/<name>.index`:
//   0  u32 magic "MGPI"   4 u32 snapshot version (2)   8 u32 bucket index   12 u32 bucket count
//   16 u64 hash seed      24 u64 bucket file size    32 u64 live bytes     40 u64 maximum sequence
//   48 u64 slot count (the index's capacity)         56 u64 live entries
//   64 slots, 16 bytes each (DiskSlot, little-endian fields)
//   end u64 XXH3-64 of everything before it
// Opening uses a snapshot only if it is intact, names this bucket, count and seed, and the bucket
// file still has the size it records; then it is deleted before anything else happens, so a crash
// later can never bring back an index older than the file. Even a snapshot that passes these checks
// is not trusted with data: every read still verifies the record's checksum, key and liveness.

extension BucketState {
    static let snapshotMagic: UInt32 = 0x4950_474D  // "MGPI"
    static let snapshotHeaderSize = 64
    /// 2: tags are the key hash's low 32 bits.
    static let snapshotVersion: UInt32 = 2

    var snapshotName: String { context.name + ".index" }

    /// The bytes of this bucket's snapshot now.
    var snapshotLength: Int { Self.snapshotHeaderSize + index.slots.count * 16 + 8 }

    /// Writes the index snapshot (after a flush, on close). Best effort: a failure only means the
    /// next open scans the file.
    func writeSnapshot() {
        guard pending.isEmpty else { return }  // only an index of records that are all in the file
        let slots = index.slots
        var bytes = [UInt8](repeating: 0, count: snapshotLength)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.snapshotMagic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.snapshotVersion.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(context.number).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(context.bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: context.hasher.seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: UInt64(size).littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: UInt64(liveBytes).littleEndian, toByteOffset: 32, as: UInt64.self)
            raw.storeBytes(of: maximumSequence.littleEndian, toByteOffset: 40, as: UInt64.self)
            raw.storeBytes(of: UInt64(slots.count).littleEndian, toByteOffset: 48, as: UInt64.self)
            raw.storeBytes(of: UInt64(index.count).littleEndian, toByteOffset: 56, as: UInt64.self)
            for (n, slot) in slots.enumerated() {
                let at = Self.snapshotHeaderSize + n * 16
                raw.storeBytes(of: slot.tag.littleEndian, toByteOffset: at, as: UInt32.self)
                raw.storeBytes(of: slot.offset8.littleEndian, toByteOffset: at + 4, as: UInt32.self)
                raw.storeBytes(of: slot.rawLength.littleEndian, toByteOffset: at + 8, as: UInt32.self)
                raw.storeBytes(of: slot.expiry.littleEndian, toByteOffset: at + 12, as: UInt32.self)
            }
            let end = raw.count - 8
            let sum = KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
        }
        _ = try? context.directory.writeAtomically(.buckets, snapshotName, bytes)
    }

    /// Loads and deletes the snapshot if it fits the bucket file of `fileSize` bytes. True if loaded.
    mutating func loadSnapshot(fileSize: Int) -> Bool {
        guard let bytes = try? context.directory.readFile(.buckets, snapshotName) else {
            try? context.directory.unlink(.buckets, snapshotName)  // a link or not ours: never read later
            return false
        }
        defer { try? context.directory.unlink(.buckets, snapshotName) }
        let loaded = bytes.withUnsafeBytes { raw -> (BucketIndex, Int, UInt64)? in
            guard raw.count >= Self.snapshotHeaderSize + 8 else { return nil }
            func u32(_ at: Int) -> UInt32 { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)) }
            func u64(_ at: Int) -> UInt64 { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)) }
            let end = raw.count - 8
            guard u64(end) == KeyHash(seed: 0).hash(UnsafeRawBufferPointer(rebasing: raw[0..<end])),
                u32(0) == Self.snapshotMagic, u32(4) == Self.snapshotVersion, Int(u32(8)) == context.number,
                Int(u32(12)) == context.bucketCount, u64(16) == context.hasher.seed, Int(u64(24)) == fileSize
            else { return nil }
            let slotCount = Int(u64(48))
            guard slotCount >= 1, Self.snapshotHeaderSize + slotCount * 16 == end
            else { return nil }
            var slots = [DiskSlot](repeating: .empty, count: slotCount)
            var live = 0
            var liveBytes = 0
            for n in 0..<slotCount {
                let at = Self.snapshotHeaderSize + n * 16
                let slot = DiskSlot(tag: u32(at), offset8: u32(at + 4), rawLength: u32(at + 8), expiry: u32(at + 12))
                if slot.isEmpty { continue }
                // Every slot must point inside the file; the rest is checked on each read.
                guard slot.offset >= BucketFileHeader.size, slot.offset + slot.length <= fileSize else { return nil }
                slots[n] = slot
                live += 1
                liveBytes += slot.length
            }
            guard live == Int(u64(56)), liveBytes == Int(u64(32)) else { return nil }
            return (BucketIndex(slots: slots, count: live), liveBytes, u64(40))
        }
        guard let (index, liveBytes, sequence) = loaded else { return false }
        self.index = index
        self.liveBytes = liveBytes
        self.maximumSequence = sequence
        self.written = fileSize
        return true
    }
}
