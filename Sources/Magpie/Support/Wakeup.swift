import Synchronization

// Waiting for an event without polling: a task sleeps until the event happens or its time limit passes,
// whichever comes first. No thread is blocked; a waiter is resumed exactly once.

/// One task's wait: resumed once, by ``finish()`` or by its time limit, whichever comes first.
final class Wakeup: Sendable {
    private enum Phase {
        case running
        case waiting(CheckedContinuation<Void, Never>)
        case done
    }

    private let phase = Locked(Phase.running)

    /// The event happened (before or during the wait: a wait that starts after this returns at once).
    func finish() {
        let waiting = phase.withLock { phase -> CheckedContinuation<Void, Never>? in
            defer { phase = .done }
            if case .waiting(let continuation) = phase { return continuation }
            return nil
        }
        waiting?.resume()
    }

    /// Returns when ``finish()`` is called, `limit` passed, or the task is cancelled.
    func wait(upTo limit: Duration) async {
        let timer = Task { [self] in
            try? await Task.sleep(for: limit)
            finish()
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = phase.withLock { phase -> Bool in
                    if case .done = phase { return true }
                    phase = .waiting(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            finish()
        }
        timer.cancel()
    }
}

/// Tasks waiting for something to happen to a key (by its hash): ``signal(_:)`` wakes every one that
/// waits for that key. Costs one atomic load to signal while nobody waits.
final class KeyedWakeups: Sendable {
    private let waiting = Locked<[UInt64: [Wakeup]]>([:])
    private let count = Atomic<Int>(0)

    /// A wait for `hash`, registered now: a signal from here on ends it (pass it to ``wait(_:for:upTo:)``,
    /// which also unregisters it), so that an event between the look that found nothing and the wait is
    /// not missed.
    func register(_ hash: UInt64) -> Wakeup {
        let wakeup = Wakeup()
        waiting.withLock { waiting in
            waiting[hash, default: []].append(wakeup)
            count.add(1, ordering: .relaxed)
        }
        return wakeup
    }

    /// Waits until `hash` was signalled since `wakeup` was registered, or `limit` passes; unregisters it.
    func wait(_ wakeup: Wakeup, for hash: UInt64, upTo limit: Duration) async {
        await wakeup.wait(upTo: limit)
        unregister(wakeup, for: hash)
    }

    /// Forgets a registered wait that will not be waited for.
    func unregister(_ wakeup: Wakeup, for hash: UInt64) {
        waiting.withLock { waiting in
            guard let index = waiting[hash]?.firstIndex(where: { $0 === wakeup }) else { return }
            waiting[hash]?.remove(at: index)
            if waiting[hash]?.isEmpty == true { waiting[hash] = nil }
            count.subtract(1, ordering: .relaxed)
        }
    }

    /// Whether a task waits for `hash` now.
    func waits(for hash: UInt64) -> Bool {
        guard count.load(ordering: .relaxed) != 0 else { return false }
        return waiting.withLock { $0[hash] != nil }
    }

    /// Wakes every task waiting for `hash`.
    func signal(_ hash: UInt64) {
        guard count.load(ordering: .relaxed) != 0 else { return }
        for wakeup in waiting.withLock({ $0[hash] ?? [] }) { wakeup.finish() }
    }
}
