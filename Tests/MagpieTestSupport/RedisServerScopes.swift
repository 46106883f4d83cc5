import Foundation
import Glibc
import Magpie

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
package func offloaded<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

package func offloaded(_ work: @escaping @Sendable () -> Void) async {
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
let registry = Locked<[String: pid_t]>([:])

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

func harnessDirectory() throws -> String {
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
func makeTemporaryDirectory(_ label: String) throws -> String {
    try makeDirectory(template: harnessDirectory() + "/" + label)
}

/// mkdtemp(3) of `prefix-XXXXXX`.
private func makeDirectory(template prefix: String) throws -> String {
    var template = Array("\(prefix)-XXXXXX".utf8CString)
    let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    guard made != nil else { throw RedisHarnessError.systemCall("mkdtemp \(prefix)-XXXXXX", errno) }
    return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
