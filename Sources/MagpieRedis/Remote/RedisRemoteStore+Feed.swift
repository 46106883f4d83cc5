import Magpie
import NIOCore

// The change feed: one subscription to the namespace's channel (on one master: in a cluster, PUBLISH
// reaches every node's subscribers), the task that reads it, and the heartbeats that confirm it (see
// RedisRemoteStore and RedisRemoteStore+Scripts.swift).
//
// A heartbeat is a script run on each master every `heartbeatInterval` that publishes `MCH<instance>:<n>`
// on the channel. When this instance's subscription receives its own heartbeat n of a master, every
// message that master published before it has been received: the cache is told the instant through
// which *every* master is confirmed (the least of the masters' latest). A heartbeat the master answered
// (so it published it) that never arrives while a later one does was lost on the way, and so may have
// been any message of that master's slots published around it: their local copies are dropped
// (`RemoteChanges.partitionsLost`). On a single server the heartbeat also carries the total of the slots'
// sequence numbers; when the cache finds its messages fall short of it (a message lost at the end of a
// slot's sequence leaves no gap to see), the next heartbeat is preceded by a read of every slot's number
// (`HGETALL`, on the same connection, so the heartbeat's message follows every message published before
// the read), reported when that heartbeat arrives.
//
// The heartbeat script also publishes this instance's delivery watermark (the instant before which every
// write it returned reached the store; its owed removals hold it back) beside the other instances' on
// that master, drops instances not heard of for `8 × heartbeatInterval`, and answers the least watermark.
// Once heartbeat n is both answered and seen, that answer is reported to the cache
// (`RemoteChanges.allDelivered(through:)`), the least over the masters: until it passes an instant, no
// instance trusts a copy older than the bound past it. A graceful shutdown takes the instance off the
// masters' lists.

extension RedisRemoteStore {
    static let heartbeatTag = UInt8(ascii: "h")

    func supervise() async {
        while !Task.isCancelled {
            await reconcile()
            await sendHeartbeats()
            try? await Task.sleep(for: configuration.heartbeatInterval)
        }
    }

    /// The masters that hold (or may hold) the namespace's keys.
    func masters() -> [RedisEndpoint] {
        if let cluster { return cluster.masters }
        return [configuration.redis.endpoints[0]]
    }

    /// Keeps a subscription running (on a master: a new one when the last ended or its master went), and
    /// the heartbeat bookkeeping of the current masters.
    private func reconcile() async {
        let masters = masters()
        let wanted = Set(masters)
        let (start, gone) = state.withLock { state -> (Bool, Subscription?) in
            guard !state.shutDown else { return (false, nil) }
            for endpoint in state.masters.keys where !wanted.contains(endpoint) { state.masters[endpoint] = nil }
            for endpoint in masters where state.masters[endpoint] == nil { state.masters[endpoint] = Progress() }
            guard let subscription = state.subscription else { return (true, nil) }
            guard subscription.ended.withLock({ $0 }) || !wanted.contains(subscription.endpoint) else { return (false, nil) }
            state.subscription = nil
            return (true, subscription)
        }
        await gone?.close()
        if start, let endpoint = masters.first { await subscribe(on: endpoint) }
    }

    private func subscribe(on endpoint: RedisEndpoint) async {
        let subscriber = single?.makeSubscriber() ?? cluster?.makeSubscriber(for: endpoint)
        guard let subscriber else { return }
        do {
            let stream = try await subscriber.subscribe(to: [String(decoding: channel, as: UTF8.self)])
            let invalidations =
                configuration.reportsForeignWrites
                ? try await subscriber.track(RedisTrackingOptions(broadcast: true, prefixes: [configuration.namespace])) : nil
            let subscription = Subscription(endpoint: endpoint, subscriber: subscriber)
            let changes = state.withLock { state -> RemoteChanges? in
                guard !state.shutDown, state.subscription == nil else { return nil }
                state.subscription = subscription
                state.epoch = nil
                return state.changes
            }
            guard let changes else {
                await subscriber.close()
                return
            }
            // Messages published before this subscription started were never received here.
            changes.invalidateAll()
            // On the store's event loop, like the supervisor: a busy or blocked cooperative pool must not
            // hold up the feed (the cache's local copies would lapse).
            var readers = [
                Task(executorPreference: executor) { [weak self] in
                    for await event in stream {
                        guard let self else { return }
                        self.handle(event, changes: changes)
                    }
                    subscription.ended.withLock { $0 = true }
                }
            ]
            if let invalidations {
                readers.append(
                    Task(executorPreference: executor) { [weak self] in
                        for await event in invalidations {
                            guard let self else { return }
                            await self.handle(event, changes: changes)
                        }
                    })
            }
            subscription.readers.withLock { $0 = readers }
        } catch {
            await subscriber.close()
            logger.debug("magpie: the change feed on \(endpoint) could not start", metadata: ["error": "\(error)"])
        }
    }

