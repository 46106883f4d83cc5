import Foundation
import Glibc
import Magpie

// Real `redis-server` processes for the Redis client's tests and for the benchmarks: single servers
// (plain, with a password, with ACL users, over TLS), clusters of masters, and the TLS material they use.
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

// MARK: - One server

/// A `redis-server` of its own: started on loopback in a fresh temporary directory, from a generated
/// configuration file (no persistence, log file in the directory), stopped and its directory removed by
/// ``stop()`` or when the last reference goes.
///
/// Every method blocks its thread; all are safe to call from any thread.
package final class RedisServerProcess: Sendable, CustomStringConvertible {
    /// How a server is configured.
    package struct Options: Sendable {
        /// The client port (the TLS port of a TLS-only server); nil: a free one.
        package var port: Int?
        /// `requirepass`: the default user's password.
        package var requirePassword: String?
        /// ACL users with every permission (`user NAME on >PASSWORD ~* &* +@all`).
        package var aclUsers: [(name: String, password: String)]
        /// Serve TLS with this material (server certificate for 127.0.0.1 and localhost).
        package var tls: TLSMaterial?
        /// With ``tls``: also listen for plaintext on a second port (``plaintextPort``).
        package var tlsAlsoPlaintext: Bool
        /// With ``tls``: require client certificates (`tls-auth-clients yes`) signed by the CA.
        package var tlsAuthClients: Bool
        /// A cluster node (`cluster-enabled yes`, its own bus port, `cluster-node-timeout 2000`).
        package var cluster: Bool
        /// More configuration lines, appended last (so they win).
        package var extraConfig: [String]
        /// How long ``RedisServerProcess/start(_:)`` and ``RedisServerProcess/restart()`` wait for an answer.
        package var startTimeout: Duration

        package init(
            port: Int? = nil, requirePassword: String? = nil, aclUsers: [(name: String, password: String)] = [],
            tls: TLSMaterial? = nil, tlsAlsoPlaintext: Bool = false, tlsAuthClients: Bool = false,
            cluster: Bool = false, extraConfig: [String] = [], startTimeout: Duration = .seconds(10)
        ) {
            self.port = port
            self.requirePassword = requirePassword
            self.aclUsers = aclUsers
            self.tls = tls
            self.tlsAlsoPlaintext = tlsAlsoPlaintext
            self.tlsAuthClients = tlsAuthClients
            self.cluster = cluster
            self.extraConfig = extraConfig
            self.startTimeout = startTimeout
        }
    }

    private struct State {
        var pid: pid_t = 0  // 0: not running
        var paused = false
        var removed = false
    }

    /// The options the server was started with.
    package let options: Options
    /// Its directory: `redis.conf`, `redis.log`, `stdout.log` (early errors), `nodes.conf`.
    package let directory: String
    /// Always 127.0.0.1.
    package let host = "127.0.0.1"
    /// The port clients use: the plaintext port, or the TLS port of a TLS-only server.
    package let port: Int
    /// The TLS port (with ``Options/tls``).
    package let tlsPort: Int?
    /// The plaintext port, if the server has one.
    package let plaintextPort: Int?
    /// The cluster bus port (with ``Options/cluster``).
    package let clusterBusPort: Int?
    private let state: Locked<State>

    private init(options: Options, directory: String, ports: Ports) {
        self.options = options
        self.directory = directory
        self.plaintextPort = ports.plaintext
        self.tlsPort = ports.tls
        self.clusterBusPort = ports.clusterBus
        self.port = ports.plaintext ?? ports.tls ?? 0
        self.state = Locked(State())
        registry.withLock { $0[directory] = 0 }
    }

    deinit { stop() }

    /// Whether ``port`` speaks TLS (a TLS-only server).
    package var usesTLS: Bool { plaintextPort == nil }
    /// `redis://127.0.0.1:PORT`, or `rediss://` for a TLS-only server.
    package var url: String { "\(usesTLS ? "rediss" : "redis")://\(host):\(port)" }
    /// `rediss://127.0.0.1:TLSPORT`, with ``Options/tls``.
    package var tlsURL: String? { tlsPort.map { "rediss://\(host):\($0)" } }
    /// `127.0.0.1:PORT`.
    package var endpointDescription: String { "\(host):\(port)" }
    /// The generated configuration file.
    package var configPath: String { directory + "/redis.conf" }
    /// The server's log file.
    package var logPath: String { directory + "/redis.log" }
    /// The process id while it runs (also while paused).
    package var pid: Int32? { state.withLock { $0.pid == 0 ? nil : $0.pid } }
    /// Whether it runs (also while paused); notices a server that died on its own.
    package var isRunning: Bool { state.withLock { Self.reapIfExited(&$0) == nil && $0.pid != 0 } }
    /// Whether ``pause()`` froze it.
    package var isPaused: Bool { state.withLock { $0.paused } }

    package var description: String {
        "redis-server \(endpointDescription) (pid \(pid.map(String.init) ?? "none"), \(directory))"
    }

    /// Starts a server and waits until it answers (up to ``Options/startTimeout``).
    ///
    /// - Throws: ``RedisHarnessError``: the tools missing, the server exited (the message carries the end
    ///   of its log) or did not answer in time.
    package static func start(_ options: Options = .init()) throws -> RedisServerProcess {
        try startAll(count: 1, options)[0]
    }

    /// Starts `count` servers with `options` at once, then waits until each answers.
    static func startAll(count: Int, _ options: Options) throws -> [RedisServerProcess] {
        guard RedisTools.isInstalled else {
            throw RedisHarnessError(
                .toolMissing, "redis-server or redis-cli is not installed (make deps installs them)")
        }
        guard count == 1 || options.port == nil else {
            throw RedisHarnessError(.invalidUse, "\(count) servers cannot share the port \(options.port ?? 0)")
        }
        var servers: [RedisServerProcess] = []
        do {
            for _ in 0..<count { servers.append(try launch(options)) }
            for index in servers.indices {
                var attempts = 1
                while true {
                    do {
                        try servers[index].waitUntilAnswering(timeout: options.startTimeout)
                        break
                    } catch let error as RedisHarnessError
                        where error.code == .portInUse && options.port == nil && attempts < 5
                    {
                        servers[index].stop()
                        servers[index] = try launch(options)
                        attempts += 1
                    }
                }
            }
            return servers
        } catch {
            for server in servers { server.stop() }
            throw error
        }
    }

    /// Stops the server (SIGTERM; SIGKILL if it still runs after 3 s), reaps it and removes its directory.
    /// Calling it again does nothing.
    package func stop() {
        state.withLock { state in
            if state.pid != 0 {
                Self.terminate(state.pid)
                state.pid = 0
                state.paused = false
            }
            if !state.removed {
                state.removed = true
                try? FileManager.default.removeItem(atPath: directory)
            }
        }
        registry.withLock { $0[directory] = nil }
    }

    /// Kills the server now (SIGKILL, also when paused) and reaps it; its directory and port stay, for
    /// ``restart()``. Its data is gone (no persistence unless ``Options/extraConfig`` turns it on).
    package func kill() {
        state.withLock { state in
            guard state.pid != 0 else { return }
            Glibc.kill(state.pid, SIGKILL)
            _ = waitChild(state.pid)
            state.pid = 0
            state.paused = false
            registry.withLock { $0[directory] = 0 }
        }
    }

    /// Freezes the server (SIGSTOP) and returns once it is stopped: it accepts connections (the kernel
    /// completes them) but answers nothing until ``resume()``.
    package func pause() {
        state.withLock { state in
            guard state.pid != 0, !state.paused else { return }
            Glibc.kill(state.pid, SIGSTOP)
            switch waitChild(state.pid, options: WUNTRACED) {
            case .changed(.stopped): state.paused = true
            case .changed, .gone:
                state.pid = 0
                registry.withLock { $0[directory] = 0 }
            case .running: break
            }
        }
    }

    /// Lets a paused server run again (SIGCONT).
    package func resume() {
        state.withLock { state in
            guard state.pid != 0, state.paused else { return }
            Glibc.kill(state.pid, SIGCONT)
            state.paused = false
        }
    }

    /// Starts the server again, on the same ports and in the same directory (a cluster node keeps its node
    /// id: `nodes.conf` stays), and waits until it answers; one still running is killed first.
    ///
    /// - Throws: ``RedisHarnessError``: the server was stopped for good, or did not come back in
    ///   ``Options/startTimeout`` (also when its port stays taken by someone else).
    package func restart() throws {
        try state.withLock { state in
            guard !state.removed else {
                throw RedisHarnessError(.invalidUse, "\(endpointDescription) was stopped and its directory removed")
            }
            if state.pid != 0 {
                Glibc.kill(state.pid, SIGKILL)
                _ = waitChild(state.pid)
                state.pid = 0
                state.paused = false
            }
            try spawn(&state)
        }
        let deadline = ContinuousClock.now + options.startTimeout
        while true {
            do {
                try waitUntilAnswering(timeout: deadline - .now)
                return
            } catch let error as RedisHarnessError where error.code == .portInUse && ContinuousClock.now < deadline {
                usleep(50_000)  // the port is ours, held a moment by someone else: try again
                try state.withLock { try spawn(&$0) }
            }
        }
    }

    /// Runs redis-cli against this server — `-h 127.0.0.1 -p PORT`, the TLS flags of a TLS-only server,
    /// the password of ``Options/requirePassword`` — with `arguments` (options such as `--user` may come
    /// first), and returns its output without surrounding whitespace.
    ///
    /// - Throws: ``RedisHarnessError`` with `commandFailed` when redis-cli fails or the server answers
    ///   with an error (redis-cli's `-e`; the message carries it, e.g. `MOVED 3999 127.0.0.1:40123`), or
    ///   `timedOut` (a paused server answers nothing).
    package func cli(_ arguments: [String], timeout: Duration = .seconds(10)) throws -> String {
        let output = try runTool(
            "redis-cli", connectionArguments + ["-e"] + arguments, environment: cliEnvironment, timeout: timeout)
        guard output.succeeded else {
            let command = arguments.joined(separator: " ")
            if output.timedOut {
                throw RedisHarnessError(
                    .timedOut, "redis-cli \(command) against \(endpointDescription): no answer in \(timeout)")
            }
            let said = (output.standardError + output.standardOutput).trimmingCharacters(in: .whitespacesAndNewlines)
            throw RedisHarnessError(
                .commandFailed,
                "redis-cli \(command) against \(endpointDescription) (status \(output.exitStatus)): \(said)")
        }
        return output.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// ``cli(_:timeout:)`` with the arguments listed.
    package func cli(_ arguments: String...) throws -> String {
        try cli(arguments)
    }

    /// redis-cli's (and redis-benchmark's) flags to reach this server: host, port and, for a TLS-only
    /// server, `--tls --cacert CA --cert CLIENT --key CLIENTKEY`. The password is not among them (see
    /// ``cliEnvironment``).
    package var connectionArguments: [String] {
        var arguments = ["-h", host, "-p", String(port)]
        if usesTLS, let tls = options.tls { arguments += tls.cliArguments }
        return arguments
    }

    /// `REDISCLI_AUTH` with ``Options/requirePassword``, for redis-cli without a warning about `-a`.
    package var cliEnvironment: [String: String] {
        options.requirePassword.map { ["REDISCLI_AUTH": $0] } ?? [:]
    }

    /// The last lines of the server's log (and of its standard output and error, where a configuration
    /// error goes).
    package func logTail(lines: Int = 20) -> String {
        [directory + "/stdout.log", logPath].map { path in
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return "" }
            return text.split(separator: "\n", omittingEmptySubsequences: true).suffix(lines).joined(separator: "\n")
        }.filter { !$0.isEmpty }.joined(separator: "\n")
    }

    // MARK: Internals

    struct Ports {
        var plaintext: Int?
        var tls: Int?
        var clusterBus: Int?
    }

    /// Picks ports, writes the configuration in a new directory and spawns the server (not waiting).
    private static func launch(_ options: Options) throws -> RedisServerProcess {
        let hasTLS = options.tls != nil
        let hasPlaintext = !hasTLS || options.tlsAlsoPlaintext
        let needed = (hasPlaintext ? 1 : 0) + (hasTLS ? 1 : 0) + (options.cluster ? 1 : 0)
        var free = try freeLoopbackPorts(needed - (options.port == nil ? 0 : 1))
        var ports = Ports()
        if hasPlaintext { ports.plaintext = options.port ?? free.removeFirst() }
        if hasTLS { ports.tls = hasPlaintext || options.port == nil ? free.removeFirst() : options.port }
        if options.cluster { ports.clusterBus = free.removeFirst() }

        let directory = try makeTemporaryDirectory("server")
        let server = RedisServerProcess(options: options, directory: directory, ports: ports)
        do {
            try configuration(options, ports: ports, directory: directory)
                .write(toFile: server.configPath, atomically: true, encoding: .utf8)
        } catch {
            server.stop()
            throw RedisHarnessError(.systemCall, "could not write \(server.configPath): \(error)")
        }
        do {
            try server.state.withLock { try server.spawn(&$0) }
        } catch {
            server.stop()
            throw error
        }
        return server
    }

    /// The configuration file's text.
    private static func configuration(_ options: Options, ports: Ports, directory: String) -> String {
        var lines = [
            "bind 127.0.0.1",
            "port \(ports.plaintext ?? 0)",
            "dir \(quoted(directory))",
            "logfile \(quoted(directory + "/redis.log"))",
            "daemonize no",
            "protected-mode no",
            "save \"\"",
            "appendonly no",
            // DEBUG SLEEP and friends, for tests of slow servers (only over loopback anyway).
            "enable-debug-command local",
        ]
        if let password = options.requirePassword { lines.append("requirepass \(quoted(password))") }
        for user in options.aclUsers {
            lines.append("user \(quoted(user.name)) on \(quoted(">" + user.password)) ~* &* +@all")
        }
        if let tls = options.tls, let tlsPort = ports.tls {
            lines += [
                "tls-port \(tlsPort)",
                "tls-cert-file \(quoted(tls.serverCertPath))",
                "tls-key-file \(quoted(tls.serverKeyPath))",
                "tls-ca-cert-file \(quoted(tls.caCertPath))",
                "tls-auth-clients \(options.tlsAuthClients ? "yes" : "no")",
            ]
            if options.cluster { lines += ["tls-cluster yes", "tls-replication yes"] }
        }
        if options.cluster, let busPort = ports.clusterBus {
            lines += [
                "cluster-enabled yes",
                "cluster-config-file nodes.conf",
                "cluster-port \(busPort)",
                "cluster-node-timeout 2000",
                // Nodes learn their own address at once, instead of from their peers' first pings.
                "cluster-announce-ip 127.0.0.1",
            ]
        }
        lines += options.extraConfig
        return lines.joined(separator: "\n") + "\n"
    }

    /// Spawns redis-server with the configuration file; `state` is the locked state.
    private func spawn(_ state: inout State) throws {
        guard let executable = RedisTools.path(of: "redis-server") else {
            throw RedisHarnessError(.toolMissing, "redis-server is not installed (make deps installs it)")
        }
        let pid = try spawnChild(executable, [configPath], output: .file(directory + "/stdout.log"))
        state.pid = pid
        registry.withLock { $0[directory] = pid }
    }

    /// Polls until the server reports its own pid over redis-cli; throws if it exits or `timeout` passes.
    private func waitUntilAnswering(timeout: Duration) throws {
        let deadline = ContinuousClock.now + timeout
        while true {
            let (pid, exit) = state.withLock { state in (state.pid, Self.reapIfExited(&state)) }
            if let exit {
                let log = logTail()
                let code: RedisHarnessError.Code = log.contains("Address already in use") ? .portInUse : .serverExited
                throw RedisHarnessError(
                    code, "redis-server for \(endpointDescription) \(exit) while starting; its log ends:\n\(log)")
            }
            guard pid != 0 else {
                throw RedisHarnessError(.serverExited, "redis-server for \(endpointDescription) is not running")
            }
            if let output = try? runTool(
                "redis-cli", connectionArguments + ["INFO", "server"], environment: cliEnvironment, timeout: .seconds(2)
            ),
                output.standardOutput.contains("process_id:\(pid)\r")
            {
                return
            }
            if ContinuousClock.now >= deadline {
                throw RedisHarnessError(
                    .timedOut,
                    "redis-server for \(endpointDescription) did not answer in \(timeout); its log ends:\n\(logTail())")
            }
            usleep(5_000)
        }
    }

    /// Reaps the server if it has exited: how it ended, or nil while it runs (or was not running).
    private static func reapIfExited(_ state: inout State) -> String? {
        guard state.pid != 0 else { return nil }
        switch waitChild(state.pid, options: WNOHANG) {
        case .running: return nil
        case .changed(let status):
            state.pid = 0
            return "\(status)"
        case .gone:
            state.pid = 0
            return "vanished"
        }
    }

    /// SIGTERM (and SIGCONT, for a paused server), up to `grace` to exit, then SIGKILL; reaps it.
    private static func terminate(_ pid: pid_t, grace: Duration = .seconds(3)) {
        Glibc.kill(pid, SIGTERM)
        Glibc.kill(pid, SIGCONT)
        let deadline = ContinuousClock.now + grace
        while ContinuousClock.now < deadline {
            guard case .running = waitChild(pid, options: WNOHANG) else { return }
            usleep(2_000)
        }
        Glibc.kill(pid, SIGKILL)
        _ = waitChild(pid)
    }
}

