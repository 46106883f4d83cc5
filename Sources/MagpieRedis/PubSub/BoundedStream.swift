/// An `AsyncStream` continuation that never drops an event silently: when the consumer is `limit` events
/// behind, the next events are dropped and the consumer receives a `lost` event (as soon as there is
/// room for it), then `restored` once it caught up (with the first event after that, or with the
/// connection's own `restored`). The connection's `lost` and `restored` go through the same
/// bookkeeping: a consumer is told `lost` once per gap, and `restored` only when the gap is closed and
/// the connection is up.
final class BoundedStream<Event: Sendable>: Sendable {
    private struct Gap {
        /// Events were dropped (or the buffer is down to its last slot, kept for the loss report) and the
        /// consumer has not been told `restored` since.
        var dropped = false
        /// The consumer has been told `lost` for the current gap.
        var told = false
        /// The connection is down (between the connection's `lost` and `restored`).
        var disconnected = false
    }

    private let continuation: AsyncStream<Event>.Continuation
    private let limit: Int
    private let makeLost: @Sendable (RedisError) -> Event
    private let makeRestored: @Sendable () -> Event
    private let gap = RedisLock(Gap())

    init(continuation: AsyncStream<Event>.Continuation, limit: Int,
         lost: @escaping @Sendable (RedisError) -> Event, restored: @escaping @Sendable () -> Event) {
        self.continuation = continuation
        self.limit = limit
        self.makeLost = lost
        self.makeRestored = restored
    }

    private var overflowError: RedisError {
        RedisError(.subscriptionLost, "the consumer fell \(limit) events behind; events were dropped")
    }

    func yield(_ event: Event) {
        gap.withLock { gap in
            if gap.dropped {
                guard catchUp(&gap) else { return }  // this event falls in the gap
            }
            switch continuation.yield(event) {
            case .enqueued(let remaining):
                if remaining <= 1 { gap = Gap(dropped: true, told: false, disconnected: gap.disconnected) }
            case .dropped:
                gap = Gap(dropped: true, told: false, disconnected: gap.disconnected)
            default:
                break
            }
        }
    }

    /// The connection was lost.
    func reportLost(_ error: RedisError) {
        gap.withLock { gap in
            gap.disconnected = true
            if gap.dropped {
                if !gap.told, case .enqueued = continuation.yield(makeLost(error)) { gap.told = true }
                return
            }
            switch continuation.yield(makeLost(error)) {
            case .enqueued(let remaining):
                if remaining <= 1 { gap.dropped = true; gap.told = true }
            case .dropped:
                gap.dropped = true; gap.told = false
            default:
                break
            }
        }
    }

    /// The connection is back.
    func reportRestored() {
        gap.withLock { gap in
            gap.disconnected = false
            if gap.dropped {
                _ = catchUp(&gap)
                return
            }
            switch continuation.yield(makeRestored()) {
            case .enqueued(let remaining):
                if remaining <= 1 { gap.dropped = true; gap.told = false }
            case .dropped:
                gap.dropped = true; gap.told = true  // `lost` was delivered; `restored` follows once there is room
            default:
                break
            }
        }
    }

    /// In a gap: tells `lost` if the consumer has not had it, then (connection up, room for it)
    /// `restored`. Returns whether the gap is closed.
    private func catchUp(_ gap: inout Gap) -> Bool {
        if !gap.told {
            guard case .enqueued = continuation.yield(makeLost(overflowError)) else { return false }
            gap.told = true
        }
        guard !gap.disconnected, case .enqueued(let remaining) = continuation.yield(makeRestored()) else { return false }
        if remaining <= 1 {
            gap.told = false  // still down to the last slot: the next event starts a new gap
            return false
        }
        gap.dropped = false
        gap.told = false
        return true
    }

    func finish() { continuation.finish() }
}
