import Foundation
import Synchronization

/// The slow backend the service caches: a product catalog that takes `latency` per call (a database or
/// another service), and can be told to fail for a while. It counts every call and every failure itself,
/// so that the cache's own counters can be checked against it.
final class Origin: Sendable {
    let latency: Duration
    let calls = Atomic<Int>(0)
    let failures = Atomic<Int>(0)
    /// Until when (`ContinuousClock` nanoseconds since `epoch`) every call fails; 0: healthy.
    private let failingUntil = Atomic<Int64>(0)
    private let epoch = ContinuousClock.now

    struct Unavailable: Error, CustomStringConvertible {
        var description: String { "the origin is unavailable (told to fail)" }
    }

    init(latency: Duration) {
        self.latency = latency
    }

    /// The product's JSON, after `latency`; throws ``Unavailable`` while the origin is failing.
    func product(_ id: Int) async throws -> [UInt8] {
        calls.add(1, ordering: .relaxed)
        if latency > .zero { try await Task.sleep(for: latency) }
        if isFailing {
            failures.add(1, ordering: .relaxed)
            throw Unavailable()
        }
        return Self.productJSON(id)
    }

    /// Fails every call for `duration` from now (zero: heals at once).
    func fail(for duration: Duration) {
        failingUntil.store(duration > .zero ? nanoseconds(since: epoch, to: .now + duration) : 0, ordering: .relaxed)
    }

    var isFailing: Bool {
        let until = failingUntil.load(ordering: .relaxed)
        return until != 0 && nanoseconds(since: epoch, to: .now) < until
    }

    private func nanoseconds(since start: ContinuousClock.Instant, to instant: ContinuousClock.Instant) -> Int64 {
        let (seconds, attoseconds) = (instant - start).components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// A product of about 400 bytes of JSON, the same for the same id.
    static func productJSON(_ id: Int) -> [UInt8] {
        let price = Double((id &* 7919) % 100_000) / 100
        let stock = (id &* 31) % 500
        let json = """
            {"id":\(id),"name":"Product \(id)","price":\(price),"currency":"EUR","stock":\(stock),\
            "category":"category-\(id % 40)","description":"Product \(id) is a well-made thing that a \
            service would fetch from a slow database or another service: the kind of record that is read \
            far more often than it changes.","tags":["t\(id % 7)","t\(id % 11)","t\(id % 13)"]}
            """
        return Array(json.utf8)
    }
}