    private func handle(_ event: RedisPubSubEvent, changes: RemoteChanges) {
        switch event {
        case .message(let message):
            switch ChangeMessageFormat.parse(Array(message.payload.readableBytesView)) {
            case .change(let origin, let version, let partition, let key, let sequence, let epoch, let value):
                let dropping = configuration.dropChangeMessages
                if dropping > 0 && Double.random(in: 0..<1) < dropping { return }
                noteEpoch(epoch, changes: changes)
                changes.changed(
                    RemoteChangeMessage(
                        key: key, version: version, own: origin.elementsEqual(self.origin), partition: partition, sequence: sequence,
                        value: value))
            case .heartbeat(let from, let number, let total, let epoch):
                guard from == instance else { return }
                noteEpoch(epoch, changes: changes)
                heartbeatSeen(number, total: total, changes: changes)
            case nil:
                break  // not a message of ours
            }
        case .lost:
            break  // confirmations stop; the cache's bound runs from the last one
        case .restored:
            state.withLock { $0.epoch = nil }  // numbering continues from where the next check says
            changes.invalidateAll()  // what was published while the subscription was down was never received
        }
    }

    /// A message came with the sequence hash's `epoch` (nil: none): one that differs from the last seen
    /// means Redis lost the hash (evicted) and made it anew, so its numbers restarted from 0 and this
    /// message is among the first of them (the epoch is read in the script that numbers the message).
    /// The cache is told before the message, and counts from 0 again: it would otherwise take every
    /// number below the old ones for a repeat, and miss the messages lost among them.
    private func noteEpoch(_ epoch: UInt64?, changes: RemoteChanges) {
        guard let epoch else { return }
        let restarted = state.withLock { state -> Bool in
            defer { state.epoch = epoch }
            return state.epoch.map { $0 != epoch } ?? false
        }
        if restarted { changes.sequencesRestarted() }
    }

    /// Keys under the namespace changed, by a cache or by another program (or expired, or were evicted):
    /// what each holds now goes to the cache as the key's change: a record's version (a cache's own write,
    /// whose message was applied already, changes nothing there; an unversioned value drops the copies),
    /// another key's value (a token a cache already holds changes nothing).
    private func handle(_ event: RedisInvalidation, changes: RemoteChanges) async {
        switch event {
        case .keys(let buffers):
            for buffer in buffers {
                let bytes = Array(buffer.readableBytesView)
                guard bytes.count > prefix.count, bytes.starts(with: prefix) else { continue }
                let key = Array(bytes[prefix.count...])
                guard key[0] != Self.heartbeatTag else { continue }
                let record = key[0] == UInt8(ascii: "k")
                let command = record ? RedisCommand("GETRANGE", [.bytes(bytes), 0, 9], keyIndices: [0]) : .get(bytes)
                let held = (try? await sender.send(command)).flatMap { try? Self.bytes($0) }
                changes.changed(
                    RemoteChangeMessage(
                        key: key, version: record ? held.flatMap { RemoteChangeFence.version($0) } ?? 0 : 0, own: false,
                        partition: partition(of: key), sequence: 0, value: record ? nil : held))
            }
        case .all:
            changes.invalidateAll()
        case .lost, .restored:
            break  // the subscription's own events say it
        }
    }