/// A configuration file argument in double quotes (Redis's `sdssplitargs` unescapes `\\` and `\"`).
private func quoted(_ text: String) -> String {
    "\"" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
}

// MARK: - A cluster

/// A Redis cluster of masters without replicas, each a ``RedisServerProcess`` with
/// ``RedisServerProcess/Options/cluster``, the 16384 slots split evenly in ranges.
///
/// Made as redis-cli's `--cluster create` makes one (`CLUSTER ADDSLOTSRANGE`, `SET-CONFIG-EPOCH`, `MEET`),
/// without its one-second waits, and for any number of masters. A cluster master turns `ok` no sooner
/// than two seconds after it started (Redis's `CLUSTER_WRITABLE_DELAY`): that is most of the start's time.
package final class RedisClusterProcess: Sendable {
    /// The masters, in slot order: the first owns the first range.
    package let nodes: [RedisServerProcess]
    /// A directory for the logs of reshards.
    private let directory: String
    private let reshards = Locked(0)

    private init(nodes: [RedisServerProcess], directory: String) {
        self.nodes = nodes
        self.directory = directory
    }

    deinit { stop() }

    /// Every node's ``RedisServerProcess/url``.
    package var seedURLs: [String] { nodes.map(\.url) }

    /// Starts `masters` cluster nodes with `options` (its ``RedisServerProcess/Options/port`` is ignored;
    /// ``RedisServerProcess/Options/cluster`` is implied), joins them, assigns the slots, and waits until
    /// the cluster is stable (see ``waitUntilStable(timeout:)``), up to `timeout`.
    ///
    /// - Throws: ``RedisHarnessError`` (every node already started is stopped).
    package static func start(
        masters: Int = 3, options: RedisServerProcess.Options = .init(), timeout: Duration = .seconds(20)
    ) throws -> RedisClusterProcess {
        guard (1...16384).contains(masters) else {
            throw RedisHarnessError(.invalidUse, "a cluster of \(masters) masters")
        }
        var nodeOptions = options
        nodeOptions.cluster = true
        nodeOptions.port = nil
        let directory = try makeTemporaryDirectory("cluster")
        registry.withLock { $0[directory] = 0 }
        let nodes: [RedisServerProcess]
        do { nodes = try RedisServerProcess.startAll(count: masters, nodeOptions) } catch {
            try? FileManager.default.removeItem(atPath: directory)
            registry.withLock { $0[directory] = nil }
            throw error
        }
        let cluster = RedisClusterProcess(nodes: nodes, directory: directory)
        do {
            for (index, node) in nodes.enumerated() {
                let first = index * 16384 / masters
                let last = (index + 1) * 16384 / masters - 1
                _ = try node.cli(["CLUSTER", "ADDSLOTSRANGE", String(first), String(last)])
                _ = try node.cli(["CLUSTER", "SET-CONFIG-EPOCH", String(index + 1)])
            }
            for node in nodes.dropFirst() {
                _ = try nodes[0].cli([
                    "CLUSTER", "MEET", node.host, String(node.port), String(node.clusterBusPort ?? 0),
                ])
            }
            try cluster.waitUntilStable(timeout: timeout)
        } catch {
            cluster.stop()
            throw error
        }
        return cluster
    }

    /// Stops every node and removes the directories. Calling it again does nothing.
    package func stop() {
        for node in nodes { node.stop() }
        try? FileManager.default.removeItem(atPath: directory)
        registry.withLock { $0[directory] = nil }
    }

    /// The node's id (`CLUSTER MYID`).
    package func nodeID(of node: RedisServerProcess) throws -> String {
        try node.cli(["CLUSTER", "MYID"])
    }

    /// The node that owns `slot` by its own account (during a migration: the source), or nil if no
    /// running node claims it.
    package func slotOwner(_ slot: Int) throws -> RedisServerProcess? {
        for node in nodes where node.isRunning {
            if try ownedSlots(of: node).contains(where: { $0.contains(slot) }) { return node }
        }
        return nil
    }

    /// The slot ranges the node owns by its own account.
    package func ownedSlots(of node: RedisServerProcess) throws -> [ClosedRange<Int>] {
        let view = ClusterView(try node.cli(["CLUSTER", "NODES"]))
        return view.entries.first(where: \.isMyself)?.slots ?? []
    }

    /// Waits until every node reports `cluster_state:ok` and knows every other one, no slot is being
    /// migrated, no node is flagged failing or in handshake, and all nodes agree on who owns which slot.
    ///
    /// - Throws: ``RedisHarnessError`` with `clusterNotReady` (and the last disagreement) after `timeout`.
    package func waitUntilStable(timeout: Duration = .seconds(20)) throws {
        let deadline = ContinuousClock.now + timeout
        var problem = ""
        while ContinuousClock.now < deadline {
            do {
                guard let found = try instability() else { return }
                problem = found
            } catch {
                problem = "\(error)"
            }
            usleep(20_000)
        }
        throw RedisHarnessError(.clusterNotReady, "the cluster is not stable after \(timeout): \(problem)")
    }

    /// Why the cluster is not stable yet, or nil if it is.
    private func instability() throws -> String? {
        var agreed: [String]?
        for node in nodes {
            let info = try node.cli(["CLUSTER", "INFO"])
            guard info.contains("cluster_state:ok") else { return "\(node.endpointDescription) is not ok" }
            guard
                info.contains("cluster_known_nodes:\(nodes.count)\r")
                    || info.contains("cluster_known_nodes:\(nodes.count)\n")
            else { return "\(node.endpointDescription) does not know all \(nodes.count) nodes" }
            let view = ClusterView(try node.cli(["CLUSTER", "NODES"]))
            if let problem = view.problem { return "\(node.endpointDescription) sees \(problem)" }
            let map = view.slotMap
            if let agreed, agreed != map {
                return
                    "\(node.endpointDescription) sees the slots as \(map), \(nodes[0].endpointDescription) as \(agreed)"
            }
            agreed = map
        }
        return nil
    }

    /// Moves `slots` slots (the lowest the source owns) from `source` to `destination` with
    /// `redis-cli --cluster reshard` (keys included, `pipeline` keys per MIGRATE), and returns once it is
    /// done and the cluster stable again.
    ///
    /// - Throws: ``RedisHarnessError`` with redis-cli's output when it fails.
    package func reshard(
        from source: RedisServerProcess, to destination: RedisServerProcess, slots: Int, pipeline: Int = 10,
        timeout: Duration = .seconds(60)
    ) throws {
        try startReshard(from: source, to: destination, slots: slots, pipeline: pipeline).wait(timeout: timeout)
    }

    /// Starts what ``reshard(from:to:slots:pipeline:timeout:)`` does in the background, after waiting for
    /// the cluster to be stable (redis-cli refuses otherwise), so that a test can run commands during the
    /// migration; wait on the handle for it to end.
    package func startReshard(
        from source: RedisServerProcess, to destination: RedisServerProcess, slots: Int, pipeline: Int = 10
    ) throws -> ClusterReshard {
        try waitUntilStable()
        let sourceID = try nodeID(of: source)
        let destinationID = try nodeID(of: destination)
        guard let executable = RedisTools.path(of: "redis-cli") else {
            throw RedisHarnessError(.toolMissing, "redis-cli is not installed (make deps installs it)")
        }
        let number = reshards.withLock { count -> Int in
            count += 1
            return count
        }
        let log = directory + "/reshard-\(number).log"
        var arguments = ["--cluster", "reshard", source.endpointDescription]
        if source.usesTLS, let tls = source.options.tls { arguments += tls.cliArguments }
        arguments += [
            "--cluster-from", sourceID, "--cluster-to", destinationID, "--cluster-slots", String(slots),
            "--cluster-pipeline", String(pipeline), "--cluster-yes",
        ]
        let pid = try spawnChild(executable, arguments, environment: source.cliEnvironment, output: .file(log))
        return ClusterReshard(pid: pid, log: log, cluster: self)
    }

    /// Where ``migrateSlot(_:from:to:keysPerBatch:pause:whilePaused:isolation:)`` stops for its hook.
    package enum MigrationPause: Sendable {
        /// The slot is MIGRATING on the source and IMPORTING on the destination, no key moved yet: the
        /// source still serves its keys, and answers ASK for keys it does not have.
        case beforeMovingKeys
        /// Every key has moved: the source answers ASK for all keys of the slot, the destination serves
        /// them after ASKING, and MOVED to anyone without it.
        case afterMovingKeys
    }

    /// Migrates one slot step by step, as a resharding tool does, running `whilePaused` at `pause`: a
    /// test sees ASK redirections there deterministically. The steps are also callable one by one
    /// (``beginSlotMigration(_:from:to:)``, ``moveKeys(inSlot:from:to:keysPerBatch:)``,
    /// ``finishSlotMigration(_:to:)``).
    package func migrateSlot(
        _ slot: Int, from source: RedisServerProcess, to destination: RedisServerProcess, keysPerBatch: Int = 100,
        pause: MigrationPause = .afterMovingKeys, whilePaused: (() async throws -> Void)? = nil,
        isolation: isolated (any Actor)? = #isolation
    ) async throws {
        try await offloaded { try self.beginSlotMigration(slot, from: source, to: destination) }
        if pause == .beforeMovingKeys, let whilePaused { try await whilePaused() }
        try await offloaded {
            try self.moveKeys(inSlot: slot, from: source, to: destination, keysPerBatch: keysPerBatch)
        }
        if pause == .afterMovingKeys, let whilePaused { try await whilePaused() }
        try await offloaded { try self.finishSlotMigration(slot, to: destination) }
    }

    /// Marks `slot` IMPORTING on the destination, then MIGRATING on the source.
    package func beginSlotMigration(_ slot: Int, from source: RedisServerProcess, to destination: RedisServerProcess)
        throws
    {
        let sourceID = try nodeID(of: source)
        let destinationID = try nodeID(of: destination)
        _ = try destination.cli(["CLUSTER", "SETSLOT", String(slot), "IMPORTING", sourceID])
        _ = try source.cli(["CLUSTER", "SETSLOT", String(slot), "MIGRATING", destinationID])
    }

    /// Moves every key of `slot` from the source to the destination with MIGRATE, `keysPerBatch` at a
    /// time (keys must not contain newlines: redis-cli lists them one a line).
    package func moveKeys(
        inSlot slot: Int, from source: RedisServerProcess, to destination: RedisServerProcess, keysPerBatch: Int = 100
    ) throws {
        var authentication: [String] = []
        if let password = destination.options.requirePassword { authentication = ["AUTH", password] }
        while true {
            let listed = try source.cli(["CLUSTER", "GETKEYSINSLOT", String(slot), String(max(keysPerBatch, 1))])
            let keys = listed.split(separator: "\n", omittingEmptySubsequences: true).map(String.init)
            if keys.isEmpty { return }
            _ = try source.cli(
                ["MIGRATE", destination.host, String(destination.port), "", "0", "10000"] + authentication + ["KEYS"]
                    + keys)
        }
    }

    /// Assigns `slot` to the destination (`CLUSTER SETSLOT NODE`: the destination first, then every other
    /// master), and waits until the cluster is stable.
    package func finishSlotMigration(_ slot: Int, to destination: RedisServerProcess) throws {
        let destinationID = try nodeID(of: destination)
        for node in [destination] + nodes.filter({ $0 !== destination }) where node.isRunning {
            _ = try node.cli(["CLUSTER", "SETSLOT", String(slot), "NODE", destinationID])
        }
        try waitUntilStable()
    }
}

