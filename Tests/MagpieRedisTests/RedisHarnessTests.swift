import Foundation
import Glibc
import MagpieTestSupport
import NIOCore
import Testing

// The test harness itself: real servers start, stop, die and come back as the client's tests need them;
// TLS material is right; clusters form and move slots; the fake server answers as scripted.

@Suite(
    "Redis harness: single servers", .enabled(if: RedisTools.isInstalled, "redis-server, redis-cli missing (make deps)")
)
struct RedisHarnessTests {
    @Test func startsAnswersAndRemovesItsDirectory() async throws {
        let directory = try await withRedisServer { server throws in
            #expect(try server.cli(["SET", "a", "1"]) == "OK")
            #expect(try server.cli("GET", "a") == "1")
            #expect(server.url == "redis://127.0.0.1:\(server.port)")
            #expect(server.endpointDescription == "127.0.0.1:\(server.port)")
            #expect(server.port != 6379)
            #expect(server.isRunning)
            #expect(FileManager.default.fileExists(atPath: server.logPath))
            return server.directory
        }
        #expect(!FileManager.default.fileExists(atPath: directory))
    }

    @Test func errorRepliesThrow() async throws {
        try await withRedisServer { server in
            let error = #expect(throws: RedisHarnessError.self) { try server.cli(["SET", "a"]) }
            #expect(error?.code == .commandFailed)
            #expect(error?.message.contains("wrong number of arguments") == true)
        }
    }

    @Test func killedServerRestartsOnItsPort() async throws {
        try await withRedisServer { server in
            let port = server.port
            let firstPID = server.pid
            server.kill()
            #expect(!server.isRunning)
            #expect(throws: RedisHarnessError.self) { try server.cli(["PING"], timeout: .seconds(2)) }
            try server.restart()
            #expect(server.port == port)
            #expect(server.pid != firstPID)
            #expect(try server.cli("PING") == "PONG")
        }
    }

    @Test func pausedServerAnswersOnlyOnceResumed() async throws {
        try await withRedisServer { server throws in
            server.pause()
            #expect(server.isPaused)
            let error = #expect(throws: RedisHarnessError.self) {
                try server.cli(["PING"], timeout: .milliseconds(300))
            }
            #expect(error?.code == .timedOut)
            server.resume()
            #expect(try server.cli("PING") == "PONG")
        }
    }

    @Test func stopEndsAPausedServerAndIsIdempotent() throws {
        let server = try RedisServerProcess.start()
        server.pause()
        server.stop()
        #expect(!server.isRunning)
        #expect(!FileManager.default.fileExists(atPath: server.directory))
        server.stop()
        let error = #expect(throws: RedisHarnessError.self) { try server.restart() }
        #expect(error?.code == .invalidUse)
    }

    @Test func passwordAndACLUsers() async throws {
        let options = RedisServerProcess.Options(
            requirePassword: "s3cret", aclUsers: [(name: "alice", password: "wonder land")])
        try await withRedisServer(options) { server in
            #expect(try server.cli("PING") == "PONG")  // as the default user, with the password
            #expect(try server.cli(["--user", "alice", "--pass", "wonder land", "ACL", "WHOAMI"]) == "alice")
            let anonymous = try runTool("redis-cli", server.connectionArguments + ["-e", "PING"])
            #expect(!anonymous.succeeded)
            #expect((anonymous.standardOutput + anonymous.standardError).contains("NOAUTH"))
            let wrong = try runTool(
                "redis-cli", server.connectionArguments + ["--user", "alice", "--pass", "nope", "-e", "PING"])
            #expect(!wrong.succeeded)
        }
    }

    @Test func freePortsAreDistinctAndBindable() throws {
        let ports = try freeLoopbackPorts(8)
        #expect(Set(ports).count == 8)
        #expect(try !ports.contains(freeLoopbackPort()))
    }

    @Test func keySlotsMatchTheServer() async throws {
        try await withRedisServer(.init(cluster: true)) { server throws in
            for key in ["", "a", "foo", "user:1000", "{user1000}.following", "{}x", "a{b}c{d}", "ключ"] {
                #expect(try server.cli(["CLUSTER", "KEYSLOT", key]) == String(redisKeySlot(key)), "\(key)")
            }
            #expect(redisKeySlot("{\(redisHashTag(forSlot: 4242))}anything") == 4242)
        }
    }
}

@Suite(
    "Redis harness: TLS",
    .enabled(if: RedisTools.isTLSInstalled, "redis-server, redis-cli or openssl missing (make deps)"))
