import MagpieTestSupport
import NIOSSL
import Testing

@testable import MagpieRedis

@Suite("TLS", .serialized, .timeLimit(.minutes(1)))
struct RedisTLSTests {
    @Test("TLS with the right CA works; the wrong CA, or the system roots, are refused")
    func verification() async throws {
        let directory = TemporaryDirectory("magpie-tls")
        defer { directory.cleanup() }
        let material = try TLSMaterial.make(in: directory.path)
        try await withRedisServer(.init(tls: material)) { server in
            let port = try #require(server.tlsPort)
            let good = try RedisClient(testConfiguration(port: port) { $0.tls = try? RedisTLS.trusting(caFile: material.caCertPath) })
            try await good.set("secure", Array("yes".utf8))
            #expect(try await good.get("secure").map { String(buffer: $0) } == "yes")
            await good.shutdown()

            // A name the certificate carries works as well.
            let named = try RedisClient(testConfiguration(port: port) {
                $0.tls = try? RedisTLS.trusting(caFile: material.caCertPath, serverHostname: "localhost")
            })
            try await named.ping()
            await named.shutdown()

            let attempts: [(String, RedisTLS)] = [
                ("other CA", try RedisTLS.trusting(caFile: material.otherCACertPath)),
                ("system roots", RedisTLS()),
            ]
            for (label, tls) in attempts {
                let client = try RedisClient(testConfiguration(port: port) {
                    $0.tls = tls
                    $0.breaker.failureThreshold = 100
                })
                await #expect("\(label)") {
                    try await client.ping()
                } throws: { error in
                    guard let error = error as? RedisError else { return false }
                    return error.code == .tlsFailure
                }
                await client.shutdown()
            }
        }
        // A certificate from the trusted CA, but for another host: refused (the name is checked, not just
        // the signature).
        try await withRedisServer(.init(tls: material.withMismatchedServerCertificate())) { server in
            let port = try #require(server.tlsPort)
            for name in [nil, "localhost"] as [String?] {
                let client = try RedisClient(testConfiguration(port: port) {
                    $0.tls = try? RedisTLS.trusting(caFile: material.caCertPath, serverHostname: name)
                    $0.breaker.failureThreshold = 100
                })
                await #expect("\(name ?? "by IP")") {
                    try await client.ping()
                } throws: { error in
                    (error as? RedisError)?.code == .tlsFailure
                }
                await client.shutdown()
            }
        }
    }
}
