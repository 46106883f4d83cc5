/// An error thrown by Magpie.
///
/// Errors are values: bad input and I/O failure throw a ``MagpieError``; nothing in the library traps on
/// them. ``code`` says what went wrong and can grow new cases without breaking existing code that switches
/// over the codes it knows; ``message`` is for people, and ``errno`` and ``path`` carry the underlying cause
/// where there is one.
public struct MagpieError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure this is.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: Sendable, Hashable {
            case keyTooLong, valueTooLarge, invalidConfiguration, compressionFailed, decompressionFailed
            case directoryLocked, directoryUnusable, directoryUnsafe, directoryReplaced, manifestMismatch, noSpace, ioFailure, closed
            case encodingFailed, decodingFailed, loadTimedOut, remoteUnavailable, remoteRefused, remoteFull
        }

        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The key is longer than ``MemoryTier/maximumKeyLength``.
        public static let keyTooLong = Code(.keyTooLong)
        /// The value is longer than a tier can ever store (see ``MemoryTier/maximumValueLength``).
        public static let valueTooLarge = Code(.valueTooLarge)
        /// A configuration value is out of its documented range.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// zstd could not compress (for example: the destination buffer is too small).
        public static let compressionFailed = Code(.compressionFailed)
        /// zstd could not decompress: the input is corrupt, truncated, or not of the expected size.
        public static let decompressionFailed = Code(.decompressionFailed)

        /// Another ``DiskTier`` (in this process or another) has the directory open.
        public static let directoryLocked = Code(.directoryLocked)
        /// The directory is missing and cannot be created, is not writable, holds files Magpie did not
        /// write, or its MANIFEST is unreadable. ``DiskTier/destroy(directory:)`` resets a Magpie directory.
        public static let directoryUnusable = Code(.directoryUnusable)
        /// The directory cannot be trusted, so the tier refuses to write in it: the directory (or its
        /// `buckets/`) is a symbolic link, is owned by another user, or is writable by other users (or
        /// by its group, unless ``DiskTier/Configuration/allowsGroupWritableDirectory``); or a file the
        /// tier must open (LOCK, MANIFEST) is a symbolic link, not a regular file, or owned by another
        /// user. ``MagpieError/message`` names the problem and ``MagpieError/path`` the entry.
        public static let directoryUnsafe = Code(.directoryUnsafe)
        /// The directory, its `buckets/` or a bucket file was removed, renamed or replaced while the tier
        /// had it open. The tier fails every later call (instead of writing into files nobody can reach);
        /// close it and open the directory again.
        public static let directoryReplaced = Code(.directoryReplaced)
        /// The MANIFEST's format version or bucket count differs from what was asked for.
        public static let manifestMismatch = Code(.manifestMismatch)
        /// The file system is full (`ENOSPC`) or over quota (`EDQUOT`).
        public static let noSpace = Code(.noSpace)
        /// Any other failed system call; ``MagpieError/errno`` and ``MagpieError/path`` say which.
        public static let ioFailure = Code(.ioFailure)
        /// The tier or cache was closed.
        public static let closed = Code(.closed)
        /// A ``CacheCoder`` could not encode the value.
        public static let encodingFailed = Code(.encodingFailed)
        /// The stored bytes do not decode as the requested type (a type mismatch, or bytes not written by
        /// the coder).
        public static let decodingFailed = Code(.decodingFailed)

        /// A loader did not finish within ``LoaderOptions/hardTimeout`` and no stale value could stand in
        /// (the load goes on, and caches its value when it finishes).
        public static let loadTimedOut = Code(.loadTimedOut)
        /// The remote tier (``RemoteStore``) could not be reached, did not answer in time, or its
        /// circuit breaker is open. The cache's own calls never throw it: a remote failure is a miss
        /// there, counted in ``RemoteTierStatistics/errors``.
        public static let remoteUnavailable = Code(.remoteUnavailable)
        /// The remote tier answered, with an error (for example: the key holds a value of another type).
        /// The cache treats it as ``remoteUnavailable`` except that a removal it owes for this reason does
        /// not hold back the fleet's delivery watermark (``RemoteChanges/ownWritesDelivered()``): the
        /// store is reachable, and every instance reads the same error.
        public static let remoteRefused = Code(.remoteRefused)
        /// The remote tier refused a write for lack of memory (Redis: `OOM`, over `maxmemory` with nothing
        /// its policy may evict). Treated as ``remoteRefused``; the cache counts it in
        /// ``RemoteTierStatistics/oomRefusals`` and stores the key's tombstone instead of a refused value.
        public static let remoteFull = Code(.remoteFull)

        /// The code's name, e.g. `ioFailure`.
        public var description: String {
            switch kind {
            case .directoryLocked: "directoryLocked"
            case .directoryUnusable: "directoryUnusable"
            case .directoryUnsafe: "directoryUnsafe"
            case .directoryReplaced: "directoryReplaced"
            case .manifestMismatch: "manifestMismatch"
            case .noSpace: "noSpace"
            case .ioFailure: "ioFailure"
            case .closed: "closed"
            case .keyTooLong: "keyTooLong"
            case .valueTooLarge: "valueTooLarge"
            case .invalidConfiguration: "invalidConfiguration"
            case .compressionFailed: "compressionFailed"
            case .decompressionFailed: "decompressionFailed"
            case .encodingFailed: "encodingFailed"
            case .decodingFailed: "decodingFailed"
            case .loadTimedOut: "loadTimedOut"
            case .remoteUnavailable: "remoteUnavailable"
            case .remoteRefused: "remoteRefused"
            case .remoteFull: "remoteFull"
            }
        }
    }

    /// What kind of failure this is.
    public var code: Code

    /// The code of `error` if it is a ``MagpieError``.
    static func code(of error: any Error) -> Code? { (error as? MagpieError)?.code }
    /// A human-readable explanation.
    public var message: String
    /// The `errno` of the failed system call, if a system call failed.
    public var errno: Int32?
    /// The file or directory involved, if any.
    public var path: String?

    /// Creates an error.
    public init(_ code: Code, _ message: String, errno: Int32? = nil, path: String? = nil) {
        self.code = code
        self.message = message
        self.errno = errno
        self.path = path
    }

    /// `MagpieError.<code>: <message>`, then the path and errno when known.
    public var description: String {
        var text = "MagpieError.\(code): \(message)"
        if let path { text += " (path: \(path))" }
        if let errno { text += " (errno \(errno))" }
        return text
    }
}
