// The index snapshot's encoding and its checks (its layout is described in OnDiskFormat.swift).

/// An index snapshot (layout in OnDiskFormat.swift): a bucket's index and regions, and what they were taken against.
/// (Package-visible for the fuzz target over its decoding, Fuzz/MagpieFuzzTargets.)
package struct IndexSnapshot: Equatable {
    static let magic: UInt32 = 0x4950_474D  // "MGPI"
    static let headerSize = 96
    /// 3: format 2's regions.
    static let version: UInt32 = 3
    static let regionEntrySize = 32

    var bucketIndex: Int
    var bucketCount: Int
    var seed: UInt64
    package var fileSize: Int
    var liveBytes: Int
    var maximumSequence: UInt64
    package var regionSize: Int
    package var slotCount: Int
    var nextRegionSequence: UInt64
    var regions: [Region]
    var slots: [DiskSlot]
    var liveCount: Int

    /// Its regions: first slot, slots, bytes used.
    package var regionSpans: [(slot: Int, slots: Int, end: Int)] { regions.map { ($0.slot, $0.slots, $0.end) } }
    /// Its live index slots: file offset and length of the record each points at.
    package var liveRecords: [(offset: Int, length: Int)] { slots.filter { !$0.isEmpty }.map { ($0.offset, $0.length) } }

    /// The encoded length of a snapshot of `slotCount` index slots and `regionCount` regions.
    static func length(slotCount: Int, regionCount: Int) -> Int {
        headerSize + regionCount * regionEntrySize + slotCount * 16 + 8
    }

    package func encoded() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.length(slotCount: slots.count, regionCount: regions.count))
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Self.version.littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketIndex).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: UInt32(bucketCount).littleEndian, toByteOffset: 12, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: UInt64(fileSize).littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: UInt64(liveBytes).littleEndian, toByteOffset: 32, as: UInt64.self)
            raw.storeBytes(of: maximumSequence.littleEndian, toByteOffset: 40, as: UInt64.self)
            raw.storeBytes(of: UInt64(slots.count).littleEndian, toByteOffset: 48, as: UInt64.self)
            raw.storeBytes(of: UInt64(liveCount).littleEndian, toByteOffset: 56, as: UInt64.self)
            raw.storeBytes(of: UInt32(regionSize).littleEndian, toByteOffset: 64, as: UInt32.self)
            raw.storeBytes(of: UInt32(slotCount).littleEndian, toByteOffset: 68, as: UInt32.self)
            raw.storeBytes(of: UInt32(regions.count).littleEndian, toByteOffset: 72, as: UInt32.self)
            raw.storeBytes(of: nextRegionSequence.littleEndian, toByteOffset: 80, as: UInt64.self)
            for (n, region) in regions.enumerated() {
                let at = Self.headerSize + n * Self.regionEntrySize
                raw.storeBytes(of: UInt32(region.slot).littleEndian, toByteOffset: at, as: UInt32.self)
                raw.storeBytes(of: UInt32(region.slots).littleEndian, toByteOffset: at + 4, as: UInt32.self)
                raw.storeBytes(of: region.sequence.littleEndian, toByteOffset: at + 8, as: UInt64.self)
                raw.storeBytes(of: region.firstRecordSequence.littleEndian, toByteOffset: at + 16, as: UInt64.self)
                raw.storeBytes(of: UInt32(region.end).littleEndian, toByteOffset: at + 24, as: UInt32.self)
            }
            let slotsStart = Self.headerSize + regions.count * Self.regionEntrySize
            for (n, slot) in slots.enumerated() {
                let at = slotsStart + n * 16
                raw.storeBytes(of: slot.tag.littleEndian, toByteOffset: at, as: UInt32.self)
                raw.storeBytes(of: slot.offset8.littleEndian, toByteOffset: at + 4, as: UInt32.self)
                raw.storeBytes(of: slot.rawLength.littleEndian, toByteOffset: at + 8, as: UInt32.self)
                raw.storeBytes(of: slot.expiry.littleEndian, toByteOffset: at + 12, as: UInt32.self)
            }
            let end = raw.count - 8
            let sum = KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: end, as: UInt64.self)
        }
        return bytes
    }

    /// Nil unless the bytes are an intact snapshot whose counts agree with its contents: regions inside
    /// the file's slots, not overlapping, in increasing sequence; every live slot a record's length long
    /// inside the used part of one region.
    package static func decode(_ bytes: [UInt8]) -> IndexSnapshot? {
        bytes.withUnsafeBytes { raw -> IndexSnapshot? in
            guard raw.count >= headerSize + 8 else { return nil }
            func u32(_ at: Int) -> UInt32 { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)) }
            func u64(_ at: Int) -> UInt64 { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)) }
            let end = raw.count - 8
            // Counts are read with a bound before any conversion: a hostile snapshot with a valid checksum
            // must not make `Int(_:)` trap.
            guard u64(end) == KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: raw[0..<end])),
                u32(0) == magic, u32(4) == version, u64(24) <= UInt64(DiskTier.maximumBucketBudget),
                u32(76) == 0, u64(88) == 0, u64(48) >= 1, u64(48) <= UInt64(end), u32(72) <= UInt32(end),
                // (An index always has an empty slot: a full one would make a probe for a missing key endless.)
                RegionHeader.isValidRegionSize(Int(u32(64))), u64(56) < u64(48), u64(32) <= u64(24)
            else { return nil }
            let regionCount = Int(u32(72))
            let slotCount = Int(u64(48))
            guard headerSize + regionCount * regionEntrySize + slotCount * 16 == end else { return nil }
            let regionSize = Int(u32(64))
            let fileSlots = Int(u32(68))
            let fileSize = Int(u64(24))
            // No more slots than a bucket's largest file holds (a hostile count would size the free-slot
            // table, and the bucket's charge, by it).
            guard fileSlots <= DiskTier.maximumBucketBudget / regionSize, fileSize >= BucketFileHeader.size,
                fileSize <= BucketFileHeader.size + fileSlots * regionSize
            else { return nil }
            var regions: [Region] = []
            regions.reserveCapacity(regionCount)
            var previous: UInt64 = 0
            for n in 0..<regionCount {
                let at = headerSize + n * regionEntrySize
                let first = Int(u32(at))
                let count = Int(u32(at + 4))
                let sequence = u64(at + 8)
                let bytesUsed = Int(u32(at + 24))
                guard count >= 1, first < fileSlots, count <= fileSlots - first, sequence > previous || n == 0,
                    bytesUsed >= RegionHeader.size, bytesUsed <= count * regionSize, bytesUsed % 8 == 0, u32(at + 28) == 0
                else { return nil }
                previous = sequence
                regions.append(
                    Region(slot: first, slots: count, sequence: sequence, firstRecordSequence: u64(at + 16), end: bytesUsed))
            }
            guard regionCount == 0 || u64(80) > previous else { return nil }
            // The regions by first slot, to check that none overlaps another and to find each index slot's
            // region (a binary search: nothing is allocated per slot of the file, however large it claims to be).
            let bySlot = regions.indices.sorted { regions[$0].slot < regions[$1].slot }
            for (a, b) in zip(bySlot, bySlot.dropFirst()) where regions[a].slot + regions[a].slots > regions[b].slot {
                return nil
            }
            func region(containing slotIndex: Int) -> Region? {
                var (low, high) = (0, bySlot.count)
                while low < high {
                    let middle = (low + high) / 2
                    if regions[bySlot[middle]].slot <= slotIndex { low = middle + 1 } else { high = middle }
                }
                guard low > 0 else { return nil }
                let candidate = regions[bySlot[low - 1]]
                return slotIndex < candidate.slot + candidate.slots ? candidate : nil
            }
            let slotsStart = headerSize + regionCount * regionEntrySize
            var slots = [DiskSlot](repeating: .empty, count: slotCount)
            var live = 0
            var liveBytes = 0
            for n in 0..<slotCount {
                let at = slotsStart + n * 16
                let slot = DiskSlot(tag: u32(at), offset8: u32(at + 4), rawLength: u32(at + 8), expiry: u32(at + 12))
                if slot.isEmpty { continue }
                // Every slot must point at something a record's length long inside the used part of a
                // region (its credits may say anything); the rest is checked on each read.
                guard !slot.isPending, slot.length >= RecordHeader.size, slot.offset >= BucketFileHeader.size + RegionHeader.size
                else { return nil }
                guard let region = region(containing: (slot.offset - BucketFileHeader.size) / regionSize) else { return nil }
                let start = BucketFileHeader.size + region.slot * regionSize
                guard slot.offset >= start + RegionHeader.size, slot.offset + slot.length <= start + region.end else { return nil }
                slots[n] = slot
                live += 1
                liveBytes += slot.length
            }
            guard live == Int(u64(56)), liveBytes == Int(u64(32)) else { return nil }
            return IndexSnapshot(
                bucketIndex: Int(u32(8)), bucketCount: Int(u32(12)), seed: u64(16), fileSize: fileSize,
                liveBytes: liveBytes, maximumSequence: u64(40), regionSize: regionSize, slotCount: fileSlots,
                nextRegionSequence: u64(80), regions: regions, slots: slots, liveCount: live)
        }
    }
}
