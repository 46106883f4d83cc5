import NIOCore

/// A command handed to a connection's event loop by a caller on another thread, with where its reply
/// goes. The reply objects (``BatchReplies``, ``SubscriptionReplies``) are made on the loop.
enum Submission: Sendable {
    /// One command; `stages` (nil unless ``RedisConfiguration/recordsStages``) takes its instants.
    case command(ByteBuffer, UnsafeContinuation<RESPValue, any Error>, NIODeadline, CommandStages?)
    /// Commands concatenated in order; the `count` replies resume the continuation together.
    case batch(ByteBuffer, count: Int, UnsafeContinuation<[RESPValue], any Error>, NIODeadline, CommandStages?)
    /// A subscription command answered by one confirmation push of kind `confirmation` per name.
    case subscription(ByteBuffer, confirmation: String, names: [String], UnsafeContinuation<RESPValue, any Error>?, NIODeadline)
}

/// What callers off the event loop have submitted to one connection and the loop has not written yet.
///
/// Why: each command handed over with its own `eventLoop.execute` costs a closure allocation and a turn
/// of the loop's task queue, and each tick then schedules a flush of its own. Many tasks sending at once
/// (hundreds of `cache.async` calls, one connection) instead append here under one short lock; the first
/// to find no drain scheduled schedules one, and that one loop task writes everything queued by the time
/// it runs, then flushes once (one `writev`).
///
/// Order: submissions are written in the order they were appended (a caller that appends under a lock
/// of its own, as the subscriber does, gets its commands written in that lock's order). A drain is always
/// scheduled for what is queued: `drainScheduled` is cleared only by ``take()``, under the same lock that
/// appends, so an append that finds it set is taken by the drain already scheduled, which runs before any
/// task scheduled after the append (the loop runs its tasks in order). Closing the connection is such a
/// later task, so what was submitted before a close is written (or failed) before it.
final class SubmissionQueue: Sendable {
    private struct State: Sendable {
        var queued: [Submission] = []
        var drainScheduled = false
    }

    private let state = RedisLock(State())

    /// Appends `submission`; true when the caller must schedule a drain (none is scheduled).
    func append(_ submission: Submission) -> Bool {
        state.withLock { state in
            state.queued.append(submission)
            if state.drainScheduled { return false }
            state.drainScheduled = true
            return true
        }
    }

    /// Everything queued, in order, leaving the queue empty and no drain scheduled (on the loop).
    func take() -> [Submission] {
        state.withLock { state in
            state.drainScheduled = false
            guard !state.queued.isEmpty else { return [] }
            var taken: [Submission] = []
            taken.reserveCapacity(state.queued.count)
            swap(&taken, &state.queued)
            return taken
        }
    }
}
