import Foundation
import Magpie

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