/// A `redis-cli --cluster reshard` running in the background (``RedisClusterProcess/startReshard(from:to:slots:pipeline:)``).
/// Killed if dropped while it runs.
package final class ClusterReshard: Sendable {
    private let pid: Locked<pid_t>  // 0 once reaped
    private let exit = Locked<String?>(nil)
    /// redis-cli's output.
    package let logPath: String
    private let cluster: RedisClusterProcess

    fileprivate init(pid: pid_t, log: String, cluster: RedisClusterProcess) {
        self.pid = Locked(pid)
        self.logPath = log
        self.cluster = cluster
    }

    deinit {
        pid.withLock { pid in
            guard pid != 0 else { return }
            Glibc.kill(pid, SIGKILL)
            _ = waitChild(pid)
        }
    }

    /// Whether redis-cli still runs.
    package var isRunning: Bool {
        pid.withLock { pid in
            guard pid != 0 else { return false }
            guard case .running = waitChild(pid, options: WNOHANG) else {
                pid = 0
                return false
            }
            return true
        }
    }

    /// Waits until redis-cli ends (killing it after `timeout`) and the cluster is stable again.
    ///
    /// - Throws: ``RedisHarnessError`` with redis-cli's output when it failed or ran out of time.
    package func wait(timeout: Duration = .seconds(60)) throws {
        let deadline = ContinuousClock.now + timeout
        let status: WaitStatus? = pid.withLock { pid in
            guard pid != 0 else { return nil }
            while true {
                switch waitChild(pid, options: WNOHANG) {
                case .running:
                    if ContinuousClock.now >= deadline {
                        Glibc.kill(pid, SIGKILL)
                        _ = waitChild(pid)
                        pid = 0
                        return .signaled(SIGKILL)
                    }
                    usleep(10_000)
                case .changed(let status):
                    pid = 0
                    return status
                case .gone:
                    pid = 0
                    return .exited(-1)
                }
            }
        }
        if let status { exit.withLock { $0 = "\(status)" } }
        if let ended = exit.withLock({ $0 }), ended != "\(WaitStatus.exited(0))" {
            let output = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            let tail = output.split(separator: "\n").suffix(15).joined(separator: "\n")
            throw RedisHarnessError(.commandFailed, "redis-cli --cluster reshard \(ended); its output ends:\n\(tail)")
        }
        try cluster.waitUntilStable()
    }

    /// ``wait(timeout:)`` on a thread of its own.
    package func finished(timeout: Duration = .seconds(60)) async throws {
        try await offloaded { try self.wait(timeout: timeout) }
    }
}

