import CMagpieGuard
import Glibc

// MARK: - Reading bucket files through a mapping
//
// A page-cache-hot `pread` of a 4 KiB record costs about 1.3 µs on our 2-core machine, most of it the
// system call and the page-cache lookup; copying the same bytes out of a mapping of the file costs
// about 0.5–0.8 µs (docs/lab-notes/disk.md, #3). So each bucket file is mapped read-only, shared, once, and
// a record is copied from the mapping into an array of its own, where it is verified (checksum, key)
// and decoded (Bucket+Read.swift). Copying first, then verifying, means a check and a use always see
// the same bytes, even if another process scribbles on the file in between.
//
// A mapping spans the bucket's limit (at least its share, rounded up to pages); a file that grows past
// it is mapped anew, under the bucket's lock (Bucket+Regions.swift, `remapIfGrown`). Pages past the end of
// the file are mapped but never read: records are read only below the bucket's `size`. Mappings of 2 MiB
// or more start at a 2 MiB boundary (Linux aligns them on file systems with large folios), so that the file's 2 MiB folios, where the
// bucket made them (Bucket+HugePages.swift), are mapped by huge pages.
//
// The danger of mappings is SIGBUS: reading a page the file no longer has (truncated behind our back,
// by something that ignored the LOCK) or one the kernel cannot read (an I/O error). `magpie_guarded_copy`
// (CModules/CMagpieGuard) turns that signal into a failed copy; the read then falls back to `pread`,
// which reports the truth: an I/O error as `ioFailure`, a shrunken file as a short (corrupt) record.
// The guard installs a process-wide SIGBUS handler on the first mapping; signals that are not a guarded
// copy's go on to the handler installed before it. Embedders who would rather not have that set
// `DiskTier.Configuration.mappedReads = false`: every read is then a `pread`.

/// A read-only shared mapping of the first `length` bytes of a bucket file.
struct FileMapping {
    // Invariant: `base` is the start of a live mapping of `length` bytes, from `mmap` in `map` until
    // `unmap`; the bucket that owns it unmaps it exactly once, under its lock, and only reads through
    // it under the same lock.
    let base: UnsafeRawPointer
    let length: Int

    /// Maps `length` bytes of `fd` from offset 0, or nil when mapped reads are unavailable (the SIGBUS
    /// guard could not be installed, or `mmap` failed, say for lack of address space): the bucket then
    /// reads with `pread`, correctly, only slower.
    static func map(_ fd: Int32, length: Int) -> FileMapping? {
        guard length > 0, magpie_guard_install() == 0 else { return nil }
        let page = pageSize
        let rounded = (length + page - 1) / page * page
        guard let address = mmap(nil, rounded, PROT_READ, MAP_SHARED, fd, 0), address != MAP_FAILED else { return nil }
        return FileMapping(base: UnsafeRawPointer(address), length: rounded)
    }

    func unmap() {
        munmap(UnsafeMutableRawPointer(mutating: base), length)
    }

    /// Starts loading `count` bytes at file offset `offset` into the CPU's caches (clamped to the
    /// mapping; a hint that never faults: see `magpie_prefetch`).
    @inline(__always)
    func prefetch(at offset: Int, count: Int) {
        guard offset >= 0, offset < length, count > 0 else { return }
        magpie_prefetch(base + offset, min(count, length - offset))
    }

    /// The most pages ``isResident(at:count:)`` asks about (a record of up to 256 KiB); a longer range is
    /// reported as not resident.
    static let residencyPages = 64

    /// Whether every page of `count` bytes at file offset `offset` is in the page cache now (`mincore`), so
    /// that copying them cannot wait for the disk (barring the kernel evicting one in between, when the
    /// copy waits as any read would). False when the range is not inside the mapping, longer than
    /// ``residencyPages`` pages, or the call fails.
    func isResident(at offset: Int, count: Int) -> Bool {
        guard offset >= 0, count > 0, offset <= length, count <= length - offset else { return false }
        let page = Self.pageSize
        let first = offset / page * page
        let pages = (offset + count - first + page - 1) / page
        guard pages <= Self.residencyPages else { return false }
        // mincore reads whole pages of this mapping (`first` is page-aligned, and the mapping's length is a
        // whole number of pages, so the range stays inside it) and writes one byte per page into `vector`.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: Self.residencyPages) { vector in
            guard mincore(UnsafeMutableRawPointer(mutating: base + first), pages * page, vector.baseAddress) == 0 else { return false }
            for index in 0..<pages where vector[index] & 1 == 0 { return false }
            return true
        }
    }

    private static let pageSize = max(4096, Int(sysconf(Int32(_SC_PAGESIZE))))

    /// The size of a PMD-mapped ("huge") page on x86-64 and on arm64 with 4 KiB pages.
    static let hugePageSize = 2 << 20

    /// Asks the kernel to hold file bytes [`offset`, `offset` + 2 MiB) of `fd` in one 2 MiB page-cache folio,
    /// so that every mapping of the file maps them by one huge page (one TLB entry instead of 512).
    /// `offset` must be 2 MiB-aligned and the range inside the file, a hole that nothing has read or
    /// written yet (a folio already cached there decides the layout instead). How: a transient shared
    /// mapping of the range, marked `MADV_HUGEPAGE`, populated with `MADV_POPULATE_READ`: the fault's
    /// readahead then allocates the range as one folio (Linux with large folios for the file system, ext4
    /// since 6.16, xfs earlier; transparent huge pages in `madvise` or `always`), of zeros, which later
    /// `pwrite`s fill in place; holes stay holes on disk. Elsewhere the kernel caches the zeros in small
    /// pages, or refuses the advice: nothing but the layout differs. Returns whether the kernel took both
    /// pieces of advice (not whether it made the large folio, which nothing cheap can tell).
    static func populateHugePage(_ fd: Int32, at offset: Int) -> Bool {
        guard offset >= 0, offset % hugePageSize == 0 else { return false }
        // The mapping lives only inside this function and is read by nothing but the kernel's populate;
        // a range past the file's end (truncated behind our back) makes the populate fail (EFAULT), not
        // fault, since nothing here dereferences the mapping.
        guard let address = mmap(nil, hugePageSize, PROT_READ, MAP_SHARED, fd, off_t(offset)), address != MAP_FAILED else {
            return false
        }
        defer { munmap(address, hugePageSize) }
        guard madvise(address, hugePageSize, MADV_HUGEPAGE) == 0 else { return false }
        return madvise(address, hugePageSize, MADV_POPULATE_READ) == 0
    }

    /// Copies `destination.count` bytes from file offset `offset`. False when the range is not inside
    /// the mapping or a SIGBUS interrupted the copy (the file shrank, or the kernel could not read a page).
    func copy(at offset: Int, into destination: UnsafeMutableRawBufferPointer) -> Bool {
        guard offset >= 0, offset <= length, destination.count <= length - offset else { return false }
        guard let target = destination.baseAddress else { return true }  // nothing to copy
        // The range lies inside the mapping (checked above); the guard catches the one way such a read
        // can still fail.
        return magpie_guarded_copy(target, base + offset, destination.count) == 0
    }
}
