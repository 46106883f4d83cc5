import NIOCore
import Synchronization

// The pool's hold while its node answers `LOADING` (``RedisConfiguration/Breaker/loadingHold``): the
// node is reachable and serves nothing, so calls fail at once for the hold after each such reply.
extension RedisNodePool {
    /// Whether calls fail at once now: the breaker is open, or the node said it is loading and the hold
    /// has not passed.
    var failsFast: Bool { isBreakerOpen || loadingHeld(now: NIODeadline.now().uptimeNanoseconds) }

    /// Whether the loading hold covers `now` (clears a hold that has passed).
    private func loadingHeld(now: UInt64) -> Bool {
        let until = loadingUntil.load(ordering: .relaxed)
        guard until != 0 else { return false }
        if now < until { return true }
        _ = loadingUntil.compareExchange(expected: until, desired: 0, ordering: .relaxed)
        return false
    }

    /// The server answered `LOADING`: calls are held for ``RedisConfiguration/Breaker/loadingHold``.
    func noteLoading() {
        let hold = configuration.breaker.loadingHold
        guard hold > .zero else { return }
        loadingUntil.store(NIODeadline.now().uptimeNanoseconds + UInt64(TimeAmount(hold).nanoseconds), ordering: .relaxed)
    }

    /// Throws the node's `LOADING` error, without sending, while a hold covers now (one relaxed load
    /// when none is on: every call passes here).
    @inline(__always)
    func rejectWhileLoading() throws {
        guard loadingUntil.load(ordering: .relaxed) != 0, loadingHeld(now: NIODeadline.now().uptimeNanoseconds) else { return }
        counters.loadingRejections.add(1, ordering: .relaxed)
        metrics.serverErrors.increment()
        throw loadingError
    }

    static func isLoadingReply(_ value: RESPValue) -> Bool {
        switch value {
        case .simpleError(let message), .bulkError(let message): message.hasPrefix("LOADING")
        default: false
        }
    }
}
