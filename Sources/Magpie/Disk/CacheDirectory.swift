import Glibc
import Synchronization

// MARK: - The cache directory: held open, verified, and the only way the tier reaches a file
//
// Trust model. The directory may sit where other local users can write (`/tmp`, a shared volume), and
// whoever can write into it can plant symbolic links. So the tier:
//  - opens the directory itself with `O_DIRECTORY | O_NOFOLLOW` (a symlink in its place is refused) and
//    keeps the descriptor; `buckets/` likewise. Every file is then opened, created, renamed and
//    unlinked *relative to those descriptors* (`openat`, `renameat`, `unlinkat`), so replacing the
//    directory or `buckets/` by a symlink while the tier is open redirects nothing;
//  - opens every file with `O_NOFOLLOW` and insists (`fstat`) on a regular file owned by the effective
//    user; a planted symlink fails with `ELOOP`, dangling or not, so nothing is created or written
//    through one;
//  - creates temporary files (`MANIFEST.tmp`, `NN.index.tmp`, `NN.compact`) with `O_CREAT | O_EXCL`
//    (an entry planted at the name is unlinked first: `unlinkat` removes a link, never its target),
//    and renames them into place (`renameat` replaces a planted link at the destination, never
//    following it);
//  - refuses a directory (or `buckets/`) that is not owned by the effective user, or is writable by
//    others, or by its group unless ``DiskTier/Configuration/allowsGroupWritableDirectory`` says the
//    group is trusted (the refusal is a ``MagpieError/Code/directoryUnsafe`` naming the problem);
//  - creates files with ``DiskTier/Configuration/fileMode`` (0600) and directories with
//    ``DiskTier/Configuration/directoryMode`` (0700) by default, so the MANIFEST's hash seed and the
//    cached data are not readable by other users (the umask can only narrow these).
// The path components above the directory are the caller's to trust, as for any path a program is
// given.
//
// Replacement. The identity (device, inode) of the directory and of `buckets/` is recorded at open.
// ``check(bucketFiles:)`` compares it with what the path names now, and sees a directory that was
// removed (its link count is 0); the tier runs it on flush, on `writeBuffers()` and at most once per
// ``DiskTier/Configuration/directoryCheckInterval`` from its writes, and from then on fails every call
// with ``MagpieError/Code/directoryReplaced`` instead of writing into files nobody can reach.

/// Where a file lives: the cache directory itself, or its `buckets/` subdirectory.
enum DirectoryPlace: Sendable {
    case root, buckets
}

/// An open, verified cache directory (see the comment above). Owns two descriptors.
final class CacheDirectory: Sendable {
    /// The directory's path as configured (for messages and fault injection; never opened again).
    let path: String
    /// `path` made absolute at open, so that a later `chdir` cannot make the check look elsewhere.
    private let absolutePath: String
    let fileMode: mode_t
    private let rootFD: Int32
    private let bucketsFD: Int32
    private let rootIdentity: FileIdentity
    private let bucketsIdentity: FileIdentity

    /// Takes over `root`'s descriptor and opens (creating if missing) and verifies its `buckets/`. On a
    /// throw the caller still owns `root.fd`.
    init(root: RootDirectory, directoryMode: mode_t, allowsGroupWritable: Bool) throws(MagpieError) {
        let bucketsPath = root.path + "/buckets"
        if mkdirat(root.fd, "buckets", directoryMode) != 0 && errno != EEXIST {
            throw MagpieError(
                .directoryUnusable, "mkdir failed: \(String(cString: strerror(errno)))", errno: errno, path: bucketsPath)
        }
        let fd = try Self.openDirectory(at: root.fd, "buckets", path: bucketsPath, allowsGroupWritable: allowsGroupWritable)
        self.path = root.path
        self.absolutePath = root.absolutePath
        self.fileMode = root.fileMode
        self.rootFD = root.fd
        self.rootIdentity = root.identity
        self.bucketsFD = fd.fd
        self.bucketsIdentity = fd.identity
    }

    deinit {
        Glibc.close(bucketsFD)
        Glibc.close(rootFD)
    }

    func fd(_ place: DirectoryPlace) -> Int32 { place == .root ? rootFD : bucketsFD }

    func path(_ place: DirectoryPlace, _ name: String) -> String {
        place == .root ? path + "/" + name : path + "/buckets/" + name
    }

    /// Opens an existing regular file (`O_NOFOLLOW`, owned by us); nil if it does not exist.
    func open(_ place: DirectoryPlace, _ name: String, writable: Bool) throws(MagpieError) -> Int32? {
        do {
            return try FileIO.openAt(fd(place), name, writable ? O_RDWR : O_RDONLY, mode: fileMode, path: path(place, name))
        } catch {
            if error.errno == ENOENT { return nil }
            throw error
        }
    }

    /// Opens a regular file for reading and writing, creating it (with ``fileMode``) if missing.
    func openOrCreate(_ place: DirectoryPlace, _ name: String) throws(MagpieError) -> Int32 {
        try FileIO.openAt(fd(place), name, O_RDWR | O_CREAT, mode: fileMode, path: path(place, name))
    }