struct RedisHarnessTLSTests {
    @Test func serverCertificateNamesLoopbackAndChainsToTheCA() throws {
        let tls = try TLSMaterial.shared()
        for check in [["-verify_ip", "127.0.0.1"], ["-verify_hostname", "localhost"]] {
            let good = try runTool("openssl", ["verify", "-CAfile", tls.caCertPath] + check + [tls.serverCertPath])
            #expect(good.succeeded, "\(good.standardError)")
            let mismatched = try runTool(
                "openssl", ["verify", "-CAfile", tls.caCertPath] + check + [tls.mismatchedServerCertPath])
            #expect(!mismatched.succeeded)
            let otherCA = try runTool(
                "openssl", ["verify", "-CAfile", tls.otherCACertPath] + check + [tls.serverCertPath])
            #expect(!otherCA.succeeded)
        }
        let client = try runTool("openssl", ["verify", "-CAfile", tls.caCertPath, tls.clientCertPath])
        #expect(client.succeeded)
    }

    @Test func tlsServerIsTrustedThroughItsCAOnly() async throws {
        let tls = try TLSMaterial.shared()
        try await withRedisServer(.init(tls: tls)) { server in
            #expect(server.usesTLS)
            #expect(server.tlsPort == server.port)
            #expect(server.url == "rediss://127.0.0.1:\(server.port)")
            #expect(try server.cli("PING") == "PONG")
            let port = String(server.port)
            let otherCA = try runTool(
                "redis-cli", ["-h", server.host, "-p", port, "--tls", "--cacert", tls.otherCACertPath, "-e", "PING"])
            #expect(!otherCA.succeeded)
            #expect(otherCA.standardError.contains("certificate verify failed"))
            let plaintext = try runTool(
                "redis-cli", ["-h", server.host, "-p", port, "-e", "PING"], timeout: .seconds(5))
            #expect(!plaintext.standardOutput.contains("PONG"))
        }
    }

    @Test func clientCertificatesCanBeRequired() async throws {
        let tls = try TLSMaterial.shared()
        try await withRedisServer(.init(tls: tls, tlsAlsoPlaintext: true, tlsAuthClients: true)) { server in
            #expect(!server.usesTLS)
            #expect(try server.cli("PING") == "PONG")  // over the plaintext port
            let tlsPort = try #require(server.tlsPort)
            let withCertificate = try runTool(
                "redis-cli", ["-p", String(tlsPort)] + tls.cliArguments + ["-e", "PING"])
            #expect(withCertificate.standardOutput.contains("PONG"))
            let without = try runTool(
                "redis-cli", ["-p", String(tlsPort), "--tls", "--cacert", tls.caCertPath, "-e", "PING"])
            #expect(!without.succeeded)
        }
    }
}

@Suite(
    "Redis harness: clusters", .serialized,
    .enabled(if: RedisTools.isInstalled, "redis-server, redis-cli missing (make deps)"))
struct RedisHarnessClusterTests {
    @Test(.timeLimit(.minutes(1))) func threeMastersCoverEverySlot() async throws {
        try await withRedisCluster { cluster in
            #expect(cluster.nodes.count == 3)
            #expect(Set(cluster.seedURLs).count == 3)
            var covered = 0
            for node in cluster.nodes {
                let info = try node.cli(["CLUSTER", "INFO"])
                #expect(info.contains("cluster_state:ok"))
                #expect(info.contains("cluster_slots_assigned:16384"))
                covered += try cluster.ownedSlots(of: node).reduce(0) { $0 + $1.count }
            }
            #expect(covered == 16384)
            #expect(try cluster.slotOwner(0) === cluster.nodes[0])
            #expect(try cluster.slotOwner(16383) === cluster.nodes[2])
            #expect(try cluster.nodeID(of: cluster.nodes[0]).count == 40)

            let key = "{\(redisHashTag(forSlot: 16000))}k"
            #expect(try cluster.nodes[2].cli(["SET", key, "v"]) == "OK")
            let moved = #expect(throws: RedisHarnessError.self) { try cluster.nodes[0].cli(["GET", key]) }
            #expect(moved?.message.contains("MOVED 16000 127.0.0.1:\(cluster.nodes[2].port)") == true)
        }
    }

    @Test(.timeLimit(.minutes(1))) func reshardsAndMigrationsMoveSlots() async throws {
        try await withRedisCluster { cluster in
            let (a, b, c) = (cluster.nodes[0], cluster.nodes[1], cluster.nodes[2])
            let tag = redisHashTag(forSlot: 5)
            for index in 0..<20 { _ = try a.cli(["SET", "{\(tag)}\(index)", String(index)]) }

            try cluster.reshard(from: a, to: b, slots: 10)
            #expect(try cluster.slotOwner(5) === b)
            #expect(try cluster.ownedSlots(of: b).contains(0...9))
            #expect(try b.cli(["GET", "{\(tag)}7"]) == "7")

            let reshard = try cluster.startReshard(from: a, to: c, slots: 50, pipeline: 1)
            try await reshard.finished()
            #expect(!reshard.isRunning)
            #expect(try cluster.slotOwner(10) === c)
            #expect(try cluster.slotOwner(59) === c)

            let slot = 100
            let key = "{\(redisHashTag(forSlot: slot))}x"
            #expect(try a.cli(["SET", key, "1"]) == "OK")
            try await cluster.migrateSlot(slot, from: a, to: b) {
                let ask = #expect(throws: RedisHarnessError.self) { try a.cli(["GET", key]) }
                #expect(ask?.message.contains("ASK \(slot) 127.0.0.1:\(b.port)") == true)
                let moved = #expect(throws: RedisHarnessError.self) { try b.cli(["GET", key]) }  // no ASKING
                #expect(moved?.message.contains("MOVED \(slot) 127.0.0.1:\(a.port)") == true)
            }
            #expect(try cluster.slotOwner(slot) === b)
            #expect(try b.cli(["GET", key]) == "1")
        }
    }
}

