import Synchronization

// The replay of owed removals (OwedRemovals.swift): a loop that runs while something is owed, sends it
// as soon as the store answers again, and settles each removal the store took.

extension OwedRemovals {
    /// Tombstones sent together in a replay (one batch, one round trip).
    static let replayBatch = 256

    /// Starts the replay loop unless it runs.
    func startReplay() {
        replayTask.withLock { task in
            guard task == nil else { return }
            task = Task { [weak self] in await self?.replay() }
        }
    }

    func stopReplay() {
        replayTask.withLock { task in
            task?.cancel()
            task = nil
        }
    }

    /// Replays until nothing is owed: looks every 20 ms while the store fails fast (so the replay
    /// follows the store's return closely: until it lands, other instances may read what the store
    /// holds), backs off after a failed attempt (20 ms doubling to 250 ms). While the store is full (a
    /// full Redis before version 7, say), each pass opens with one removal alone and stops at the next
    /// refusal for lack of memory: a few commands a second, where sending every owed removal again on
    /// each pass would be a storm of commands that change nothing. A removal refused for itself (its
    /// key holds what the script cannot replace) paces nothing: it stays owed alone, and the others are
    /// sent as before.
    private func replay() async {
        var delay = Duration.milliseconds(20)
        var full = false
        while !Task.isCancelled {
            let owed = state.withLock { pending -> PendingRemovals? in
                if pending.isEmpty {
                    replayTask.withLock { $0 = nil }
                    return nil
                }
                return pending
            }
            guard let owed else { return }
            if store.failsFast {
                try? await Task.sleep(for: .milliseconds(20))
                continue
            }
            do {
                try await send(owed, probing: full)
                delay = .milliseconds(20)
                full = false
            } catch {
                counters.errors.add(1, ordering: .relaxed)
                full = MagpieError.code(of: error) == .remoteFull
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .milliseconds(250))
            }
        }
    }

    /// Sends what `owed` holds, settling each removal as soon as the store took it, so that one that
    /// fails keeps only itself (and what was not tried yet) owed; throws at the first failed step.
    /// `probing` (the last pass found the store full): one key's tombstone first, the rest only once it
    /// is taken.
    private func send(_ owed: PendingRemovals, probing: Bool) async throws(MagpieError) {
        if owed.all {
            tokens.drop(group: nil)
            try await store.replaceToken(group: nil)
            settle { pending in
                guard pending.all && pending.allSequence == owed.allSequence else { return 0 }
                pending.all = false
                return 1
            }
            return
        }
        for (group, sequence) in owed.groups {
            tokens.drop(group: group)
            try await store.replaceToken(group: group)
            settle { pending in
                guard pending.groups[group] == sequence else { return 0 }
                pending.groups[group] = nil
                return 1
            }
        }
        // Each key's tombstone carries its removal's version: a write made since, by anyone, still wins.
        // Sent in batches of `replayBatch` (MagpieRedis: one pipelined flush, each tombstone its own
        // script and change message; until the last lands, the fleet's delivery watermark waits for this
        // instance), each settled as it returns, so that a failure keeps owed only what it did not take.
        // Each tombstone is taken (true: stored, or fenced by a newer write, which wins anyway), refused
        // by the store (false: it answered with an error), or not answered (nil: the store is
        // unreachable, and the rest waits for the next pass). After a refusal for lack of memory nothing
        // more is sent in this pass; a key's own refusal stops nothing. `probing`: one key first.
        let keys = Array(owed.keys)
        var anyRefused = false
        var unanswered = false
        var full = false
        var next = 0
        var size = probing ? 1 : Self.replayBatch
        while next < keys.count && !unanswered && !full {
            let batch = keys[next..<min(next + size, keys.count)]
            let outcomes = await store.storeTombstones(
                batch.map { (key: $0.0, version: $0.1.version) }, now: clock.now(), lifetime: tombstoneLifetime)
            var landed: [(Int, Bool?)] = []
            landed.reserveCapacity(outcomes.count)
            for (offset, outcome) in outcomes.enumerated() {
                switch outcome {
                case .success:
                    landed.append((next + offset, true))
                case .failure(let error):
                    let code = error.code
                    if code == .remoteFull {
                        counters.oomRefusals.add(1, ordering: .relaxed)
                        full = true
                    }
                    let refused = code == .remoteRefused || code == .remoteFull
                    if !refused { unanswered = true }
                    landed.append((next + offset, refused ? false : nil))
                }
            }
            anyRefused = settle(landed, of: keys) || anyRefused
            next += batch.count
            size = Self.replayBatch
        }
        if unanswered { throw MagpieError(.remoteUnavailable, "an owed removal was not taken") }
        if full { throw MagpieError(.remoteFull, "the store is full: an owed removal was refused") }
        if anyRefused { throw MagpieError(.remoteRefused, "the store refused an owed removal") }
    }

    /// Settles the keys whose tombstones the store took and marks those it refused; whether any was
    /// refused.
    private func settle(_ outcomes: [(Int, Bool?)], of keys: [([UInt8], (sequence: UInt64, version: UInt64))]) -> Bool {
        let refused = outcomes.compactMap { $0.1 == false ? $0.0 : nil }
        if !refused.isEmpty {
            state.withLock { pending in
                for index in refused where pending.keys[keys[index].0]?.sequence == keys[index].1.sequence {
                    pending.refused.insert(keys[index].0)
                }
            }
        }
        settle { pending in
            var settled = 0
            for (index, taken) in outcomes where taken == true {
                let (key, owedKey) = keys[index]
                if pending.keys[key]?.sequence == owedKey.sequence {
                    pending.keys[key] = nil
                    settled += 1
                }
            }
            return settled
        }
        return !refused.isEmpty
    }

    /// Drops removals the store took from the queue (`drop` returns how many; one that was owed again
    /// since stays), counts them as replayed, and removes the journal once nothing is owed. (Until then
    /// the journal keeps entries already replayed beside the rest: replaying one again after a restart
    /// changes nothing, its version being fenced like any.)
    private func settle(_ drop: (inout PendingRemovals) -> Int) {
        state.withLock { pending in
            let settled = drop(&pending)
            // Counted under the lock: whoever sees the owed count fall also sees these replays counted.
            counters.replayedRemovals.add(UInt64(settled), ordering: .relaxed)
            if !pending.refused.isEmpty { pending.refused = pending.refused.filter { pending.keys[$0] != nil } }
            pending.updateHold(oldest: clock.now())
            if settled > 0 && pending.isEmpty { rewriteJournal([]) }
        }
        if count == 0 { for waiter in drainWaiters.withLock({ waiters in defer { waiters = [] }; return waiters }) { waiter.finish() } }
    }

    /// Waits until nothing is owed to the store, or `limit` passes (woken by the replay that settles the
    /// last owed removal, no polling); returns what is still owed.
    func waitForReplay(upTo limit: Duration) async -> Int {
        guard count > 0 else { return 0 }
        let waiter = Wakeup()
        drainWaiters.withLock { $0.append(waiter) }
        startReplay()
        if count == 0 { waiter.finish() }  // settled between the first look and the registration
        await waiter.wait(upTo: limit)
        drainWaiters.withLock { $0.removeAll { $0 === waiter } }
        return count
    }
}
