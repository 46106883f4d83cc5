/// A server address: host name or IP address, and TCP port.
public struct RedisEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int = 6379) {
        self.host = host
        self.port = port
    }

    /// Parses `host:port` (an IPv6 address as `[::1]:6379` or, as cluster replies write it, `::1:6379`).
    public init?<S: StringProtocol>(hostAndPort text: S) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
              (1...65535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
