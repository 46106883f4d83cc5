import Glibc
import Synchronization

/// Thin, typed wrappers over the file system calls the disk tier makes. Each retries `EINTR` here,
/// in one place, and turns a failure into a ``MagpieError`` naming the call, the errno and the path.
package enum FileIO {
    static func error(_ call: String, _ errno: Int32, _ path: String) -> MagpieError {
        let code: MagpieError.Code = (errno == ENOSPC || errno == EDQUOT) ? .noSpace : .ioFailure
        return MagpieError(code, "\(call) failed: \(String(cString: strerror(errno)))", errno: errno, path: path)
    }

    #if MAGPIE_TESTING
    /// Test builds only (the `MAGPIE_TESTING` condition, on in debug builds, see Package.swift; a release
    /// build has neither the table nor the check): failures injected by tests, by path prefix (each test
    /// registers its own directory, so tests running in parallel never see each other's faults), consulted
    /// before every write-like call with its name and path; a non-nil errno makes the call fail with it.
    /// (A pthread-based `Locked`, not `Mutex`: Thread Sanitizer cannot see `Mutex`'s futex and would
    /// report the table's accesses from different threads as races.)
    package static let injectedFailures = Locked<[String: @Sendable (_ call: String, _ path: String) -> Int32?]>([:])

    /// Set by tests while any failure is injected: I/O in tests pays one relaxed load when none is.
    package static let hasInjections = Atomic<Bool>(false)

    /// Whether a test has injected failures: a read that bypasses ``read(_:mapping:into:at:path:)`` (a
    /// mapped copy of its own) must go through it instead while this holds.
    @inline(__always)
    static var mayInject: Bool { hasInjections.load(ordering: .relaxed) }

    @inline(__always)
    private static func injected(_ call: String, _ path: String) throws(MagpieError) {
        guard hasInjections.load(ordering: .relaxed) else { return }
        let injections = injectedFailures.withLock { table in table.isEmpty ? [] : Array(table) }
        for (prefix, inject) in injections where path.hasPrefix(prefix) {
            if let errno = inject(call, path) { throw error(call, errno, path) }
        }
    }
    #else
    @inline(__always)
    static var mayInject: Bool { false }

    @inline(__always)
    private static func injected(_ call: String, _ path: String) throws(MagpieError) {}
    #endif

    /// `pread(2)` until `buffer` is full or end of file; returns the bytes read.
    static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int, path: String)
        throws(MagpieError) -> Int
    {
        try read(fd, mapping: nil, into: buffer, at: offset, path: path)
    }

    /// A read of `buffer.count` bytes at `offset`: copied from `mapping` when it covers them (see
    /// FileMapping.swift), else, or when the copy is interrupted, with `pread` until `buffer` is full or
    /// end of file. Returns the bytes read: fewer only at the end of the file. Injected `pread` failures
    /// apply to both ways alike.
    static func read(
        _ fd: Int32, mapping: FileMapping?, into buffer: UnsafeMutableRawBufferPointer, at offset: Int, path: String
    ) throws(MagpieError) -> Int {
        try injected("pread", path)
        if let mapping, mapping.copy(at: offset, into: buffer) { return buffer.count }
        var done = 0
        while done < buffer.count {
            let n = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            if n > 0 {
                done += n
            } else if n == 0 {
                break
            } else if errno != EINTR {
                throw error("pread", errno, path)
            }
        }
        return done
    }

    /// `pwrite(2)` of all of `bytes` at `offset`. `operation` names the write for fault injection.
    static func write(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int, path: String, operation: String = "pwrite"
    ) throws(MagpieError) {
        var done = 0
        try write(fd, bytes, at: offset, path: path, operation: operation, done: &done)
    }

    /// `pwrite(2)` of all of `bytes` at `offset`; `done` says how many were written, also when it throws.
    static func write(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int, path: String, operation: String = "pwrite", done: inout Int
    ) throws(MagpieError) {
        done = 0
        try injected(operation, path)
        while done < bytes.count {
            let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
            if n > 0 {
                done += n
            } else if n < 0 && errno != EINTR {
                throw error("pwrite", errno, path)
            } else if n == 0 {
                throw error("pwrite", EIO, path)
            }
        }
    }

    /// ``write(_:_:at:path:operation:)`` of an array's bytes (`Array.withUnsafeBytes` rethrows untyped
    /// errors, so the typed error travels out as a `Result`).
    static func write(
        _ fd: Int32, _ bytes: [UInt8], at offset: Int, path: String, operation: String = "pwrite"
    ) throws(MagpieError) {
        try bytes.withUnsafeBytes { raw in
            Result { () throws(MagpieError) in try write(fd, raw, at: offset, path: path, operation: operation) }
        }.get()
    }

    /// `fsync(2)`.
    static func sync(_ fd: Int32, path: String) throws(MagpieError) {
        try injected("fsync", path)
        while fsync(fd) != 0 {
            if errno != EINTR { throw error("fsync", errno, path) }
        }
    }

    /// `ftruncate(2)`.
    static func truncate(_ fd: Int32, to length: Int, path: String) throws(MagpieError) {
        try injected("ftruncate", path)
        while ftruncate(fd, off_t(length)) != 0 {
            if errno != EINTR { throw error("ftruncate", errno, path) }
        }
    }

    /// The file's size, from `fstat(2)`.
    static func size(_ fd: Int32, path: String) throws(MagpieError) -> Int {
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw error("fstat", errno, path) }
        return Int(info.st_size)
    }

    /// Opens `name` in `directoryFD` for reading and writing if it is an existing regular file owned by
    /// the effective user, in one `openat` and one `fstat`, and returns it with its size; nil for
    /// anything else (absent, a link, a FIFO, a directory, another user's file, an error), which the
    /// caller then handles on its careful path. Never creates and never follows a link. (No
    /// `O_NONBLOCK`, which would stay on the descriptor: opening a FIFO for reading and writing does not
    /// block on Linux, a socket fails with `ENXIO`, and a device node takes root to plant.)
    static func openExistingRegular(_ directoryFD: Int32, _ name: String, path: String) throws(MagpieError) -> (fd: Int32, size: Int)? {
        try injected("open", path)
        var fd: Int32
        repeat {
            fd = openat(directoryFD, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC)
        } while fd < 0 && errno == EINTR
        guard fd >= 0 else { return nil }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid() else {
            Glibc.close(fd)
            return nil
        }
        return (fd, Int(info.st_size))
    }

    /// `openat(2)` of `name` relative to the directory `directoryFD`, never following a symbolic link
    /// (`O_NOFOLLOW`: a link in `name`'s place fails with `ELOOP`, dangling or not, and creates nothing).
    /// With `regularFile`, the opened file must be a regular file owned by the effective user, else the
    /// call fails with ``MagpieError/Code/directoryUnsafe``. `path` names it in errors.
    static func openAt(
        _ directoryFD: Int32, _ name: String, _ flags: Int32, mode: mode_t, path: String, regularFile: Bool = true
    ) throws(MagpieError) -> Int32 {
        if flags & (O_WRONLY | O_RDWR | O_CREAT) != 0 { try injected("open", path) }
        var fd: Int32
        repeat {
            fd = openat(directoryFD, name, flags | O_NOFOLLOW | O_CLOEXEC, mode)
        } while fd < 0 && errno == EINTR
        guard fd >= 0 else {
            let code = errno
            if code == ELOOP {
                throw MagpieError(.directoryUnsafe, "refusing to open a symbolic link", errno: code, path: path)
            }
            throw error("open", code, path)
        }
        guard regularFile else { return fd }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw error("fstat", code, path)
        }
        let problem: String? =
            info.st_mode & S_IFMT != S_IFREG ? "not a regular file"
            : info.st_uid != geteuid() ? "owned by uid \(info.st_uid), not by this process's uid \(geteuid())" : nil
        if let problem {
            Glibc.close(fd)
            throw MagpieError(.directoryUnsafe, "refusing a file that is \(problem)", path: path)
        }
        return fd
    }

    /// Creates `name` in `directoryFD` as a new regular file open for reading and writing, with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW`. An entry already there (a leftover temporary, or a link someone
    /// planted) is unlinked first — `unlinkat` removes the link itself, never its target — and the
    /// exclusive create is tried once more.
    static func createExclusive(_ directoryFD: Int32, _ name: String, mode: mode_t, path: String) throws(MagpieError) -> Int32 {
        do {
            return try openAt(directoryFD, name, O_RDWR | O_CREAT | O_EXCL, mode: mode, path: path)
        } catch let error where error.errno == EEXIST {
            _ = error
            try unlinkAt(directoryFD, name, path: path)
            return try openAt(directoryFD, name, O_RDWR | O_CREAT | O_EXCL, mode: mode, path: path)
        }
    }

    /// `renameat(2)` within one directory. A link at `to` is replaced, not followed.
    static func renameAt(_ directoryFD: Int32, _ from: String, to: String, path: String) throws(MagpieError) {
        try injected("rename", path)
        guard renameat(directoryFD, from, directoryFD, to) == 0 else { throw error("rename", errno, path) }
    }

    /// `unlinkat(2)`: removes the entry `name` (a link itself, never what it points at). A missing
    /// entry is fine.
    static func unlinkAt(_ directoryFD: Int32, _ name: String, path: String, directory: Bool = false) throws(MagpieError) {
        guard unlinkat(directoryFD, name, directory ? AT_REMOVEDIR : 0) == 0 || errno == ENOENT else {
            throw error(directory ? "rmdir" : "unlink", errno, path)
        }
    }

    /// The names in the open directory `directoryFD` (without "." and ".."); the descriptor stays open.
    static func list(_ directoryFD: Int32, path: String) throws(MagpieError) -> [String] {
        var names: [String] = []
        try forEachEntry(directoryFD, path: path) { name, _ in names.append(String(decoding: name, as: UTF8.self)) }
        return names
    }

    /// Calls `body` with each entry's name bytes (valid during the call only) and `d_type`, without "."
    /// and "..", and without making a `String` of each name; the descriptor stays open.
    static func forEachEntry(
        _ directoryFD: Int32, path: String, _ body: (UnsafeRawBufferPointer, UInt8) throws(MagpieError) -> Void
    ) throws(MagpieError) {
        let copy = dup(directoryFD)
        guard copy >= 0 else { throw error("dup", errno, path) }
        guard let dir = fdopendir(copy) else {
            let code = errno
            Glibc.close(copy)
            throw error("fdopendir", code, path)
        }
        defer { closedir(dir) }  // closes `copy`
        rewinddir(dir)  // the copy shares its offset with `directoryFD`
        while let entry = readdir(dir) {
            // `d_name` is a fixed 256-byte array in the entry; the name ends at its first NUL.
            let type = entry.pointee.d_type
            try withUnsafeBytes(of: &entry.pointee.d_name) { (raw: UnsafeRawBufferPointer) throws(MagpieError) in
                let length = strnlen(raw.baseAddress!.assumingMemoryBound(to: CChar.self), raw.count)
                let name = UnsafeRawBufferPointer(rebasing: raw[0..<length])
                let isDot = (length == 1 && name[0] == 0x2E) || (length == 2 && name[0] == 0x2E && name[1] == 0x2E)
                if !isDot { try body(name, type) }
            }
        }
    }
}
