// MARK: - Huge pages for bucket files: growing a file in whole 2 MiB ranges
//
// Why. A get copies its record out of the file's mapping (FileMapping.swift). A mapping of a file the
// page cache holds in 4 KiB folios is mapped by 4 KiB pages, and a random read over a file larger than
// the TLB's reach misses the TLB: a page walk, two-dimensional in a VM. A range the page cache holds as
// one 2 MiB folio is mapped by one 2 MiB page wherever the mapping is 2 MiB-aligned (Linux aligns file
// mappings of 2 MiB or more). The kernel makes a folio the size of the write that creates it: the
// sealer's 64 KiB `pwrite`s make 64 KiB folios. A hole read through a `MADV_HUGEPAGE` mapping becomes one
// 2 MiB folio of zeros, and `pwrite`s into it keep it (docs/lab-notes/disk.md: huge pages for bucket files).
//
// What. When `grow` (Bucket+Regions.swift) adds slots that end in a 2 MiB range at or after the one the
// file's end lies in (for a file that holds only its header, the first range too), and the slots needed
// to complete that range fit within the bucket's limit, it adds them, as free slots; the file is then
// extended to its new size (`ftruncate`: a hole, no block allocated) and each such range wholly inside
// the file is populated as one folio (`FileMapping.populateHugePage`). Slots start 64 bytes (the file
// header) past a 2 MiB boundary, so a range's first bytes are the previous slot's tail: a hole until
// that slot's region fills to its very end, and the kernel falls back to small folios for a range
// part of which it already caches. A file holding only its header is emptied first (its header's
// 4 KiB folio would otherwise keep the first range small) and the header rewritten after.
//
// Invariants kept: the file's size is at most the bucket's `size` (header + slots; the snapshot's check
// and the budget's charge both rest on it); every added slot is free (zeros: no region header), so
// recovery and snapshots see free slots, as after a reclaim. The ranges' unused bytes are holes: `du`
// counts only what was written.
//
// Failures. Every step is an optimisation but one: a file emptied to rewrite its header must get the
// header back. If extending fails, nothing changed (the slots are counted as before: the file grows as
// they are written); if populating fails, the range is cached in small pages. A crash between the
// emptying and the header's write leaves an empty file, or one of zeros only, which recovery reads as
// a new file (Bucket+Recovery.swift), and nothing is lost: the file held no region.

extension BucketState {
    private static var hugePage: Int { FileMapping.hugePageSize }

    /// Slots to add beyond `adding` (which take the file from `size`) so that the file's new end completes
    /// the 2 MiB range the new slots end in, when that range is one the file has never held and it fits
    /// within the limit (0 when the new end is that range's end already); nil when no range is to be
    /// populated.
    func hugePageSlots(adding: Int) -> Int? {
        guard context.hugePages, adding > 0, layout.mapping != nil else { return nil }
        let page = Self.hugePage
        let newEnd = layout.size + adding * layout.regionSize
        let end = (newEnd + page - 1) / page * page
        guard end - page >= firstFreshRange else { return nil }
        let extra = (end - newEnd + layout.regionSize - 1) / layout.regionSize
        guard newEnd + extra * layout.regionSize <= min(layout.limit, context.ledger.maximumLimit) else { return nil }
        return extra
    }

    /// The first 2 MiB range a growth may populate: the one the file's end lies in (whose first bytes are
    /// then the last slot's tail, a hole until that slot's region is full), or 0 for a file of its header
    /// alone (emptied before its first range is populated). Populating a range part of which the page
    /// cache already holds is harmless: the kernel then reads the rest in small folios.
    private var firstFreshRange: Int {
        layout.slotCount == 0 ? 0 : layout.size / Self.hugePage * Self.hugePage
    }

    /// After `grow` counted slots from `oldSize` to `size`: extends the file to `size` and populates every
    /// 2 MiB range wholly inside the new slots that the file has never held. `wasEmpty`: the file held only
    /// its header (then emptied first, and the header written back).
    mutating func populateHugePages(from oldSize: Int, wasEmpty: Bool) throws(MagpieError) {
        guard context.hugePages, layout.mapping != nil else { return }
        let page = Self.hugePage
        let first = wasEmpty ? 0 : oldSize / page * page
        guard first + page <= layout.size else { return }
        guard let length = try? FileIO.size(layout.fd, path: context.path), length <= layout.size else { return }
        if wasEmpty {
            // Not the file this bucket thinks it is (longer than its header): left alone.
            guard length == BucketFileHeader.size else { return }
            try beforeFileChange()
            // From the emptying until the header is back, the file has none: should its write fail, the next
            // change of the file writes it first (`beforeFileChange`), and a crash meanwhile leaves a file of
            // zeros, which holds no region (the file held none), read as a new file.
            life.headerMissing = true
            do throws(MagpieError) {
                try FileIO.truncate(layout.fd, to: 0, path: context.path)
                try FileIO.truncate(layout.fd, to: layout.size, path: context.path)
                populate(from: first)
            } catch {
                // The file is empty or a hole: only its header is to go back.
            }
            try writeMissingHeader()
            return
        }
        guard (try? FileIO.truncate(layout.fd, to: layout.size, path: context.path)) != nil else { return }
        populate(from: first)
    }

    /// Writes the file's header back if emptying the file for its first range took it away
    /// (`headerMissing`).
    mutating func writeMissingHeader() throws(MagpieError) {
        guard life.headerMissing else { return }
        try FileIO.write(layout.fd, expectedHeader(regionSize: layout.regionSize).encoded(), at: 0, path: context.path)
        life.headerMissing = false
    }

    /// Populates each 2 MiB range from `first` that lies wholly within the file's `size`.
    private func populate(from first: Int) {
        var start = first
        while start + Self.hugePage <= layout.size {
            guard FileMapping.populateHugePage(layout.fd, at: start) else { return }
            start += Self.hugePage
        }
    }
}
