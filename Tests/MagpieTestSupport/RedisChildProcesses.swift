import Foundation
import Glibc
import Magpie

// MARK: - Child processes (posix_spawn, waitpid, the watchdog)

/// A wait(2) status, decoded (the W* macros are not imported into Swift).
enum WaitStatus: CustomStringConvertible {
    case exited(Int32)
    case signaled(Int32)
    case stopped(Int32)

    init(_ raw: Int32) {
        switch raw & 0x7f {
        case 0: self = .exited((raw >> 8) & 0xff)
        case 0x7f: self = .stopped((raw >> 8) & 0xff)
        default: self = .signaled(raw & 0x7f)
        }
    }

    var description: String {
        switch self {
        case .exited(let code): "exited with status \(code)"
        case .signaled(let signal): "was killed by signal \(signal)"
        case .stopped(let signal): "was stopped by signal \(signal)"
        }
    }
}

enum ChildState {
    /// `WNOHANG` and no change.
    case running
    case changed(WaitStatus)
    /// Not a child (any more): reaped already.
    case gone
}

/// waitpid(2) on one child, retried on EINTR.
func waitChild(_ pid: pid_t, options: Int32 = 0) -> ChildState {
    var status: Int32 = 0
    while true {
        let result = waitpid(pid, &status, options)
        if result == pid { return .changed(WaitStatus(status)) }
        if result == 0 { return .running }
        if errno == EINTR { continue }
        return .gone
    }
}

/// Where a child's standard output and error go (its standard input is /dev/null).
enum ChildOutput {
    case discard
    /// Both appended to the file.
    case file(String)
    /// Into these descriptors (write ends of pipes).
    case pipes(output: Int32, error: Int32)
}

/// posix_spawn(3) of `executable` (an absolute path) with an empty signal mask and default dispositions,
/// in the watchdog's process group (see the notes at the top of RedisServers.swift).
func spawnChild(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:], output: ChildOutput
) throws -> pid_t {
    let group = watchdogGroup()
    do {
        return try spawnProcess(
            executable, arguments, environment: environment, input: nil, output: output, group: group)
    } catch let error as RedisHarnessError where error.errno == EPERM && group != 0 {
        // The watchdog died between the check and the spawn: the child leads a group of its own.
        return try spawnProcess(executable, arguments, environment: environment, input: nil, output: output, group: 0)
    }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which its header declares only to GNU
/// sources: looked up at run time.
private let spawnCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
}()

private func spawnProcess(
    _ executable: String, _ arguments: [String], environment: [String: String], input: Int32?, output: ChildOutput,
    group: pid_t
) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if let input {
        posix_spawn_file_actions_adddup2(&actions, input, 0)
    } else {
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    }
    switch output {
    case .discard:
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
    case .file(let path):
        posix_spawn_file_actions_addopen(&actions, 1, path, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
    case .pipes(let output, let error):
        posix_spawn_file_actions_adddup2(&actions, output, 1)
        posix_spawn_file_actions_adddup2(&actions, error, 2)
    }
    // Nothing else of the test process leaks into the child. Without this a redis-server spawned while
    // Foundation's Process was starting magpie-bench inherited the end of the socket pair by which
    // Foundation learns that magpie-bench exited: waitUntilExit then waited for the redis-server, which
    // the waiting test would have stopped (a hang seen on 2 cores).
    guard let closeFrom = spawnCloseFrom else {
        throw RedisHarnessError.systemCall("posix_spawn_file_actions_addclosefrom_np (glibc 2.34 or later)", ENOSYS)
    }
    let closing = closeFrom(&actions, 3)
    guard closing == 0 else { throw RedisHarnessError.systemCall("posix_spawn_file_actions_addclosefrom_np", closing) }

    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var mask = sigset_t()
    sigemptyset(&mask)
    posix_spawnattr_setsigmask(&attributes, &mask)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM] {
        sigaddset(&defaults, signal)
    }
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    posix_spawnattr_setpgroup(&attributes, group)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

    var variables = ProcessInfo.processInfo.environment
    variables.merge(environment) { $1 }
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    let envp = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
        for pointer in argv { free(pointer) }
        for pointer in envp { free(pointer) }
    }
    var pid = pid_t()
    let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
    guard result == 0 else { throw RedisHarnessError.systemCall("posix_spawn \(executable)", result) }
    return pid
}

/// The watchdog's pid (the process group of every child), 0 before the first spawn.
private let watchdog = Locked<pid_t>(0)

/// The watchdog's process group, started (again) if it is not running; 0 if it cannot be started.
private func watchdogGroup() -> pid_t {
    watchdog.withLock { pid in
        if pid != 0, case .running = waitChild(pid, options: WNOHANG) { return pid }
        pid = 0
        guard let pipe = try? makePipe() else { return 0 }
        defer { close(pipe.read) }
        let script = #"read -r _; if [ -n "$1" ]; then rm -rf "$1"; fi; kill -KILL 0"#
        guard let sh = RedisTools.path(of: "sh"),
            let started = try? spawnProcess(
                sh, ["-c", script, "magpie-redis-watchdog", (try? harnessDirectory()) ?? ""], environment: [:],
                input: pipe.read, output: .discard, group: 0)
        else {
            close(pipe.write)
            return 0
        }
        // `pipe.write` stays open, close-on-exec, for the life of this process: its closing is the signal.
        pid = started
        return started
    }
}

/// A one-way channel like a pipe: a socketpair(2), because it is created close-on-exec atomically
/// (`pipe2` is not imported): no child spawned meanwhile by another thread inherits it.
func makePipe() throws -> (read: Int32, write: Int32) {
    var descriptors: [Int32] = [-1, -1]
    let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
    guard socketpair(AF_UNIX, type, 0, &descriptors) == 0 else {
        throw RedisHarnessError.systemCall("socketpair", errno)
    }
    shutdown(descriptors[0], Int32(SHUT_WR))
    shutdown(descriptors[1], Int32(SHUT_RD))
    return (descriptors[0], descriptors[1])
}

/// Reads every descriptor to its end (poll(2)), or until `deadline`: the bytes read, and whether the
/// deadline came first.
func drain(_ descriptors: [Int32], until deadline: ContinuousClock.Instant) -> ([[UInt8]], Bool) {
    var polled = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
    var outputs = [[UInt8]](repeating: [], count: descriptors.count)
    var chunk = [UInt8](repeating: 0, count: 64 << 10)
    while polled.contains(where: { $0.fd >= 0 }) {
        let remaining = deadline - .now
        guard remaining > .zero else { return (outputs, true) }
        let (seconds, attoseconds) = remaining.components
        let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
        let ready = poll(&polled, nfds_t(polled.count), milliseconds)
        if ready < 0 {
            if errno == EINTR { continue }
            return (outputs, false)
        }
        for index in polled.indices where polled[index].fd >= 0 && polled[index].revents != 0 {
            let count = chunk.withUnsafeMutableBytes { read(polled[index].fd, $0.baseAddress, $0.count) }
            if count > 0 {
                outputs[index] += chunk[0..<count]
            } else if count == 0 || (errno != EINTR && errno != EAGAIN) {
                polled[index].fd = -1
            }
        }
    }
    return (outputs, false)
}
