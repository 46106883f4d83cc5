import Foundation
import Glibc
import Magpie

// Real `redis-server` processes for the Redis client's tests and for the benchmarks: single servers
// (plain, with a password, with ACL users, over TLS), clusters of masters, and the TLS material they use.
// This file holds the errors, the tools, `runTool` and the ports; the rest is beside it:
// RedisServerProcess.swift (+CLI), RedisClusterProcess.swift (+Migration), TLSMaterial.swift,
// RedisServerScopes.swift (`withRedisServer`, `withRedisCluster`, cleanup at exit) and
// RedisChildProcesses.swift (posix_spawn, waitpid, the watchdog).
//
// ### Implementation Notes
// - Children are started with posix_spawn(3), not Foundation's `Process`: the harness signals them
//   itself (SIGSTOP, SIGCONT, SIGKILL) and reaps them with waitpid(2), which `Process` would race with.
//   Every child starts with an empty signal mask and default dispositions: a child of a Dispatch worker
//   thread would otherwise inherit a mask that blocks SIGTERM, and an ignored SIGPIPE.
// - Nothing is left behind. Every directory the harness makes is inside one directory of this process,
//   `$TMPDIR/magpie-redis-PID-XXXXXX`. Every child joins one process group led by a watchdog shell
//   (`read -r _; rm -rf DIRECTORY; kill -KILL 0`) whose standard input is a pipe only this process holds
//   open (its write end is close-on-exec, so no child inherits it). However this process ends — exit,
//   crash, SIGKILL from a CI timeout — the pipe closes, the watchdog's read returns, and it removes the
//   directory and kills the whole group. On an ordinary exit an `atexit` handler also kills the servers
//   still running and removes the directory.
// - Ports come from binding 127.0.0.1:0. One process never hands out a port twice, and a server whose
//   port was taken by someone else between the probe and its own bind (its log says "Address already in
//   use") is started again on fresh ports.
// - A server counts as started when `INFO server` through redis-cli reports its own process id: an
//   answer from some other server that holds the port does not count.
// - Everything here blocks the calling thread (spawning, polling every few milliseconds). The async
//   `withRedisServer` and `withRedisCluster` start and stop on a thread of their own, so they do not hold
//   a thread of the cooperative pool for the two seconds a cluster takes.

/// A failure of the test harness (not of the client under test): a tool missing, a server that did not
/// start, a redis-cli command that failed.
package struct RedisHarnessError: Error, CustomStringConvertible {
    /// What went wrong; more codes may come.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        package var description: String { name }

        /// redis-server, redis-cli or openssl is not on PATH (`make deps` installs them).
        package static let toolMissing = Code("toolMissing")
        /// A system call failed (`errno` says why).
        package static let systemCall = Code("systemCall")
        /// The server exited while starting.
        package static let serverExited = Code("serverExited")
        /// The server could not bind its port: someone else holds it.
        package static let portInUse = Code("portInUse")
        /// A server, a command or a cluster did not get there in time.
        package static let timedOut = Code("timedOut")
        /// A command exited with a failure status (redis-cli: also an error reply).
        package static let commandFailed = Code("commandFailed")
        /// The cluster did not reach a stable state (every node `cluster_state:ok`, one slot map).
        package static let clusterNotReady = Code("clusterNotReady")
        /// The call does not make sense as made (a stopped server restarted, no masters asked for).
        package static let invalidUse = Code("invalidUse")
    }

    package var code: Code
    package var message: String
    /// The errno of a failed system call.
    package var errno: Int32?

    package init(_ code: Code, _ message: String, errno: Int32? = nil) {
        self.code = code
        self.message = message
        self.errno = errno
    }

    package var description: String {
        let cause = errno.map { " (errno \($0): \(String(cString: strerror($0))))" } ?? ""
        return "RedisHarnessError.\(code): \(message)\(cause)"
    }

    static func systemCall(_ call: String, _ number: Int32) -> RedisHarnessError {
        RedisHarnessError(.systemCall, "\(call) failed", errno: number)
    }
}

// MARK: - Tools

