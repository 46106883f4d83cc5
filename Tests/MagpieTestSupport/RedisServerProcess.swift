import Foundation
import Glibc
import Magpie

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
