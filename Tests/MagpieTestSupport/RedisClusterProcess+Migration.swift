import Glibc
import Magpie

// Moving slots between the masters of a ``RedisClusterProcess``: with `redis-cli --cluster reshard`, in
// the background if need be (``ClusterReshard``), or step by step with a hook where a test sees ASK.

extension RedisClusterProcess {
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