@Suite("Fake Redis server")
struct FakeRedisServerTests {
    @Test func answersAsScriptedAndHelloByDefault() async throws {
        try await withFakeRedisServer(handler: { command, reply in
            if command == ["PING"] { reply.send("+scripted\r\n") }
        }) { server in
            let connection = try RawConnection(port: server.port)
            try connection.send("*1\r\n$4\r\nPING\r\n")
            #expect(try await connection.read(count: 11) == "+scripted\r\n")
            try connection.send("*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
            #expect(try await connection.read(count: 20) == "%1\r\n+server\r\n+fake\r\n")
            try connection.send("INLINE command  here\r\n")
            #expect(try await connection.read(count: 1, timeout: .milliseconds(200)) == "")  // no answer, ever
            #expect(server.acceptedConnections == 1)
            #expect(server.receivedCommands == [["PING"], ["HELLO", "3"], ["INLINE", "command", "here"]])
        }
    }

    @Test func handlerCanCloseHoldAndAnswerLater() async throws {
        try await withFakeRedisServer(handler: { command, reply in
            switch command.first {
            case "QUIT": reply.close()
            case "HELLO": reply.hold()
            case "LATER":
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) {
                    reply.send([UInt8]("+late\r\n".utf8))
                }
            default: break
            }
        }) { server in
            let first = try RawConnection(port: server.port)
            try first.send("*1\r\n$5\r\nHELLO\r\n*1\r\n$5\r\nLATER\r\n")
            #expect(try await first.read(count: 7) == "+late\r\n")  // HELLO held: no default answer before it
            let second = try RawConnection(port: server.port)
            try second.send("*1\r\n$4\r\nQUIT\r\n")
            #expect(try await second.read(count: 1) == "")  // closed
            #expect(server.acceptedConnections == 2)
            await server.dropConnections()
            #expect(try await first.read(count: 1) == "")
        }
    }

    @Test func parserWaitsForWholeCommands() throws {
        let wire = Array("*2\r\n$3\r\nGET\r\n$5\r\nab\r\nc\r\n*1\r\n$4\r\nPING\r\n".utf8)
        for split in 0...wire.count {
            var buffer = ByteBuffer(bytes: wire[..<split])
            var commands: [[String]] = []
            while let command = try FakeRESPParser.next(from: &buffer) { commands.append(command) }
            buffer.writeBytes(wire[split...])
            while let command = try FakeRESPParser.next(from: &buffer) { commands.append(command) }
            #expect(commands == [["GET", "ab\r\nc"], ["PING"]], "split at \(split)")
        }
        var malformed = ByteBuffer(string: "*1\r\n:4\r\n")
        #expect(throws: FakeRESPParser.Malformed.self) { try FakeRESPParser.next(from: &malformed) }
    }
}

/// A TCP connection to 127.0.0.1 for the fake server's tests, with plain sockets; reads block a thread of
/// their own, not one of the cooperative pool (where the fake server's handlers may need to run).
private final class RawConnection: Sendable {
    private let socket: Int32

    init(port: Int) throws {
        socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socket >= 0 else { throw RawConnectionError(call: "socket", errno: errno) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        guard connected else {
            let number = errno
            close(socket)
            throw RawConnectionError(call: "connect", errno: number)
        }
    }

    deinit { close(socket) }

    func send(_ text: String) throws {
        let bytes = Array(text.utf8)
        let sent = bytes.withUnsafeBytes { Glibc.send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent == bytes.count else { throw RawConnectionError(call: "send", errno: errno) }
    }

    /// Up to `count` bytes: fewer if the connection closes or `timeout` passes first.
    func read(count: Int, timeout: Duration = .seconds(5)) async throws -> String {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try self.blockingRead(count: count, timeout: timeout) }) }
                .start()
        }
    }

    private func blockingRead(count: Int, timeout: Duration) throws -> String {
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        while received.count < count {
            let remaining = deadline - .now
            guard remaining > .zero else { break }
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(
                remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1)
            guard poll(&descriptor, 1, milliseconds) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: count - received.count)
            let got = chunk.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
            if got < 0 && errno == ECONNRESET { break }
            guard got >= 0 else { throw RawConnectionError(call: "recv", errno: errno) }
            if got == 0 { break }
            received += chunk[0..<got]
        }
        return String(decoding: received, as: UTF8.self)
    }
}

private struct RawConnectionError: Error {
    var call: String
    var errno: Int32
}
