import Glibc
import Synchronization

/// Thin, typed wrappers over the file system calls the disk tier makes. Each retries `EINTR` here,
/// in one place, and turns a failure into a ``MagpieError`` naming the call, the errno and the path.
enum FileIO {
    /// Failures injected by tests, by path prefix (each test registers its own directory, so tests
    /// running in parallel never see each other's faults): called before every write-like call with
    /// its name and path; a non-nil errno makes the call fail with it. Empty outside tests.
    /// (A pthread-based `Locked`, not `Mutex`: Thread Sanitizer cannot see `Mutex`'s futex and would
    /// report the table's accesses from different threads as races.)
    static let injectedFailures = Locked<[String: @Sendable (_ call: String, _ path: String) -> Int32?]>([:])

    static func error(_ call: String, _ errno: Int32, _ path: String) -> MagpieError {
        let code: MagpieError.Code = (errno == ENOSPC || errno == EDQUOT) ? .noSpace : .ioFailure
        return MagpieError(code, "\(call) failed: \(String(cString: strerror(errno)))", errno: errno, path: path)
    }

    /// Set by tests while any failure is injected: production I/O pays one relaxed load, no lock.
    static let hasInjections = Atomic<Bool>(false)

    @inline(__always)
    private static func injected(_ call: String, _ path: String) throws(MagpieError) {
        guard hasInjections.load(ordering: .relaxed) else { return }
        let injections = injectedFailures.withLock { table in table.isEmpty ? [] : Array(table) }
        for (prefix, inject) in injections where path.hasPrefix(prefix) {
            if let errno = inject(call, path) { throw error(call, errno, path) }
        }
    }

    /// `open(2)`.
    static func open(_ path: String, _ flags: Int32, mode: mode_t = 0o644) throws(MagpieError) -> Int32 {
        if flags & (O_WRONLY | O_RDWR | O_CREAT) != 0 { try injected("open", path) }
        while true {
            let fd = Glibc.open(path, flags | O_CLOEXEC, mode)
            if fd >= 0 { return fd }
            if errno != EINTR { throw error("open", errno, path) }
        }
    }

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
        try injected(operation, path)
        var done = 0
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

    /// `rename(2)`.
    static func rename(_ from: String, to: String) throws(MagpieError) {
        try injected("rename", to)
        guard Glibc.rename(from, to) == 0 else { throw error("rename", errno, to) }
    }

    /// `fsync(2)` of a directory, so that renames and creations in it are durable.
    static func syncDirectory(_ path: String) throws(MagpieError) {
        let fd = try open(path, O_RDONLY | O_DIRECTORY)
        defer { close(fd) }
        try sync(fd, path: path)
    }

    /// `mkdir(2)`; an existing directory is fine.
    static func makeDirectory(_ path: String) throws(MagpieError) {
        if mkdir(path, 0o755) != 0 && errno != EEXIST {
            throw MagpieError(
                .directoryUnusable, "mkdir failed: \(String(cString: strerror(errno)))", errno: errno, path: path)
        }
    }

    /// The names in a directory (without "." and ".."), or nil if it does not exist.
    static func list(_ path: String) -> [String]? {
        guard let dir = opendir(path) else { return nil }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// Reads a whole (small) file, or nil if it does not exist.
    static func readFile(_ path: String) throws(MagpieError) -> [UInt8]? {
        let fd: Int32
        do {
            fd = try open(path, O_RDONLY)
        } catch {
            if error.errno == ENOENT { return nil }
            throw error
        }
        defer { close(fd) }
        let length = try size(fd, path: path)
        var bytes = [UInt8](repeating: 0, count: length)
        let read = try bytes.withUnsafeMutableBytes { buffer in
            Result { () throws(MagpieError) -> Int in try FileIO.read(fd, into: buffer, at: 0, path: path) }
        }.get()
        return Array(bytes.prefix(read))
    }

    /// Writes a file atomically: a temporary sibling, fsync, rename over `path`, fsync of the directory.
    static func writeFileAtomically(_ path: String, _ bytes: [UInt8], directory: String) throws(MagpieError) {
        let temporary = path + ".tmp"
        let fd = try open(temporary, O_WRONLY | O_CREAT | O_TRUNC)
        do {
            try bytes.withUnsafeBytes { raw in
                Result { () throws(MagpieError) in try write(fd, raw, at: 0, path: temporary) }
            }.get()
            try sync(fd, path: temporary)
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        try rename(temporary, to: path)
        try syncDirectory(directory)
    }
}
