import Magpie

// Calls of the change script built apart from their sending, so that a fenced write goes alone
// (RedisRemoteStore+Scripts.swift) or with others in one pipelined batch (`storeIfNewer(batch:)`, how
// owed removals are replayed): each write still its own script call and change message.

extension RedisRemoteStore {
    /// A call of the change script: its keys, its arguments, and whether it may run flagged `allow-oom`.
    struct ChangeCall {
        var keys: [[UInt8]]
        var arguments: [RedisArgument]
        var flagged: Bool
    }

    func changeCall(
        _ kind: ChangeKind, _ key: [UInt8], value: [UInt8], lifetime: Int64, deadline: Int64, version: UInt64, pushing: Bool
    ) -> ChangeCall {
        let partition = Int(partition(of: key))
        let message = ChangeMessageFormat.head(
            kind: kind == .fenced ? .versioned : .plain, origin: origin, version: version, partition: partition, key: key)
        return ChangeCall(
            keys: [prefix + key, sequenceKey(partition)],
            arguments: [
                .string(kind.rawValue), .bytes(value), .integer(lifetime), .integer(max(0, deadline)), .bytes(channel), .bytes(message),
                .string(cluster == nil ? String(partition) : ""), .string(pushing ? "1" : "0"),
            ],
            flagged: Self.mayWriteWhenFull(kind, value: value))
    }

    /// The change script's call for a fenced write of `value` (a versioned value) to `key`, with its
    /// lifetime from `now`; nil when `expiresAt` has passed (nothing newer to store). Throws for a value
    /// without a version.
    func fencedCall(
        _ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool, now: Int64
    ) throws(MagpieError) -> ChangeCall? {
        guard let version = RemoteChangeFence.version(value) else {
            throw MagpieError(.invalidConfiguration, "a versioned value must start with \"MV\" and its 8-byte version")
        }
        var lifetime: Int64 = 0
        if expiresAt != 0 {
            lifetime = expiresAt - now
            guard lifetime > 0 else { return nil }
        }
        return changeCall(.fenced, key, value: value, lifetime: lifetime, deadline: notAfter, version: version, pushing: pushing)
    }

    /// Runs the change script once per call, pipelined (``RedisCommandSender/send(batch:)``: one flush per
    /// node): each call's reply or error, in order. The calls a server answers `NOSCRIPT` go again as
    /// EVAL, together; those flagged `allow-oom` that it cannot compile go again unflagged.
    func changeBatch(_ calls: [ChangeCall]) async -> [Result<RESPValue, RedisError>] {
        guard !calls.isEmpty else { return [] }
        var replies = [Result<RESPValue, RedisError>](
            repeating: .failure(RedisError(.unexpectedReply, "not sent")), count: calls.count)
        func command(_ call: ChangeCall, flagged: Bool, byHash: Bool) -> RedisCommand {
            let (text, sha) = Self.changeScript(flagged: flagged)
            return Self.scriptCommand(byHash ? sha : text, byHash: byHash, keys: call.keys, call.arguments)
        }
        // Each round sends the calls still pending in one batch: by hash, then as text where the server
        // did not know the script; unflagged again where it could not compile the flag.
        var pending = calls.indices.map { (index: $0, flagged: calls[$0].flagged && serverAllowsOOMFlag(forKey: calls[$0].keys[0]), byHash: true) }
        for _ in 0..<4 where !pending.isEmpty {
            let sent: [Result<RESPValue, RedisError>]
            do {
                sent = try await sender.send(batch: pending.map { command(calls[$0.index], flagged: $0.flagged, byHash: $0.byHash) })
            } catch {
                let failure = error as? RedisError ?? RedisError(.unexpectedReply, "\(error)")
                for entry in pending { replies[entry.index] = .failure(failure) }
                return replies
            }
            var again: [(index: Int, flagged: Bool, byHash: Bool)] = []
            for (entry, reply) in zip(pending, sent) {
                replies[entry.index] = reply
                guard case .failure(let error) = reply else { continue }
                if error.serverError?.kind == .noScript && entry.byHash {
                    again.append((entry.index, entry.flagged, false))
                } else if entry.flagged && Self.cannotCompileFlag(error) {
                    again.append((entry.index, false, true))
                }
            }
            pending = again
        }
        return replies
    }

    public func storeIfNewer(batch writes: [RemoteVersionedWrite]) async -> [Result<Bool, MagpieError>] {
        var outcomes = [Result<Bool, MagpieError>?](repeating: nil, count: writes.count)
        var calls: [ChangeCall] = []
        var positions: [Int] = []
        let now = now()
        for (index, write) in writes.enumerated() {
            do {
                guard let call = try fencedCall(write.value, forKey: write.key, expiresAt: write.expiresAt, notAfter: write.notAfter, pushing: false, now: now)
                else {
                    outcomes[index] = .success(false)  // expired already: nothing newer to store
                    continue
                }
                calls.append(call)
                positions.append(index)
            } catch {
                outcomes[index] = .failure(error)
            }
        }
        for (position, reply) in zip(positions, await changeBatch(calls)) {
            do {
                outcomes[position] = .success(try Self.changed(reply.get()))
            } catch {
                outcomes[position] = .failure(failure(error))
            }
        }
        return outcomes.map { $0 ?? .failure(MagpieError(.remoteUnavailable, "not sent")) }
    }
}