/// One node's `CLUSTER NODES`, parsed.
private struct ClusterView {
    struct Entry {
        var id: String
        var port: Int
        var flags: Set<Substring>
        var linkState: Substring
        var slots: [ClosedRange<Int>]
        var openSlots: [Substring]  // "[slot->-id]", "[slot-<-id]"

        var isMyself: Bool { flags.contains("myself") }
    }

    var entries: [Entry] = []

    /// Parses lines `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`.
    init(_ text: String) {
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 8 else { continue }
            let address = fields[1].split(separator: "@")[0]
            let port = address.split(separator: ":").last.flatMap { Int($0) } ?? 0
            var slots: [ClosedRange<Int>] = []
            var open: [Substring] = []
            for field in fields.dropFirst(8) {
                if field.hasPrefix("[") {
                    open.append(field)
                } else if let dash = field.firstIndex(of: "-"), let low = Int(field[..<dash]),
                    let high = Int(field[field.index(after: dash)...])
                {
                    slots.append(low...high)
                } else if let slot = Int(field) {
                    slots.append(slot...slot)
                }
            }
            entries.append(
                Entry(
                    id: String(fields[0]), port: port, flags: Set(fields[2].split(separator: ",")),
                    linkState: fields[7], slots: slots, openSlots: open))
        }
    }

    /// What keeps this view from being stable, if anything.
    var problem: String? {
        for entry in entries {
            if let bad = entry.flags.first(where: {
                ["fail", "fail?", "handshake", "noaddr", "nofailover"].contains($0)
            }) {
                return "node \(entry.port) flagged \(bad)"
            }
            if !entry.isMyself && entry.linkState != "connected" { return "node \(entry.port) \(entry.linkState)" }
            if !entry.openSlots.isEmpty { return "open slots \(entry.openSlots) on \(entry.port)" }
        }
        return nil
    }

    /// "port: ranges" for every master, sorted: equal across nodes that agree.
    var slotMap: [String] {
        entries.map { entry in
            "\(entry.id)@\(entry.port): "
                + entry.slots.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ",")
        }.sorted()
    }
}