    /// A heartbeat of this instance arrived: the master it was sent to is confirmed through the instant
    /// it was sent (after the numbers read before it, and the loss of an earlier one, are reported).
    private func heartbeatSeen(_ number: UInt64, total: UInt64?, changes: RemoteChanges) {
        let seen = state.withLock { state -> (RedisEndpoint, Bool, [Int: UInt64]?, Bool)? in
            for (endpoint, var progress) in state.masters {
                guard let (_, lost) = progress.see(number) else { continue }
                let sequences = progress.sequences.removeValue(forKey: number)
                progress.sequences = progress.sequences.filter { $0.key > number }
                let moved = progress.settleWatermark()
                state.masters[endpoint] = progress
                return (endpoint, lost, sequences, moved)
            }
            return nil
        }
        guard let (endpoint, lost, sequences, watermarkMoved) = seen else { return }
        if let sequences { changes.sequences(sequences) }
        if lost { changes.partitionsLost(partitions(of: endpoint)) }
        let through = state.withLock { state -> Int64? in
            guard let least = state.masters.values.map(\.confirmed).min(), least > state.delivered else { return nil }
            state.delivered = least
            return least
        }
        if let through { changes.confirm(through: through, total: total) }
        if watermarkMoved { reportWatermark(changes) }
    }

    /// The slots `master` serves (every slot on a single server).
    private func partitions(of master: RedisEndpoint) -> [Int] {
        guard let cluster else { return Array(0..<RedisHashSlot.count) }
        return cluster.routing.withLock { routing in
            routing.slots.indices.filter { slot in
                let owner = Int(routing.slots[slot])
                return owner < routing.nodes.count && routing.nodes[owner].endpoint == master
            }
        }
    }

    /// The heartbeat `number` of `master` was answered with the fleet's watermark `watermark`.
    private func heartbeatAnswered(_ number: UInt64, watermark: Int64?, on master: RedisEndpoint) {
        let (lost, moved) = state.withLock { state -> (Bool, Bool) in
            guard var progress = state.masters[master] else { return (false, false) }
            let lost = progress.answer(number)
            if let watermark {
                progress.watermarks[number] = watermark
                if progress.watermarks.count > 64, let oldest = progress.watermarks.keys.min() { progress.watermarks[oldest] = nil }
            }
            let moved = progress.settleWatermark()
            state.masters[master] = progress
            return (lost, moved)
        }
        guard let changes = state.withLock({ $0.changes }) else { return }
        if lost { changes.partitionsLost(partitions(of: master)) }
        if moved { reportWatermark(changes) }
    }

    /// Reports the least of the masters' watermarks when it changed (masters without one yet are left out).
    private func reportWatermark(_ changes: RemoteChanges) {
        let watermark = state.withLock { state -> Int64? in
            let watermarks = state.masters.values.compactMap(\.delivered)
            guard let least = watermarks.min(), least != state.watermark else { return nil }
            state.watermark = least
            return least
        }
        if let watermark { changes.allDelivered(through: watermark) }
    }

