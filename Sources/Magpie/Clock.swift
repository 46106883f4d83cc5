import Glibc

/// The wall clock Magpie reads for expiry and freshness, in milliseconds since 1970, and the timer
/// the loader API's timeouts wait on. Inject one in tests to move time without sleeping.
public struct CacheClock: Sendable, Equatable {
    /// Milliseconds since 1970-01-01 UTC.
    public let now: @Sendable () -> Int64
    /// Suspends for a duration (``LoaderOptions/softTimeout`` and ``LoaderOptions/hardTimeout`` wait on
    /// it); throws `CancellationError` when its task is cancelled.
    public let sleep: @Sendable (Duration) async throws -> Void
    /// Microseconds since 1970 on the same clock as `now`, when the clock has them (the system clock):
    /// the remote tier's write versions use them to order writes made within one millisecond. Nil for
    /// an injected clock (versions then carry milliseconds only).
    let microseconds: (@Sendable () -> Int64)?
    /// Who this clock is: two clocks are equal when they are the same clock (copies of one value).
    private let identity = Identity()

    private final class Identity: Sendable {}

    /// Whether `lhs` and `rhs` are the same clock (copies of one ``CacheClock`` value, such as ``system``).
    public static func == (lhs: CacheClock, rhs: CacheClock) -> Bool { lhs.identity === rhs.identity }

    /// A clock that calls `now`, and whose timers wait on `sleep` (by default `Task.sleep`).
    public init(
        now: @escaping @Sendable () -> Int64,
        sleep: @escaping @Sendable (Duration) async throws -> Void = { try await Task.sleep(for: $0) }
    ) {
        self.now = now
        self.sleep = sleep
        self.microseconds = nil
    }

    /// A clock with a microsecond reading too (`microseconds() / 1000` must equal `now()` read at the
    /// same instant).
    init(now: @escaping @Sendable () -> Int64, microseconds: @escaping @Sendable () -> Int64) {
        self.now = now
        self.sleep = { try await Task.sleep(for: $0) }
        self.microseconds = microseconds
    }

    /// The system's real-time clock (`CLOCK_REALTIME`), with `Task.sleep` for timers.
    public static let system = CacheClock(
        now: {
            var ts = timespec()
            clock_gettime(CLOCK_REALTIME, &ts)
            return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
        },
        microseconds: {
            var ts = timespec()
            clock_gettime(CLOCK_REALTIME, &ts)
            return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1_000
        })
}

/// When an entry stops being served.
public enum Expiry: Sendable, Hashable {
    /// Never expires (it may still be evicted).
    case never
    /// Expires this long after the store, by the tier's ``CacheClock``.
    case after(Duration)
    /// Expires at this instant, in milliseconds since 1970.
    case at(millisecondsSince1970: Int64)

    /// The absolute expiry in milliseconds since 1970, 0 for never. Past instants stay past.
    func deadline(now: Int64) -> Int64 {
        switch self {
        case .never:
            return 0
        case .after(let duration):
            let milliseconds = duration.wholeMilliseconds
            if milliseconds == Int64.max { return Int64.max }
            if milliseconds == Int64.min { return 1 }
            let total = now.addingReportingOverflow(milliseconds)
            return total.overflow ? Int64.max : max(1, total.partialValue)
        case .at(let instant):
            return max(1, instant)
        }
    }
}

extension Duration {
    /// Whole milliseconds, truncated toward zero (so a bound in milliseconds is never looser than the
    /// duration), saturating at `Int64.max` / `Int64.min`.
    var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        let milliseconds = seconds.multipliedReportingOverflow(by: 1000)
        if milliseconds.overflow { return seconds > 0 ? Int64.max : Int64.min }
        let total = milliseconds.partialValue.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        if total.overflow { return seconds > 0 ? Int64.max : Int64.min }
        return total.partialValue
    }
}

extension Int64 {
    /// `self + other`, clamped to `Int64`'s range.
    func saturatingAdd(_ other: Int64) -> Int64 {
        let sum = addingReportingOverflow(other)
        return sum.overflow ? (other > 0 ? Int64.max : Int64.min) : sum.partialValue
    }
}