    /// Creates a fresh regular file for writing with `O_EXCL`; whatever entry had the name before (a
    /// leftover temporary, a planted link) is unlinked first.
    func createExclusive(_ place: DirectoryPlace, _ name: String) throws(MagpieError) -> Int32 {
        try FileIO.createExclusive(fd(place), name, mode: fileMode, path: path(place, name))
    }

    func rename(_ place: DirectoryPlace, _ from: String, to: String) throws(MagpieError) {
        try FileIO.renameAt(fd(place), from, to: to, path: path(place, to))
    }

    /// Unlinks `name` (a link, never its target). A missing name is fine.
    func unlink(_ place: DirectoryPlace, _ name: String) throws(MagpieError) {
        try FileIO.unlinkAt(fd(place), name, path: path(place, name))
    }

    /// The names in `place`, without "." and "..".
    func list(_ place: DirectoryPlace) throws(MagpieError) -> [String] {
        try FileIO.list(fd(place), path: place == .root ? path : path + "/buckets")
    }

    /// Calls `body` with each entry of `place` (its name's bytes and `d_type`), without "." and "..".
    func forEachEntry(_ place: DirectoryPlace, _ body: (UnsafeRawBufferPointer, UInt8) throws(MagpieError) -> Void) throws(MagpieError) {
        try FileIO.forEachEntry(fd(place), path: place == .root ? path : path + "/buckets", body)
    }

    /// What kind of entry `name` is (without following a link), or nil if there is none.
    func kind(_ place: DirectoryPlace, _ name: String) -> mode_t? {
        var info = stat()
        guard fstatat(fd(place), name, &info, AT_SYMLINK_NOFOLLOW) == 0 else { return nil }
        return info.st_mode & S_IFMT
    }