    /// Runs one heartbeat per master, in one batch: the heartbeat script, with this instance's delivery
    /// watermark; on a single server, when the cache wants them, preceded by a read of the slots' numbers.
    private func sendHeartbeats() async {
        let (masters, changes) = state.withLock { $0.shutDown ? ([], nil) : (Array($0.masters.keys), $0.changes) }
        guard !masters.isEmpty, let changes, state.withLock({ $0.subscription != nil }) else { return }
        let routing = cluster.map { cluster in cluster.routing.withLock { ($0.slots, $0.nodes.map(\.endpoint)) } }
        let (seconds, attoseconds) = configuration.heartbeatInterval.components
        let interval = max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        // Read before any heartbeat is sent: a write returned later is after it. Published by the
        // server's clock (the instances' clocks may differ by more than the bound), less the offset's
        // uncertainty; not at all before the first offset is known.
        let batchSentAt = now()
        let offset = state.withLock { $0.serverClock.estimate }
        let watermark: RedisArgument = offset.map { .integer(changes.ownWritesDelivered() + $0.offset - $0.uncertainty) } ?? .string("-")
        let readSequences = cluster == nil && changes.sequencesWanted
        var sent: [(master: RedisEndpoint, number: UInt64, arguments: [RedisArgument], flagged: Bool)] = []
        var commands: [RedisCommand] = []
        if readSequences { commands.append(RedisCommand("HGETALL", [.bytes(prefix + Self.sequenceStem)], keyIndices: [0])) }
        for master in masters {
            var tag: [UInt8] = []
            if let (slots, endpoints) = routing {
                guard let found = Self.tag(for: master, stem: prefix + Self.watermarkKeys[2], slots: slots, endpoints: endpoints)
                else { continue }
                tag = found
            }
            let number = state.withLock { state -> UInt64 in
                state.sequence += 1
                return state.sequence
            }
            let sentAt = now()
            state.withLock { state in
                guard var progress = state.masters[master] else { return }
                if progress.outstanding.count >= 64, let oldest = progress.outstanding.keys.min() { progress.outstanding[oldest] = nil }
                progress.outstanding[number] = sentAt
                state.masters[master] = progress
            }
            let keys = [prefix + Self.sequenceStem + tag] + Self.watermarkKeys.map { prefix + $0 + tag }
            let message = Array("MCH\(instance):\(number)".utf8)
            let arguments: [RedisArgument] = [4] + keys.map { .bytes($0) } + [
                .string(instance), watermark, 0, .integer(8 * interval), .integer(3 * interval), .integer(max(60_000, 100 * interval)),
                .bytes(channel), .bytes(message), .string(cluster == nil ? "1" : "0"),
            ]
            // Flagged `allow-oom` where the server takes it: a full server still confirms the feed.
            let flagged = serverAllowsOOMFlag(forKey: keys[0])
            sent.append((master, number, arguments, flagged))
            let sha = flagged ? RedisRemoteScript.heartbeatAllowingOOMSHA : RedisRemoteScript.heartbeatSHA
            commands.append(RedisCommand("EVALSHA", [.string(sha)] + arguments, keyIndices: [2, 3, 4, 5]))
        }
        guard !sent.isEmpty, let replies = try? await sender.send(batch: commands) else { return }
        let receivedAt = now()
        var answers = replies
        if readSequences, !answers.isEmpty {
            let numbers = (try? answers.removeFirst().get()).flatMap(Self.sequenceNumbers)
            // Reported when the heartbeat after the read arrives (every message published before it, too),
            // or now if it arrived already: its message and this reply come on different connections, in
            // either order. (Left waiting for a heartbeat that came first, the numbers were never reported,
            // and a cache that withholds its confirmations until they are was never confirmed again.)
            if let numbers, let first = sent.first {
                let arrived = state.withLock { state -> Bool in
                    guard var progress = state.masters[first.master] else { return false }
                    if progress.seen >= first.number { return true }
                    progress.sequences[first.number] = numbers
                    state.masters[first.master] = progress
                    return false
                }
                if arrived { changes.sequences(numbers) }
            }
        }
        var answered: [(index: Int, low: Int64?)] = []
        for (index, reply) in answers.enumerated() where index < sent.count {
            var answer = try? reply.get()
            var answeredAt = receivedAt
            if case .failure(let error) = reply, error.serverError?.kind == .noScript {
                // The server does not know the script yet (restarted, a new node): sent once in full (as it
                // is, if the server cannot compile the flag after all).
                let script = sent[index].flagged ? RedisRemoteScript.heartbeatAllowingOOM : RedisRemoteScript.heartbeat
                do {
                    answer = try await sender.send(
                        RedisCommand("EVAL", [.string(script)] + sent[index].arguments, keyIndices: [2, 3, 4, 5]))
                } catch let error as RedisError where sent[index].flagged && Self.cannotCompileFlag(error) {
                    answer = try? await sender.send(
                        RedisCommand("EVAL", [.string(RedisRemoteScript.heartbeat)] + sent[index].arguments, keyIndices: [2, 3, 4, 5]))
                } catch {
                    if (error as? RedisError)?.serverError?.kind == .outOfMemory { _ = failure(error) }
                }
                answeredAt = now()
            } else if case .failure(let error) = reply, error.serverError?.kind == .outOfMemory {
                _ = failure(error)  // logged: a server before Redis 7, full (the feed's confirmations stop)
            }
            guard let answer, let (low, serverNow) = Self.heartbeatAnswer(answer) else { continue }
            state.withLock { $0.serverClock.add(serverNow: serverNow, sentAt: batchSentAt, receivedAt: answeredAt) }
            answered.append((index, low))
        }
        // The fleet's watermark by this instance's clock, less the offset's uncertainty.
        let estimate = state.withLock { $0.serverClock.estimate }
        for (index, low) in answered {
            let watermark = estimate.flatMap { estimate in low.map { $0 - estimate.offset - estimate.uncertainty } }
            heartbeatAnswered(sent[index].number, watermark: watermark, on: sent[index].master)
        }
    }

