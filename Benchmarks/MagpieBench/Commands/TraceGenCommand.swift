import ArgumentParser
import Foundation

/// `magpie-bench trace-gen`: a synthetic request trace (`id,size` per line) whose popularity drifts and
/// which is cut by scans, for checking an eviction policy beyond one real trace: Zipf-popular objects
/// whose ranks rotate to new objects every `--drift-every` requests, and every `--scan-every` requests a
/// run of `--scan-length` objects requested once and never again.
struct TraceGen: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "trace-gen", abstract: "Write a seeded synthetic trace with drifting Zipf popularity and scans.")

    @Option(help: "Requests.") var requests = 2_000_000
    @Option(help: "Objects in the popularity ranking.") var objects = 100_000
    @Option(help: "Zipf exponent.") var alpha = 0.9
    @Option(help: "Requests between popularity shifts (0: never).") var driftEvery = 100_000
    @Option(help: "Objects the ranking rotates by at each shift.") var driftShift = 5_000
    @Option(help: "Requests between scans (0: no scans).") var scanEvery = 250_000
    @Option(help: "Objects in one scan, each requested once.") var scanLength = 50_000
    @Option(help: "Smallest object size (bytes); sizes are log-uniform per object.") var minSize = 512
    @Option(help: "Largest object size (bytes).") var maxSize = 65_536
    @Option(help: "Seed.") var seed: UInt64 = 1
    @Option(name: .shortAndLong, help: "Output file.") var output: String

    func validate() throws {
        guard requests > 0, objects > 0, alpha > 0, driftEvery >= 0, driftShift >= 0, scanEvery >= 0, scanLength >= 0 else {
            throw ValidationError("counts must be positive (drift and scan settings may be 0)")
        }
        guard minSize >= 1, maxSize >= minSize else { throw ValidationError("need 1 ≤ --min-size ≤ --max-size") }
    }

    /// The size of an object: log-uniform in [minSize, maxSize], fixed by its id.
    func size(of id: UInt64) -> Int {
        let u = Double(splitmix64(id ^ seed) >> 11) / Double(1 << 53)
        return Int(exp(log(Double(minSize)) + u * (log(Double(maxSize)) - log(Double(minSize)))))
    }

    func run() throws {
        var cumulative = [Double](repeating: 0, count: objects)
        var total = 0.0
        for rank in 0..<objects {
            total += 1 / pow(Double(rank + 1), alpha)
            cumulative[rank] = total
        }
        var state = seed
        var offset = 0
        var scanned: UInt64 = 0
        var text = ""
        text.reserveCapacity(requests * 16)
        var request = 0
        while request < requests {
            if driftEvery > 0 && request > 0 && request % driftEvery == 0 { offset = (offset + driftShift) % objects }
            if scanEvery > 0 && request > 0 && request % scanEvery == 0 {
                for _ in 0..<min(scanLength, requests - request) {
                    let id = (1 << 40) + scanned  // never requested again
                    scanned += 1
                    text += "\(id),\(size(of: id))\n"
                    request += 1
                }
                if request >= requests { break }
            }
            state = splitmix64(state)
            let target = Double(state >> 11) / Double(1 << 53) * total
            var (low, high) = (0, objects - 1)
            while low < high {
                let middle = (low + high) / 2
                if cumulative[middle] < target { low = middle + 1 } else { high = middle }
            }
            let id = UInt64((low + offset) % objects)
            text += "\(id),\(size(of: id))\n"
            request += 1
        }
        try text.write(toFile: output, atomically: true, encoding: .utf8)
        print("wrote \(requests) requests (\(scanned) in scans) to \(output)")
    }
}
