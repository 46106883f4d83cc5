import Magpie
import NIOCore

// The change feeds: one tracking connection per master, the tasks that read them, and the heartbeats
// that confirm them (see RedisRemoteStore).
//
// A heartbeat is a key of this store's own under the namespace, `h<instance>:<sequence>` (in a cluster
// with a hash tag that puts it on the master it confirms), written through the ordinary connections
// every `heartbeatInterval` with a short expiry. Redis reports it on every instance's feed like any
// change; when this instance's feed of a master reports its own heartbeat N, every change that master
// made before heartbeat N was written has been reported before it. The cache is told the instant
// through which *every* master is confirmed (the least of the masters' latest).
//
// The heartbeat is a script (RedisRemoteScript.heartbeat) that also publishes this instance's delivery
// watermark (the instant before which every write it returned reached the store; its owed removals
// hold it back) beside the other instances' on that master, drops instances not heard of for
// `8 × heartbeatInterval`, and answers the least watermark. Once heartbeat N is both answered and seen
// on the feed, that answer is reported to the cache (`RemoteChanges.allDelivered(through:)`), the least
// over the masters: until it passes an instant, no instance trusts a copy older than the bound past it.
// A graceful shutdown takes the instance off the masters' lists.

extension RedisRemoteStore {
    static let heartbeatTag = UInt8(ascii: "h")

    func supervise() async {
        while !Task.isCancelled {
            await reconcileFeeds()
            await sendHeartbeats()
            try? await Task.sleep(for: configuration.heartbeatInterval)
        }
    }

    /// The masters that hold (or may hold) the namespace's keys.
    func masters() -> [RedisEndpoint] {
        if let cluster { return cluster.masters }
        return [configuration.redis.endpoints[0]]
    }

    /// Starts a feed for each master without a running one; stops those of masters that are gone.
    private func reconcileFeeds() async {
        let wanted = Set(masters())
        let (missing, gone) = state.withLock { state -> ([RedisEndpoint], [Feed]) in
            guard !state.shutDown else { return ([], []) }
            var gone: [Feed] = []
            for (endpoint, feed) in state.feeds where !wanted.contains(endpoint) || feed.progress.withLock({ $0.ended }) {
                gone.append(feed)
                state.feeds[endpoint] = nil
            }
            return (wanted.filter { state.feeds[$0] == nil }, gone)
        }
        for feed in gone {
            feed.progress.withLock { $0.reader?.cancel() }
            await feed.subscriber.close()
        }
        for endpoint in missing { await startFeed(endpoint) }
    }

    private func startFeed(_ endpoint: RedisEndpoint) async {
        let subscriber = single?.makeSubscriber() ?? cluster?.makeSubscriber(for: endpoint)
        guard let subscriber else { return }
        do {
            let stream = try await subscriber.track(
                RedisTrackingOptions(broadcast: true, prefixes: [configuration.namespace], noLoop: false))
            let feed = Feed(endpoint: endpoint, subscriber: subscriber)
            let changes = state.withLock { state -> RemoteChanges? in
                guard !state.shutDown, state.feeds[endpoint] == nil else { return nil }
                state.feeds[endpoint] = feed
                return state.changes
            }
            guard let changes else {
                await subscriber.close()
                return
            }
            // Changes made before this feed started were never reported here.
            changes.invalidateAll()
            // On the store's event loop, like the supervisor: a busy or blocked cooperative pool must not
            // hold up the feed (the cache's local copies would lapse).
            let reader = Task(executorPreference: executor) { [weak self] in
                for await event in stream {
                    guard let self else { return }
                    self.handle(event, from: feed, changes: changes)
                }
                feed.progress.withLock { $0.ended = true }
            }
            feed.progress.withLock { $0.reader = reader }
        } catch {
            await subscriber.close()
            logger.debug("magpie: the change feed of \(endpoint) could not start", metadata: ["error": "\(error)"])
        }
    }