/// The Redis and OpenSSL command-line tools the harness runs.
package enum RedisTools {
    /// The absolute path of `tool` (`redis-server`, `redis-cli`, `openssl`) on PATH, or nil.
    package static func path(of tool: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let directories =
            path.split(separator: ":").map(String.init) + ["/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin"]
        for directory in directories where !directory.isEmpty {
            let candidate = directory + "/" + tool
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    /// Whether redis-server and redis-cli are installed: the condition of every test that starts a server.
    package static var isInstalled: Bool { path(of: "redis-server") != nil && path(of: "redis-cli") != nil }

    /// Whether openssl is installed (``TLSMaterial`` needs it) besides the Redis tools.
    package static var isTLSInstalled: Bool { isInstalled && path(of: "openssl") != nil }
}

/// What a finished command wrote and how it ended.
package struct CommandOutput: Sendable {
    /// The exit status, or 128 + the signal number when a signal ended it.
    package var exitStatus: Int32
    package var standardOutput: String
    package var standardError: String
    /// Whether the command was killed for running past its timeout.
    package var timedOut: Bool

    /// Exited with status 0 in time.
    package var succeeded: Bool { exitStatus == 0 && !timedOut }
}

/// Runs `tool` (found on PATH) with `arguments` and collects what it writes; a command still running
/// after `timeout` is killed (SIGKILL) and reported with `timedOut`.
///
/// - Parameters:
///   - environment: Variables set for the command on top of this process's environment.
/// - Throws: ``RedisHarnessError`` when the tool is missing or cannot be started; a failing command is
///   not an error here (see ``CommandOutput/succeeded``).
package func runTool(
    _ tool: String, _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(10)
) throws -> CommandOutput {
    guard let executable = RedisTools.path(of: tool) else {
        throw RedisHarnessError(.toolMissing, "\(tool) is not installed (make deps installs it)")
    }
    let output = try makePipe()
    let errors: (read: Int32, write: Int32)
    do { errors = try makePipe() } catch {
        close(output.read)
        close(output.write)
        throw error
    }
    defer {
        close(output.read)
        close(errors.read)
    }
    let pid: pid_t
    do {
        pid = try spawnChild(
            executable, arguments, environment: environment, output: .pipes(output: output.write, error: errors.write))
    } catch {
        close(output.write)
        close(errors.write)
        throw error
    }
    close(output.write)
    close(errors.write)
    let (texts, timedOut) = drain([output.read, errors.read], until: .now + timeout)
    if timedOut { Glibc.kill(pid, SIGKILL) }
    let status: Int32
    switch waitChild(pid) {
    case .changed(.exited(let code)): status = code
    case .changed(.signaled(let signal)): status = 128 + signal
    default: status = -1
    }
    return CommandOutput(
        exitStatus: status, standardOutput: String(decoding: texts[0], as: UTF8.self),
        standardError: String(decoding: texts[1], as: UTF8.self), timedOut: timedOut)
}

// MARK: - Ports

/// Ports this process has handed out, never handed out again (servers start in parallel tests).
private let handedOutPorts = Locked<Set<Int>>([])

/// A TCP port on 127.0.0.1 that nothing is bound to now, found by binding port 0 and reading the port the
/// kernel chose. One process never gets the same port twice.
///
/// - Throws: ``RedisHarnessError`` when no socket can be bound.
package func freeLoopbackPort() throws -> Int {
    try freeLoopbackPorts(1)[0]
}

/// `count` distinct free ports on 127.0.0.1 (see ``freeLoopbackPort()``): a server's client port, TLS
/// port and cluster bus port (Redis 7's `cluster-port`, so no port + 10000 needs to be free).
package func freeLoopbackPorts(_ count: Int) throws -> [Int] {
    var sockets: [Int32] = []
    defer { for socket in sockets { close(socket) } }
    var ports: [Int] = []
    var attempts = 0
    while ports.count < count {
        attempts += 1
        guard attempts < 1000 else { throw RedisHarnessError(.systemCall, "found no free loopback port") }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw RedisHarnessError.systemCall("socket", errno) }
        sockets.append(fd)  // held open until all are found, so the kernel picks distinct ports
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(fd, address, length) == 0 && getsockname(fd, address, &length) == 0
            }
        }
        guard bound else { throw RedisHarnessError.systemCall("bind 127.0.0.1:0", errno) }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let fresh = handedOutPorts.withLock { $0.insert(port).inserted }
        if fresh { ports.append(port) }
    }
    return ports
}
