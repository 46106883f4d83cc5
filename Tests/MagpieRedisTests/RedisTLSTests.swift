#if TLS  // the client's TLS (without the trait, RedisTLSTraitOffTests below)
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
#else
import MagpieRedis
import Testing

@Suite("TLS: built without the trait")
struct RedisTLSTraitOffTests {
    @Test("a rediss:// URL or a tls setting is refused when a client is made, never connected in plain text")
    func refused() async throws {
        let url = try RedisConfiguration(url: "rediss://127.0.0.1:6390")
        #expect(url.tls != nil)
        var setting = RedisConfiguration(endpoints: [RedisEndpoint(host: "127.0.0.1", port: 6390)])
        setting.tls = RedisTLS(serverHostname: "cache.internal")
        for configuration in [url, setting] {
            let error = #expect(throws: RedisError.self) { try RedisClient(configuration) }
            #expect(error?.code == .invalidConfiguration)
            let clusterError = #expect(throws: RedisError.self) { try RedisClusterClient(configuration) }
            #expect(clusterError?.code == .invalidConfiguration)
        }
        // Without TLS asked for, the same client is made.
        let plain = try RedisClient(RedisConfiguration(endpoints: [RedisEndpoint(host: "127.0.0.1", port: 6390)]))
        await plain.shutdown()
    }
}
#endif