    private func handle(_ event: RedisInvalidation, from feed: Feed, changes: RemoteChanges) {
        switch event {
        case .keys(let buffers):
            var keys: [[UInt8]] = []
            var heartbeats: [[UInt8]] = []
            keys.reserveCapacity(buffers.count)
            for buffer in buffers {
                let bytes = Array(buffer.readableBytesView)
                guard bytes.count > prefix.count, bytes.starts(with: prefix) else { continue }
                let logical = Array(bytes[prefix.count...])
                if logical[0] == Self.heartbeatTag {
                    heartbeats.append(logical)
                } else {
                    keys.append(logical)
                }
            }
            // The changes first: a heartbeat confirms every change reported with it, before or after it
            // in the message.
            changes.invalidate(keys: keys)
            for heartbeat in heartbeats { heartbeatSeen(heartbeat, on: feed, changes: changes) }
        case .all:
            changes.invalidateAll()
        case .lost:
            break  // confirmations stop; the cache's bound runs from the last one
        case .restored:
            changes.invalidateAll()  // what changed while the feed was down was never reported
        }
    }

    /// A heartbeat reported on `feed`: if it is one of this store's, the master is confirmed through
    /// the instant it was sent.
    private func heartbeatSeen(_ key: [UInt8], on feed: Feed, changes: RemoteChanges) {
        let body = key.dropFirst()
        guard let colon = body.firstIndex(of: UInt8(ascii: ":")),
            String(decoding: body[..<colon], as: UTF8.self) == instance
        else { return }
        let digits = body[(colon + 1)...].prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        guard let sequence = UInt64(String(decoding: digits, as: UTF8.self)) else { return }
        let (seen, watermarkMoved) = feed.progress.withLock { progress -> (Bool, Bool) in
            guard let sentAt = progress.outstanding[sequence] else { return (false, false) }
            progress.confirmed = max(progress.confirmed, sentAt)
            progress.outstanding = progress.outstanding.filter { $0.key > sequence }
            progress.seen = max(progress.seen, sequence)
            return (true, progress.settleWatermark())
        }
        guard seen else { return }
        let through = state.withLock { state -> Int64? in
            let confirmed = state.feeds.values.map { $0.progress.withLock { $0.confirmed } }
            guard let least = confirmed.min(), least > state.delivered else { return nil }
            state.delivered = least
            return least
        }
        if let through { changes.confirm(through: through) }
        if watermarkMoved { reportWatermark(changes) }
    }

    /// The heartbeat `sequence` of `feed` was answered with the fleet's watermark `watermark`.
    private func heartbeatAnswered(_ sequence: UInt64, watermark: Int64, on feed: Feed) {
        let moved = feed.progress.withLock { progress -> Bool in
            progress.watermarks[sequence] = watermark
            if progress.watermarks.count > 64, let oldest = progress.watermarks.keys.min() { progress.watermarks[oldest] = nil }
            return progress.settleWatermark()
        }
        guard moved, let changes = state.withLock({ $0.changes }) else { return }
        reportWatermark(changes)
    }

    /// Reports the least of the feeds' watermarks when it changed (feeds without one yet are left out).
    private func reportWatermark(_ changes: RemoteChanges) {
        let watermark = state.withLock { state -> Int64? in
            let watermarks = state.feeds.values.compactMap { $0.progress.withLock { $0.delivered } }
            guard let least = watermarks.min(), least != state.watermark else { return nil }
            state.watermark = least
            return least
        }
        if let watermark { changes.allDelivered(through: watermark) }
    }

