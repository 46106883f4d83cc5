import HTTPTypes

/// The `Cache-Control` directives of a message (RFC 9111 §5.2), every field line together; names
/// compared case-insensitively, values unquoted. A duplicated directive keeps its first value.
struct CacheControl: Sendable {
    private(set) var directives: [String: String?] = [:]

    init(_ fields: HTTPFields) {
        for line in fields[values: .cacheControl] {
            for part in Self.split(line) {
                let trimmed = part.trimmingWhitespace
                guard !trimmed.isEmpty else { continue }
                let name: String
                var value: String?
                if let equals = trimmed.firstIndex(of: "=") {
                    name = String(trimmed[..<equals]).trimmingWhitespace.lowercased()
                    var raw = String(trimmed[trimmed.index(after: equals)...]).trimmingWhitespace
                    if raw.count >= 2, raw.hasPrefix("\""), raw.hasSuffix("\"") { raw = String(raw.dropFirst().dropLast()) }
                    value = raw
                } else {
                    name = trimmed.lowercased()
                }
                if directives[name] == nil { directives[name] = .some(value) }
            }
        }
    }

    /// Splits at commas outside quoted strings.
    private static func split(_ line: String) -> [Substring] {
        var parts: [Substring] = []
        var start = line.startIndex
        var quoted = false
        var index = line.startIndex
        while index < line.endIndex {
            let character = line[index]
            if character == "\"" { quoted.toggle() }
            if character == ",", !quoted {
                parts.append(line[start..<index])
                start = line.index(after: index)
            }
            index = line.index(after: index)
        }
        parts.append(line[start...])
        return parts
    }

    func has(_ name: String) -> Bool { directives[name] != nil }

    /// A delta-seconds directive (`max-age=60`): its value, 0 for an invalid one (RFC 9111 §4.2.1: an
    /// invalid value makes the response stale), nil when absent.
    func seconds(_ name: String) -> Int64? {
        guard let entry = directives[name] else { return nil }
        guard let text = entry, !text.isEmpty, text.allSatisfy({ $0.isASCII && $0.isNumber }) else { return 0 }
        return Int64(text.prefix(10)) ?? Int64(Int32.max)  // larger values: "infinity" (RFC 9111 §1.2.2)
    }

    var isEmpty: Bool { directives.isEmpty }
}

extension StringProtocol {
    var trimmingWhitespace: String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}

/// HTTP dates (RFC 9110 §5.6.7), IMF-fixdate only: `Sun, 06 Nov 1994 08:49:37 GMT`. The obsolete
/// forms are not parsed; an `Expires` in one counts as already expired, as RFC 9111 §5.3 asks of an
/// invalid date.
public enum HTTPDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Milliseconds since 1970, or nil.
    public static func parse(_ text: String) -> Int64? {
        let parts = text.trimmingWhitespace.split(separator: " ")
        guard parts.count == 6, parts[0].hasSuffix(","), parts[5] == "GMT",
            let day = Int64(parts[1]), (1...31).contains(day),
            let monthIndex = months.firstIndex(where: { $0 == parts[2] }),
            let year = Int64(parts[3]), year >= 1970, year < 10_000
        else { return nil }
        let clock = parts[4].split(separator: ":")
        guard clock.count == 3, let hour = Int64(clock[0]), let minute = Int64(clock[1]), let second = Int64(clock[2]),
            (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second)
        else { return nil }
        let days = daysFromCivil(year: year, month: Int64(monthIndex) + 1, day: day)
        return ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000
    }

    /// `milliseconds` since 1970 as an IMF-fixdate.
    public static func format(_ milliseconds: Int64) -> String {
        let seconds = max(0, milliseconds) / 1000
        let days = seconds / 86_400
        let rest = seconds % 86_400
        let (year, month, day) = civilFromDays(days)
        let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][Int((days % 7 + 7) % 7)]
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(weekday), \(two(day)) \(months[Int(month - 1)]) \(year) \(two(rest / 3600)):\(two(rest / 60 % 60)):\(two(rest % 60)) GMT"
    }

    // Howard Hinnant's days-from-civil and its inverse (proleptic Gregorian calendar).
    private static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    private static func civilFromDays(_ days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
