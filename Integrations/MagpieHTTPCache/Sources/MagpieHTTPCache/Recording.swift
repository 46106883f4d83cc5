import Synchronization

/// A streamed body copied aside as it is sent, up to a limit: the bytes once the stream has ended
/// within the limit, nil when it went past it, failed, or was never sent.
final class Recorder: Sendable {
    private struct State {
        var bytes: [UInt8] = []
        var over = false
        var result: [UInt8]?? = nil  // set once: .some(bytes) or .some(nil)
        var waiters: [CheckedContinuation<[UInt8]?, Never>] = []
    }

    private let limit: Int
    private let state = Mutex(State())

    init(limit: Int) { self.limit = limit }

    /// Copies `chunk`; false once the body has gone past the limit (the copy is dropped then).
    @discardableResult
    func append(_ chunk: ArraySlice<UInt8>) -> Bool {
        state.withLock { state in
            guard !state.over, state.result == nil else { return false }
            if state.bytes.count + chunk.count > limit {
                state.over = true
                state.bytes = []
                return false
            }
            state.bytes.append(contentsOf: chunk)
            return true
        }
    }

    /// The stream ended: completely (`complete`), or not (an error, or never sent).
    func finish(complete: Bool) {
        let (waiters, result) = state.withLock { state -> ([CheckedContinuation<[UInt8]?, Never>], [UInt8]?) in
            guard state.result == nil else { return ([], nil) }
            let result: [UInt8]? = complete && !state.over ? state.bytes : nil
            state.result = .some(result)
            state.bytes = []
            let waiters = state.waiters
            state.waiters = []
            return (waiters, result)
        }
        for waiter in waiters { waiter.resume(returning: result) }
    }

    /// Waits for the end of the stream.
    func result() async -> [UInt8]? {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> [UInt8]?? in
                if let result = state.result { return .some(result) }
                state.waiters.append(continuation)
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// Ends a recording as incomplete when the body it belongs to is dropped unsent (its write closure
/// released without being called): whoever waits for the recording never waits forever.
final class RecordingGuard: Sendable {
    let recorder: Recorder
    init(_ recorder: Recorder) { self.recorder = recorder }
    deinit { recorder.finish(complete: false) }
}

/// Writes each chunk to the client and copies it aside.
struct TeeSink: HTTPCacheBodySink {
    let downstream: any HTTPCacheBodySink
    let recorder: Recorder

    func write(_ chunk: ArraySlice<UInt8>) async throws {
        recorder.append(chunk)
        try await downstream.write(chunk)
    }
}

/// Reads a body nobody sends (a background refresh's) into a recorder, stopping at its limit.
struct DrainSink: HTTPCacheBodySink {
    struct PastLimit: Error {}
    let recorder: Recorder

    func write(_ chunk: ArraySlice<UInt8>) async throws {
        guard recorder.append(chunk) else { throw PastLimit() }
    }
}

/// What the handler's run inside a load produced, for the loader's callers: the value (a record, or nil
/// when nothing was stored), or the error. Fulfilled once, by the request that ran the handler.
final class Promise: Sendable {
    private enum State {
        case pending([CheckedContinuation<Result<[UInt8]?, any Error>, Never>])
        case done(Result<[UInt8]?, any Error>)
    }

    private let state = Mutex(State.pending([]))

    func fulfil(_ result: Result<[UInt8]?, any Error>) {
        let waiters = state.withLock { state -> [CheckedContinuation<Result<[UInt8]?, any Error>, Never>] in
            guard case .pending(let waiters) = state else { return [] }
            state = .done(result)
            return waiters
        }
        for waiter in waiters { waiter.resume(returning: result) }
    }

    func value() async throws -> [UInt8]? {
        let result = await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Result<[UInt8]?, any Error>? in
                switch state {
                case .done(let result):
                    return result
                case .pending(var waiters):
                    waiters.append(continuation)
                    state = .pending(waiters)
                    return nil
                }
            }
            if let ready { continuation.resume(returning: ready) }
        }
        return try result.get()
    }
}

/// Between a request and the load it asked Magpie's loader for: either the load elects the request
/// to run the handler (the request is still waiting: it runs the handler in its own task, so the
/// handler never outlives the request, and fulfils the promise the load returns), or the load ends
/// without it (a hit, a follower's shared value, a stale value, an error).
final class Handoff: Sendable {
    enum Outcome: Sendable {
        case elected(Promise)
        case finished(Result<[UInt8]?, any Error>)
    }

    private enum State {
        case waiting(CheckedContinuation<Outcome, Never>?)
        case ready(Outcome)
        case taken
    }

    private let state = Mutex(State.waiting(nil))
    /// Whether the load may elect the request; not when it asked for a stale response served at once
    /// (the load is then a background refresh, whenever it starts).
    private let electable: Bool

    init(electable: Bool) { self.electable = electable }

    /// Elects the waiting request: the promise it will fulfil, or nil when it no longer waits (or may
    /// not be elected).
    func elect() -> Promise? {
        guard electable else { return nil }
        let promise = Promise()
        return settle(.elected(promise)) ? promise : nil
    }

    /// The load ended without electing the request.
    func finish(_ result: Result<[UInt8]?, any Error>) { _ = settle(.finished(result)) }

    private func settle(_ outcome: Outcome) -> Bool {
        let (settled, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Outcome, Never>?) in
            guard case .waiting(let continuation) = state else { return (false, nil) }
            state = continuation == nil ? .ready(outcome) : .taken
            return (true, continuation)
        }
        waiter?.resume(returning: outcome)
        return settled
    }

    /// The first of an election and the load's end.
    func outcome() async -> Outcome {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Outcome? in
                if case .ready(let outcome) = state {
                    state = .taken
                    return outcome
                }
                state = .waiting(continuation)
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
