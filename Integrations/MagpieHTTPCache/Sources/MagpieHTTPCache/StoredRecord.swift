import HTTPTypes

/// What the cache stores under a key, as one Magpie value: a response (head, lifetimes, body), or the
/// index of a URL whose responses vary (the fields they vary on, and the nonce that names this set of
/// variants: a new index, after an invalidation, makes the old variants unreachable).
enum StoredRecord: Sendable, Equatable {
    case response(StoredResponse)
    case variants(VariantIndex)

    static let formatVersion: UInt8 = 1

    func encoded() -> [UInt8] {
        var out = ByteWriter()
        out.byte(Self.formatVersion)
        switch self {
        case .response(let response):
            out.byte(0)
            response.encode(into: &out)
        case .variants(let index):
            out.byte(1)
            out.integer(Int64(bitPattern: index.nonce))
            out.integer(Int64(index.names.count))
            for name in index.names { out.string(name) }
        }
        return out.bytes
    }

    /// The record in `bytes`, or nil when they are not one (another format, or not ours).
    init?(decoding bytes: [UInt8]) {
        var reader = ByteReader(bytes)
        guard reader.byte() == Self.formatVersion, let kind = reader.byte() else { return nil }
        switch kind {
        case 0:
            guard let response = StoredResponse(from: &reader) else { return nil }
            self = .response(response)
        case 1:
            guard let nonce = reader.integer(), let count = reader.integer(), count >= 0, count < 1024 else { return nil }
            var names: [String] = []
            for _ in 0..<count {
                guard let name = reader.string() else { return nil }
                names.append(name)
            }
            self = .variants(VariantIndex(nonce: UInt64(bitPattern: nonce), names: names))
        default:
            return nil
        }
    }
}

/// The fields a URL's responses vary on.
struct VariantIndex: Sendable, Equatable {
    var nonce: UInt64
    var names: [String]
}

/// A stored response.
struct StoredResponse: Sendable, Equatable {
    /// When it was stored (ms since 1970, the cache's clock).
    var storedAt: Int64
    var lifetimes: Lifetimes
    var status: Int
    var reason: String
    /// The stored fields, ready to serve (with `Age` added).
    var fields: HTTPFields
    var body: [UInt8]

    /// Fields never stored: hop-by-hop ones (RFC 9111 §3.1), and the framing the framework writes anew.
    static let unstored: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade", "trailer",
        "proxy-authenticate", "proxy-authorization", "content-length", "age",
    ]

    init(head: HTTPResponse, body: [UInt8], lifetimes: Lifetimes, storedAt: Int64, dropCookies: Bool) {
        self.storedAt = storedAt
        self.lifetimes = lifetimes
        self.status = head.status.code
        self.reason = head.status.reasonPhrase
        var fields = HTTPFields()
        for field in head.headerFields {
            let name = field.name.canonicalName
            if Self.unstored.contains(name) || (dropCookies && name == "set-cookie") { continue }
            fields.append(field)
        }
        self.fields = fields
        self.body = body
    }

    /// The response's head as served at `now`: the stored fields and `Age` (RFC 9111 §5.1).
    func head(now: Int64) -> HTTPResponse {
        var fields = self.fields
        fields.append(HTTPField(name: .age, value: String(age(now: now) / 1000)))
        return HTTPResponse(status: HTTPResponse.Status(code: status, reasonPhrase: reason), headerFields: fields)
    }

    /// The response's current age (RFC 9111 §4.2.3), ms.
    func age(now: Int64) -> Int64 {
        let (resident, overflow) = now.subtractingReportingOverflow(storedAt)
        return max(0, lifetimes.initialAge).addingSaturated(overflow ? 0 : max(0, resident))
    }

    func encode(into out: inout ByteWriter) {
        out.integer(storedAt)
        out.integer(lifetimes.freshFor)
        out.integer(lifetimes.staleWhileRevalidate)
        out.integer(lifetimes.staleIfError)
        out.integer(lifetimes.initialAge)
        out.integer(Int64(status))
        out.string(reason)
        out.integer(Int64(fields.count))
        for field in fields {
            out.string(field.name.rawName)
            out.string(field.value)
        }
        out.bytes.append(contentsOf: body)
    }

    init?(from reader: inout ByteReader) {
        guard let storedAt = reader.integer(), let freshFor = reader.integer(), let revalidate = reader.integer(),
            let error = reader.integer(), let age = reader.integer(), let status = reader.integer(), (100...999).contains(status),
            let reason = reader.string(), let count = reader.integer(), count >= 0, count < 10_000
        else { return nil }
        var fields = HTTPFields()
        fields.reserveCapacity(Int(count) + 1)
        for _ in 0..<count {
            guard let name = reader.string(), let value = reader.string() else { return nil }
            guard let fieldName = HTTPField.Name(name) else { continue }
            fields.append(HTTPField(name: fieldName, value: value))
        }
        self.storedAt = storedAt
        self.lifetimes = Lifetimes(freshFor: freshFor, staleWhileRevalidate: revalidate, staleIfError: error, initialAge: age)
        self.status = Int(status)
        self.reason = reason
        self.fields = fields
        self.body = reader.rest()
    }
}

/// Little-endian integers and length-prefixed strings.
struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func byte(_ value: UInt8) { bytes.append(value) }

    mutating func integer(_ value: Int64) {
        let bits = UInt64(bitPattern: value)
        for index in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: bits >> (8 * UInt64(index)))) }
    }

    mutating func string(_ value: String) {
        let utf8 = Array(value.utf8)
        integer(Int64(utf8.count))
        bytes.append(contentsOf: utf8)
    }
}

struct ByteReader {
    private let bytes: [UInt8]
    private var offset = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    mutating func byte() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func integer() -> Int64? {
        guard bytes.count - offset >= 8 else { return nil }
        var value: UInt64 = 0
        for index in 0..<8 { value |= UInt64(bytes[offset + index]) << (8 * UInt64(index)) }
        offset += 8
        return Int64(bitPattern: value)
    }

    mutating func string() -> String? {
        guard let length = integer(), length >= 0, length <= Int64(bytes.count - offset) else { return nil }
        let start = offset
        offset += Int(length)
        return String(decoding: bytes[start..<offset], as: UTF8.self)
    }

    func rest() -> [UInt8] { Array(bytes[offset...]) }
}
