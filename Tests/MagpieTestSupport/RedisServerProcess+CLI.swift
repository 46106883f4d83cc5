import Foundation

// Talking to a server from outside: redis-cli with the server's flags and password, and its log.

extension RedisServerProcess {
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
}
