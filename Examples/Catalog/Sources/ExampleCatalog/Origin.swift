import Foundation
import Synchronization

/// The slow backend the service caches: a product catalog that takes `latency` per call (a database or
/// another service), and can be told to fail for a while. It counts every call and every failure itself,
/// so that the cache's own counters can be checked against it.
public final class Origin: Sendable {
    public let latency: Duration
    public let calls = Atomic<Int>(0)
    public let failures = Atomic<Int>(0)
    /// Until when (`ContinuousClock` nanoseconds since `epoch`) every call fails; 0: healthy.
    private let failingUntil = Atomic<Int64>(0)
    private let epoch = ContinuousClock.now

    public struct Unavailable: Error, CustomStringConvertible {
        public var description: String { "the origin is unavailable (told to fail)" }
    }

    public init(latency: Duration) {
        self.latency = latency
    }

    /// The product, after `latency`; throws ``Unavailable`` while the origin is failing.
    public func product(_ id: Int) async throws -> Product {
        calls.add(1, ordering: .relaxed)
        if latency > .zero { try await Task.sleep(for: latency) }
        if isFailing {
            failures.add(1, ordering: .relaxed)
            throw Unavailable()
        }
        return Product(id)
    }

    /// Fails every call for `duration` from now (zero: heals at once).
    public func fail(for duration: Duration) {
        failingUntil.store(duration > .zero ? nanoseconds(since: epoch, to: .now + duration) : 0, ordering: .relaxed)
    }

    public var isFailing: Bool {
        let until = failingUntil.load(ordering: .relaxed)
        return until != 0 && nanoseconds(since: epoch, to: .now) < until
    }

    private func nanoseconds(since start: ContinuousClock.Instant, to instant: ContinuousClock.Instant) -> Int64 {
        let (seconds, attoseconds) = (instant - start).components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
