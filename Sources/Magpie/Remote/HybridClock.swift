import Synchronization

/// The versions a cache gives its remote writes: a hybrid logical clock. A version is the wall clock in
/// ms (the cache's ``CacheClock``) in its top 48 bits and 16 bits below it: with the system clock, the
/// microsecond within that millisecond (10 bits) and a 6-bit count; with an injected clock that has no
/// microseconds, a count from 0. It never moves backwards: each new version is above every version this
/// cache gave or saw (a fetched record's version is observed, so an instance whose clock lags still
/// writes above what it read); more than 64 versions in one microsecond run on into the next.
///
/// The store applies a write only when its version is above the key's current one
/// (``RemoteStore/storeIfNewer(_:forKey:expiresAt:notAfter:)``), so one instance's writes of a key take
/// effect in the order their versions were given (under the key's stripe, with the local write), and
/// across instances the later write wins as far as their clocks agree: to the microsecond on one host,
/// to the clocks' skew across hosts. With milliseconds only, a write made after another instance's
/// write of the key returned, but within the same millisecond, could get the lower version and be
/// refused, leaving the older value in the store (`magpie-bench fleet` counted about 100 such refusals
/// in 5 s, and stale reads past the bound from them).
final class HybridClock: Sendable {
    /// The latest version given or observed (versions stay below 2^63: 48 bits of ms, 16 of counter).
    private let last = Atomic<Int64>(0)
    private let clock: CacheClock

    init(clock: CacheClock) {
        self.clock = clock
    }

    /// A version above every one given or observed so far.
    func next() -> UInt64 {
        let wall: Int64
        if let microseconds = clock.microseconds?() {
            let (milliseconds, within) = max(0, microseconds).quotientAndRemainder(dividingBy: 1000)
            wall = min(milliseconds, 1 << 46) << 16 | within << 6
        } else {
            wall = min(max(0, clock.now()), 1 << 46) << 16
        }
        var current = last.load(ordering: .relaxed)
        while true {
            let candidate = max(current &+ 1, wall)
            let (exchanged, original) = last.compareExchange(expected: current, desired: candidate, ordering: .relaxed)
            if exchanged { return UInt64(candidate) }
            current = original
        }
    }

    /// Notes a version seen in the store: later ones given here are above it.
    func observe(_ version: UInt64) {
        last.raise(to: Int64(clamping: version))
    }
}