    /// Writes one heartbeat per running feed, in one batch: the heartbeat script, with this instance's
    /// delivery watermark.
    private func sendHeartbeats() async {
        let (feeds, changes) = state.withLock { $0.shutDown ? ([], nil) : (Array($0.feeds.values), $0.changes) }
        guard !feeds.isEmpty, let changes else { return }
        let routing = cluster.map { cluster in cluster.routing.withLock { ($0.slots, $0.nodes.map(\.endpoint)) } }
        let (seconds, attoseconds) = configuration.heartbeatInterval.components
        let interval = max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        let lifetime = max(1000, interval * 10)
        // Read before any heartbeat is sent: a write returned later is after it. Published by the
        // server's clock (the instances' clocks may differ by more than the bound), less the offset's
        // uncertainty; not at all before the first offset is known.
        let batchSentAt = now()
        let offset = state.withLock { $0.serverClock.estimate }
        let watermark: RedisArgument = offset.map { .integer(changes.ownWritesDelivered() + $0.offset - $0.uncertainty) } ?? .string("-")
        var sent: [(feed: Feed, sequence: UInt64, arguments: [RedisArgument])] = []
        for feed in feeds {
            var tag: [UInt8] = []
            if let (slots, endpoints) = routing {
                guard let found = Self.tag(for: feed.endpoint, stem: prefix + Self.fleetKeys[2], slots: slots, endpoints: endpoints)
                else { continue }
                tag = found
            }
            let sequence = state.withLock { state -> UInt64 in
                state.sequence += 1
                return state.sequence
            }
            let key = prefix + [Self.heartbeatTag] + Array("\(instance):\(sequence)".utf8) + tag
            let sentAt = now()
            feed.progress.withLock { progress in
                if progress.outstanding.count >= 64, let oldest = progress.outstanding.keys.min() { progress.outstanding[oldest] = nil }
                progress.outstanding[sequence] = sentAt
            }
            let keys = [key] + Self.fleetKeys.map { prefix + $0 + tag }
            let arguments: [RedisArgument] = [4] + keys.map { .bytes($0) } + [
                .string(instance), watermark, .integer(lifetime), .integer(8 * interval), .integer(3 * interval),
                .integer(max(60_000, 100 * interval)),
            ]
            sent.append((feed, sequence, arguments))
        }
        let commands = sent.map { RedisCommand("EVALSHA", [.string(RedisRemoteScript.heartbeatSHA)] + $0.arguments, keyIndices: [2, 3, 4, 5]) }
        guard !commands.isEmpty, let replies = try? await sender.send(batch: commands) else { return }
        let receivedAt = now()
        var answers: [(index: Int, low: Int64?)] = []
        for (index, reply) in replies.enumerated() where index < sent.count {
            var answer = try? reply.get()
            var answeredAt = receivedAt
            if case .failure(let error) = reply, error.serverError?.kind == .noScript {
                // The server does not know the script yet (restarted, a new node): sent once in full.
                answer = try? await sender.send(
                    RedisCommand("EVAL", [.string(RedisRemoteScript.heartbeat)] + sent[index].arguments, keyIndices: [2, 3, 4, 5]))
                answeredAt = now()
            }
            guard let answer, let (low, serverNow) = Self.heartbeatAnswer(answer) else { continue }
            state.withLock { $0.serverClock.add(serverNow: serverNow, sentAt: batchSentAt, receivedAt: answeredAt) }
            answers.append((index, low))
        }
        // The fleet's watermark by this instance's clock, less the offset's uncertainty.
        guard let estimate = state.withLock({ $0.serverClock.estimate }) else { return }
        // None on the master yet (this instance's first heartbeat, before its clock offset was known,
        // and nobody else's): nothing to report, as before the first heartbeat.
        for (index, low) in answers {
            guard let low else { continue }
            heartbeatAnswered(sent[index].sequence, watermark: low - estimate.offset - estimate.uncertainty, on: sent[index].feed)
        }
    }

    /// The logical keys of the fleet's bookkeeping on each master (see RedisRemoteScript.heartbeat):
    /// under the heartbeat tag, with a byte no instance name has, so the feed ignores them.
    static let fleetKeys: [[UInt8]] = [Array("h~w".utf8), Array("h~l".utf8), Array("h~t".utf8)]

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
    func leaveFleet() async {
        let endpoints = masters()
        let routing = cluster.map { cluster in cluster.routing.withLock { ($0.slots, $0.nodes.map(\.endpoint)) } }
        var commands: [RedisCommand] = []
        for endpoint in endpoints {
            var tag: [UInt8] = []
            if let (slots, nodes) = routing {
                guard let found = Self.tag(for: endpoint, stem: prefix + Self.fleetKeys[2], slots: slots, endpoints: nodes) else { continue }
                tag = found
            }
            for list in Self.fleetKeys.prefix(2) {
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