// MARK: - Key slots

/// The cluster slot of `key` (CRC16-XMODEM of the key, or of its hash tag `{...}`, modulo 16384), computed
/// here independently of the client.
package func redisKeySlot(_ key: String) -> Int {
    var bytes = Array(key.utf8)
    if let open = bytes.firstIndex(of: UInt8(ascii: "{")),
        let close = bytes[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1
    {
        bytes = Array(bytes[(open + 1)..<close])
    }
    var crc: UInt16 = 0
    for byte in bytes {
        crc ^= UInt16(byte) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
    }
    return Int(crc % 16384)
}

/// A hash tag whose keys (`"{TAG}anything"`) all fall in `slot`.
package func redisHashTag(forSlot slot: Int) -> String {
    var candidate = 0
    while redisKeySlot("{t\(candidate)}") != slot { candidate += 1 }
    return "t\(candidate)"
}

// MARK: - TLS material

/// Throw-away certificates for TLS tests, made with the openssl command line (EC P-256, valid a week):
/// a CA, a server certificate it signs for `IP:127.0.0.1` and `DNS:localhost`, a client certificate it
/// signs, a server certificate for another host name, and a second, unrelated CA that trusts none of
/// them.
package struct TLSMaterial: Sendable, Hashable {
    /// The directory the files are in.
    package var directory: String
    package var caCertPath: String { directory + "/ca.crt" }
    package var caKeyPath: String { directory + "/ca.key" }
    /// The server certificate (subjectAltName `IP:127.0.0.1, DNS:localhost`; extended key usage serverAuth
    /// and clientAuth, since cluster nodes present it to each other on a TLS cluster bus, where Redis always
    /// verifies the peer); see also ``withMismatchedServerCertificate()``.
    package var serverCertPath: String
    package var serverKeyPath: String { directory + "/server.key" }
    /// A client certificate (extended key usage clientAuth), for servers with `tls-auth-clients yes`.
    package var clientCertPath: String { directory + "/client.crt" }
    package var clientKeyPath: String { directory + "/client.key" }
    /// A server certificate from the same CA and key for `DNS:wrong-host.invalid` only.
    package var mismatchedServerCertPath: String { directory + "/server-wrong-host.crt" }
    /// A CA that signed nothing here: a client trusting it alone must refuse the server.
    package var otherCACertPath: String { directory + "/other-ca.crt" }
    package var otherCAKeyPath: String { directory + "/other-ca.key" }

    private init(directory: String) {
        self.directory = directory
        self.serverCertPath = directory + "/server.crt"
    }

    /// The same material with the server certificate for another host name: a client that checks host
    /// names must refuse a server that presents it.
    package func withMismatchedServerCertificate() -> TLSMaterial {
        var material = self
        material.serverCertPath = mismatchedServerCertPath
        return material
    }

    /// redis-cli's flags to trust the CA and present the client certificate.
    package var cliArguments: [String] {
        ["--tls", "--cacert", caCertPath, "--cert", clientCertPath, "--key", clientKeyPath]
    }

    /// Makes the material in `directory` (created if missing), with about seven openssl runs.
    ///
    /// - Throws: ``RedisHarnessError`` when openssl is missing or fails.
    package static func make(in directory: String) throws -> TLSMaterial {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let material = TLSMaterial(directory: directory)
        let configuration = directory + "/openssl.cnf"
        try opensslConfiguration.write(toFile: configuration, atomically: true, encoding: .utf8)
        let newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-config", configuration]
        let sign = [
            "-CA", material.caCertPath, "-CAkey", material.caKeyPath, "-days", "7", "-sha256", "-extfile",
            configuration,
        ]
        var serial = 0x4d61_6770_6965_0000 + Int.random(in: 0..<0xffff)
        func nextSerial() -> String {
            serial += 1
            return String(serial)
        }
        let server = directory + "/server.csr"
        let client = directory + "/client.csr"
        try openssl(
            ["req", "-x509"] + newKey + [
                "-keyout", material.caKeyPath, "-subj", "/CN=Magpie test CA", "-extensions", "magpie_ca", "-days", "7",
                "-sha256", "-out", material.caCertPath,
            ])
        try openssl(
            ["req", "-x509"] + newKey + [
                "-keyout", material.otherCAKeyPath, "-subj", "/CN=Magpie unrelated CA", "-extensions", "magpie_ca",
                "-days", "7", "-sha256", "-out", material.otherCACertPath,
            ])
        try openssl(
            ["req", "-new"] + newKey + ["-keyout", material.serverKeyPath, "-subj", "/CN=localhost", "-out", server])
        try openssl(
            ["x509", "-req", "-in", server] + sign + [
                "-extensions", "magpie_server", "-set_serial", nextSerial(), "-out", material.serverCertPath,
            ])
        try openssl(
            ["x509", "-req", "-in", server] + sign + [
                "-extensions", "magpie_wrong_host", "-set_serial", nextSerial(), "-out",
                material.mismatchedServerCertPath,
            ])
        try openssl(
            ["req", "-new"] + newKey + [
                "-keyout", material.clientKeyPath, "-subj", "/CN=magpie-client", "-out", client,
            ])
        try openssl(
            ["x509", "-req", "-in", client] + sign + [
                "-extensions", "magpie_client", "-set_serial", nextSerial(), "-out", material.clientCertPath,
            ])
        return material
    }

    private static let sharedMaterial = Locked<TLSMaterial?>(nil)

    /// One set of material for the whole test process, made on first use in a temporary directory that is
    /// removed when the process exits.
    package static func shared() throws -> TLSMaterial {
        try sharedMaterial.withLock { shared in
            if let shared { return shared }
            let directory = try makeTemporaryDirectory("tls")
            let material = try make(in: directory)
            shared = material
            return material
        }
    }

    private static func openssl(_ arguments: [String]) throws {
        let output = try runTool("openssl", arguments, timeout: .seconds(30))
        guard output.succeeded else {
            throw RedisHarnessError(
                .commandFailed, "openssl \(arguments.joined(separator: " ")) failed: \(output.standardError)")
        }
    }

    private static let opensslConfiguration = """
        [req]
        distinguished_name = magpie_subject
        prompt = no

        [magpie_subject]
        CN = Magpie test

        [magpie_ca]
        basicConstraints = critical, CA:TRUE
        keyUsage = critical, keyCertSign, cRLSign
        subjectKeyIdentifier = hash

        [magpie_server]
        basicConstraints = critical, CA:FALSE
        keyUsage = critical, digitalSignature
        extendedKeyUsage = serverAuth, clientAuth
        subjectAltName = IP:127.0.0.1, DNS:localhost
        subjectKeyIdentifier = hash
        authorityKeyIdentifier = keyid

        [magpie_wrong_host]
        basicConstraints = critical, CA:FALSE
        keyUsage = critical, digitalSignature
        extendedKeyUsage = serverAuth, clientAuth
        subjectAltName = DNS:wrong-host.invalid
        subjectKeyIdentifier = hash
        authorityKeyIdentifier = keyid

        [magpie_client]
        basicConstraints = critical, CA:FALSE
        keyUsage = critical, digitalSignature
        extendedKeyUsage = clientAuth
        subjectKeyIdentifier = hash
        authorityKeyIdentifier = keyid

        """
}

// MARK: - Scoped helpers

/// Starts a server with `options`, runs `body` with it, and stops it, whether `body` returns or throws.
/// Starting and stopping run on a thread of their own (they block).
package func withRedisServer<T>(
    _ options: RedisServerProcess.Options = .init(), isolation: isolated (any Actor)? = #isolation,
    _ body: (RedisServerProcess) async throws -> T
) async throws -> T {
    let server = try await offloaded { try RedisServerProcess.start(options) }
    do {
        let result = try await body(server)
        await offloaded { server.stop() }
        return result
    } catch {
        await offloaded { server.stop() }
        throw error
    }
}

/// Starts a cluster of `masters` (see ``RedisClusterProcess/start(masters:options:timeout:)``), runs
/// `body` with it, and stops it, whether `body` returns or throws.
package func withRedisCluster<T>(
    masters: Int = 3, _ options: RedisServerProcess.Options = .init(), isolation: isolated (any Actor)? = #isolation,
    _ body: (RedisClusterProcess) async throws -> T
) async throws -> T {
    let cluster = try await offloaded { try RedisClusterProcess.start(masters: masters, options: options) }
    do {
        let result = try await body(cluster)
        await offloaded { cluster.stop() }
        return result
    } catch {
        await offloaded { cluster.stop() }
        throw error
    }
}

/// Runs blocking `work` on a thread of its own and returns its result.
private func offloaded<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

private func offloaded(_ work: @escaping @Sendable () -> Void) async {
    await withCheckedContinuation { continuation in
        Thread {
            work()
            continuation.resume()
        }.start()
    }
}

// MARK: - Cleanup at exit

/// Directories of servers (and clusters, TLS material) not yet removed, with the server's pid while it
/// runs (0 otherwise).
private let registry = Locked<[String: pid_t]>([:])

private let registerExitHandler: Void = {
    atexit { killRegisteredServers() }
}()

/// The `atexit` handler: kills every registered server and removes the harness's directory.
private func killRegisteredServers() {
    let entries = registry.withLock { registry -> [String: pid_t] in
        defer { registry.removeAll() }
        return registry
    }
    for (directory, pid) in entries {
        if pid != 0 {
            Glibc.kill(pid, SIGKILL)
            _ = waitChild(pid)
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
    if let root = harnessRoot.withLock({ $0 }) { try? FileManager.default.removeItem(atPath: root) }
}

/// This process's directory for everything the harness makes, `$TMPDIR/magpie-redis-PID-XXXXXX`, made on
/// first use.
private let harnessRoot = Locked<String?>(nil)

private func harnessDirectory() throws -> String {
    try harnessRoot.withLock { root in
        if let root { return root }
        _ = registerExitHandler
        var base = NSTemporaryDirectory()
        while base.count > 1 && base.hasSuffix("/") { base.removeLast() }
        let made = try makeDirectory(template: "\(base)/magpie-redis-\(getpid())")
        root = made
        return made
    }
}

/// A new directory `label-XXXXXX` in the harness's directory.
private func makeTemporaryDirectory(_ label: String) throws -> String {
    try makeDirectory(template: harnessDirectory() + "/" + label)
}

/// mkdtemp(3) of `prefix-XXXXXX`.
private func makeDirectory(template prefix: String) throws -> String {
    var template = Array("\(prefix)-XXXXXX".utf8CString)
    let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    guard made != nil else { throw RedisHarnessError.systemCall("mkdtemp \(prefix)-XXXXXX", errno) }
    return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

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
private enum ChildOutput {
    case discard
    /// Both appended to the file.
    case file(String)
    /// Into these descriptors (write ends of pipes).
    case pipes(output: Int32, error: Int32)
}

/// posix_spawn(3) of `executable` (an absolute path) with an empty signal mask and default dispositions,
/// in the watchdog's process group (see the notes at the top of this file).
private func spawnChild(
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
private func makePipe() throws -> (read: Int32, write: Int32) {
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
private func drain(_ descriptors: [Int32], until deadline: ContinuousClock.Instant) -> ([[UInt8]], Bool) {
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