    /// The slots' numbers in an `HGETALL` of the sequence hash (its total left out).
    static func sequenceNumbers(_ reply: RESPValue) -> [Int: UInt64]? {
        let items: [RESPValue]
        switch reply {
        case .map(let pairs): items = pairs.flatMap { [$0.key, $0.value] }
        case .array(let values): items = values
        default: return nil
        }
        var numbers: [Int: UInt64] = [:]
        var index = 0
        while index + 1 < items.count {
            if let field = items[index].string, let slot = Int(field), let number = items[index + 1].string.flatMap({ UInt64($0) }) {
                numbers[slot] = number
            }
            index += 2
        }
        return numbers
    }

    /// The logical keys of the instances' watermark lists on each master (see RedisRemoteScript.heartbeat):
    /// under the heartbeat tag, with a byte no instance name has, so the feed ignores them.
    static let watermarkKeys: [[UInt8]] = [Array("h~w".utf8), Array("h~l".utf8), Array("h~t".utf8)]

    /// What a heartbeat script answered: the fleet's least watermark (nil: none published) and the
    /// server's clock, both ms by the server's clock; nil for anything else.
    static func heartbeatAnswer(_ reply: RESPValue) -> (Int64?, Int64)? {
        guard case .array(let values) = reply, values.count == 2, let serverNow = milliseconds(values[1]) else { return nil }
        if case .bulkString(let buffer) = values[0], buffer.readableBytesView.elementsEqual([UInt8(ascii: "-")]) { return (nil, serverNow) }
        guard let low = milliseconds(values[0]) else { return nil }
        return (low, serverNow)
    }

    /// An instant a script answered as a string (a sorted set's score: digits, maybe in exponent form).
    private static func milliseconds(_ reply: RESPValue) -> Int64? {
        let text: String
        switch reply {
        case .bulkString(let buffer): text = String(buffer: buffer)
        case .simpleString(let string): text = string
        case .integer(let value): return value
        default: return nil
        }
        if let value = Int64(text) { return value }
        guard let value = Double(text), value.isFinite, abs(value) < 9e18 else { return nil }
        return Int64(value.rounded(.down))
    }

    /// Takes this instance off every master's list of instances (a graceful shutdown: it is not waited
    /// for); best effort.
    func leaveWatermarkLists() async {
        let endpoints = masters()
        let routing = cluster.map { cluster in cluster.routing.withLock { ($0.slots, $0.nodes.map(\.endpoint)) } }
        var commands: [RedisCommand] = []
        for endpoint in endpoints {
            var tag: [UInt8] = []
            if let (slots, nodes) = routing {
                guard let found = Self.tag(for: endpoint, stem: prefix + Self.watermarkKeys[2], slots: slots, endpoints: nodes) else { continue }
                tag = found
            }
            for list in Self.watermarkKeys.prefix(2) {
                commands.append(RedisCommand("ZREM", [.bytes(prefix + list + tag), .string(instance)], keyIndices: [0]))
            }
        }
        guard !commands.isEmpty else { return }
        _ = try? await sender.send(batch: commands)
    }

    /// A hash tag (`{n}`) that puts `stem` + tag on a slot `endpoint` owns (nil if none of 4,096 tags
    /// does). The heartbeat's keys are the prefix, letters and digits, then the tag: they share its slot.
    static func tag(for endpoint: RedisEndpoint, stem: [UInt8], slots: [UInt16], endpoints: [RedisEndpoint]) -> [UInt8]? {
        guard slots.count == RedisHashSlot.count else { return nil }
        for index in 0..<4096 {
            let candidate = Array("{\(index)}".utf8)
            let owner = Int(slots[Int(RedisHashSlot.slot(of: stem + candidate))])
            if owner < endpoints.count, endpoints[owner] == endpoint { return candidate }
        }
        return nil
    }
}
