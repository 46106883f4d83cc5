import ArgumentParser
import Foundation
import Magpie

/// A request trace held in memory: per request the object id and size, and the index of the next
/// request for the same object (what Belady's optimum needs).
struct Trace {
    enum Format: String, ExpressibleByArgument, CaseIterable {
        /// Decided by the file name: `.oracleGeneral` (anywhere in it) is binary, anything else text.
        case auto
        /// libCacheSim's binary format: packed little-endian 24-byte records
        /// `u32 time, u64 object id, u32 object size, i64 next access (ignored: recomputed)`.
        case oracleGeneral
        /// One request per line: `id[,size]`. A numeric id is used as is, any other is hashed; a missing
        /// size is `defaultSize`. Blank lines and lines starting with `#` are skipped.
        case csv
    }

    /// `nextAccess` of a request whose object is never requested again.
    static let never = Int32.max

    var ids: [UInt64] = []
    var sizes: [UInt32] = []
    var nextAccess: [Int32] = []
    /// Distinct objects.
    var objects = 0
    /// The sum of the distinct objects' sizes (each at its first request): the working set.
    var workingSetBytes = 0

    var count: Int { ids.count }

    static func load(_ path: String, format: Format, defaultSize: UInt32) throws -> Trace {
        guard let data = FileManager.default.contents(atPath: path) else { throw ValidationError("cannot read \(path)") }
        var trace = Trace()
        let resolved: Format = format != .auto ? format : (path.contains("oracleGeneral") ? .oracleGeneral : .csv)
        switch resolved {
        case .oracleGeneral:
            guard data.count % 24 == 0 else {
                throw ValidationError("\(path): \(data.count) bytes is not a whole number of 24-byte oracleGeneral records")
            }
            let records = data.count / 24
            trace.ids.reserveCapacity(records)
            trace.sizes.reserveCapacity(records)
            data.withUnsafeBytes { raw in
                for record in 0..<records {
                    trace.ids.append(UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: record * 24 + 4, as: UInt64.self)))
                    trace.sizes.append(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: record * 24 + 12, as: UInt32.self)))
                }
            }
        case .csv, .auto:
            let hasher = KeyHash(seed: 0)
            for line in String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline) {
                let text = line.trimmingCharacters(in: .whitespaces)
                if text.isEmpty || text.hasPrefix("#") { continue }
                let fields = text.split(separator: ",", maxSplits: 2).map { $0.trimmingCharacters(in: .whitespaces) }
                let id = UInt64(fields[0]) ?? hasher.hash(fields[0].utf8)
                var size = defaultSize
                if fields.count > 1 {
                    guard let parsed = UInt32(fields[1]) else { throw ValidationError("\(path): bad size in line \"\(text)\"") }
                    size = parsed
                }
                trace.ids.append(id)
                trace.sizes.append(size)
            }
        }
        guard trace.count > 0 else { throw ValidationError("\(path): no requests") }
        guard trace.count < Int(Int32.max) else { throw ValidationError("\(path): more than 2^31 requests") }
        trace.computeNextAccess()
        return trace
    }

    /// The next-access indexes (a backward pass), the object count and the working set.
    mutating func computeNextAccess() {
        nextAccess = [Int32](repeating: Self.never, count: count)
        var seen: [UInt64: Int32] = [:]
        seen.reserveCapacity(count / 2)
        for index in stride(from: count - 1, through: 0, by: -1) {
            if let next = seen.updateValue(Int32(index), forKey: ids[index]) { nextAccess[index] = next }
        }
        objects = seen.count
        workingSetBytes = 0
        for first in seen.values { workingSetBytes += Int(sizes[Int(first)]) }
    }
}