    /// The size of a regular file at `name` in `place` (not following a link), 0 when there is none.
    func size(_ place: DirectoryPlace, _ name: String) -> Int {
        var info = stat()
        guard fstatat(fd(place), name, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFREG else { return 0 }
        return Int(info.st_size)
    }

    /// fsync of `place`, so that creations and renames in it are durable.
    func sync(_ place: DirectoryPlace) throws(MagpieError) {
        try FileIO.sync(fd(place), path: place == .root ? path : path + "/buckets")
    }

    /// Writes a file atomically: `<name>.tmp` created exclusively, written, fsynced, renamed over
    /// `name`, and the directory fsynced.
    func writeAtomically(_ place: DirectoryPlace, _ name: String, _ bytes: [UInt8]) throws(MagpieError) {
        let temporary = name + ".tmp"
        let fd = try createExclusive(place, temporary)
        do {
            try FileIO.write(fd, bytes, at: 0, path: path(place, temporary))
            try FileIO.sync(fd, path: path(place, temporary))
        } catch {
            Glibc.close(fd)
            try? unlink(place, temporary)
            throw error
        }
        Glibc.close(fd)
        try rename(place, temporary, to: name)
        try sync(place)
    }

    /// Reads a whole (small) regular file, or nil if it does not exist (or is longer than `limit` bytes:
    /// then nothing is read).
    func readFile(_ place: DirectoryPlace, _ name: String, limit: Int = .max) throws(MagpieError) -> [UInt8]? {
        guard let fd = try open(place, name, writable: false) else { return nil }
        defer { Glibc.close(fd) }
        let length = try FileIO.size(fd, path: path(place, name))
        guard length <= limit else { return nil }
        var bytes = [UInt8](repeating: 0, count: length)
        let read = try bytes.withUnsafeMutableBytes { buffer in
            Result { () throws(MagpieError) -> Int in try FileIO.read(fd, into: buffer, at: 0, path: path(place, name)) }
        }.get()
        return Array(bytes.prefix(read))
    }

    /// Nil while the directory and `buckets/` are still the ones opened, reachable at their paths; else
    /// a ``MagpieError/Code/directoryReplaced`` saying what changed. `bucketFiles` (descriptor, name)
    /// are checked too: each must still be linked at its name in `buckets/`.
    func check(bucketFiles: [(fd: Int32, name: String)]) -> MagpieError? {
        if let problem = Self.replaced(fd: rootFD, identity: rootIdentity, at: AT_FDCWD, absolutePath) {
            return MagpieError(.directoryReplaced, "the cache directory \(problem)", path: path)
        }
        if let problem = Self.replaced(fd: bucketsFD, identity: bucketsIdentity, at: rootFD, "buckets") {
            return MagpieError(.directoryReplaced, "buckets/ \(problem)", path: path + "/buckets")
        }
        for file in bucketFiles where file.fd >= 0 {
            var own = stat()
            guard fstat(file.fd, &own) == 0 else { continue }
            if let problem = Self.replaced(fd: file.fd, identity: FileIdentity(own), at: bucketsFD, file.name) {
                return MagpieError(.directoryReplaced, "a bucket file \(problem)", path: path(.buckets, file.name))
            }
        }
        return nil
    }

    /// What happened to the open file `fd` (recorded as `identity`), which should be linked at `name`
    /// relative to `directoryFD`; nil if nothing did.
    private static func replaced(fd: Int32, identity: FileIdentity, at directoryFD: Int32, _ name: String) -> String? {
        var own = stat()
        if fstat(fd, &own) == 0 && own.st_nlink == 0 { return "was removed while the tier had it open" }
        var now = stat()
        guard fstatat(directoryFD, name, &now, AT_SYMLINK_NOFOLLOW) == 0 else {
            return "was removed or renamed while the tier had it open"
        }
        return FileIdentity(now) == identity ? nil : "was replaced while the tier had it open"
    }

    // MARK: Opening and verifying directories

    /// Opens the directory `name` relative to `parent` without following a link, and verifies it: a
    /// directory, owned by the effective user, not writable by others (nor by its group unless allowed).
    static func openDirectory(at parent: Int32, _ name: String, path: String, allowsGroupWritable: Bool)
        throws(MagpieError) -> (fd: Int32, identity: FileIdentity)
    {
        let fd: Int32
        do {
            fd = try FileIO.openAt(parent, name, O_RDONLY | O_DIRECTORY, mode: 0, path: path, regularFile: false)
        } catch {
            if error.errno == ELOOP || error.errno == ENOTDIR {
                let what = error.errno == ELOOP ? "a symbolic link" : "not a directory"
                throw MagpieError(.directoryUnsafe, "refusing a cache directory that is \(what)", errno: error.errno, path: path)
            }
            throw MagpieError(.directoryUnusable, "cannot open the directory: \(error.message)", errno: error.errno, path: path)
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw FileIO.error("fstat", code, path)
        }
        if let problem = untrusted(info, allowsGroupWritable: allowsGroupWritable) {
            Glibc.close(fd)
            throw MagpieError(.directoryUnsafe, "refusing a cache directory that is \(problem)", path: path)
        }
        return (fd, FileIdentity(info))
    }

    /// Why a directory with this `stat` cannot be trusted, or nil.
    static func untrusted(_ info: stat, allowsGroupWritable: Bool) -> String? {
        let me = geteuid()
        if info.st_uid != me { return "owned by uid \(info.st_uid), not by this process's uid \(me)" }
        let mode = info.st_mode & 0o7777
        if mode & S_IWOTH != 0 { return "writable by all users (mode \(String(mode, radix: 8)))" }
        if mode & S_IWGRP != 0 && !allowsGroupWritable {
            return "writable by its group (mode \(String(mode, radix: 8))); set allowsGroupWritableDirectory to trust the group"
        }
        return nil
    }
}

/// The cache directory opened and verified, before the lock is taken and `buckets/` opened. Its
/// descriptor passes to the ``CacheDirectory`` made from it; until then the opener closes it on failure.
struct RootDirectory {
    let path: String
    let absolutePath: String
    let fileMode: mode_t
    let fd: Int32
    let identity: FileIdentity

    /// Creates the directory if missing (with `directoryMode`), then opens and verifies it. Trailing
    /// slashes are dropped first: with one, the kernel resolves a link in the last component even under
    /// `O_NOFOLLOW`; for the same reason a path whose last component is `.` or `..` is refused.
    init(path given: String, directoryMode: mode_t, fileMode: mode_t, allowsGroupWritable: Bool) throws(MagpieError) {
        var path = given
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        if let last = path.split(separator: "/").last, last == "." || last == ".." {
            throw MagpieError(
                .invalidConfiguration, "the cache directory's path must end in its own name, not in '\(last)'", path: given)
        }
        if mkdir(path, directoryMode) != 0 && errno != EEXIST {
            throw MagpieError(
                .directoryUnusable, "mkdir failed: \(String(cString: strerror(errno)))", errno: errno, path: path)
        }
        let opened = try CacheDirectory.openDirectory(at: AT_FDCWD, path, path: path, allowsGroupWritable: allowsGroupWritable)
        self.path = path
        self.absolutePath = path.hasPrefix("/") ? path : Self.workingDirectory() + "/" + path
        self.fileMode = fileMode
        self.fd = opened.fd
        self.identity = opened.identity
    }

    private static func workingDirectory() -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return "." }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Opens `name` in the directory for reading and writing, creating it if missing (see
    /// ``CacheDirectory/openOrCreate(_:_:)``).
    func openOrCreate(_ name: String) throws(MagpieError) -> Int32 {
        try FileIO.openAt(fd, name, O_RDWR | O_CREAT, mode: fileMode, path: path + "/" + name)
    }
}

/// A file's identity: device and inode.
struct FileIdentity: Equatable, Sendable {
    let device: UInt64
    let inode: UInt64

    init(_ info: stat) {
        device = UInt64(info.st_dev)
        inode = UInt64(info.st_ino)
    }
}
