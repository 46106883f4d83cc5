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
    private func masters() -> [RedisEndpoint] {
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
            keys.reserveCapacity(buffers.count)
            for buffer in buffers {
                let bytes = Array(buffer.readableBytesView)
                guard bytes.count > prefix.count, bytes.starts(with: prefix) else { continue }
                let logical = Array(bytes[prefix.count...])
                if logical[0] == Self.heartbeatTag {
                    heartbeatSeen(logical, on: feed, changes: changes)
                } else {
                    keys.append(logical)
                }
            }
            changes.invalidate(keys: keys)
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
        let seen = feed.progress.withLock { progress -> Bool in
            guard let sentAt = progress.outstanding[sequence] else { return false }
            progress.confirmed = max(progress.confirmed, sentAt)
            progress.outstanding = progress.outstanding.filter { $0.key > sequence }
            return true
        }
        guard seen else { return }
        let through = state.withLock { state -> Int64? in
            let confirmed = state.feeds.values.map { $0.progress.withLock { $0.confirmed } }
            guard let least = confirmed.min(), least > state.delivered else { return nil }
            state.delivered = least
            return least
        }
        if let through { changes.confirm(through: through) }
    }

    /// Writes one heartbeat per running feed, in one batch.
    private func sendHeartbeats() async {
        let feeds = state.withLock { $0.shutDown ? [] : Array($0.feeds.values) }
        guard !feeds.isEmpty else { return }
        let routing = cluster.map { cluster in cluster.routing.withLock { ($0.slots, $0.nodes.map(\.endpoint)) } }
        let lifetime = max(Duration.seconds(1), configuration.heartbeatInterval * 10)
        var commands: [RedisCommand] = []
        for feed in feeds {
            let sequence = state.withLock { state -> UInt64 in
                state.sequence += 1
                return state.sequence
            }
            var key = prefix + [Self.heartbeatTag] + Array("\(instance):\(sequence)".utf8)
            if let (slots, endpoints) = routing {
                guard let tagged = Self.tagged(key, for: feed.endpoint, slots: slots, endpoints: endpoints) else { continue }
                key = tagged
            }
            let sentAt = now()
            feed.progress.withLock { progress in
                if progress.outstanding.count >= 64, let oldest = progress.outstanding.keys.min() { progress.outstanding[oldest] = nil }
                progress.outstanding[sequence] = sentAt
            }
            commands.append(.set(key, [UInt8(ascii: "1")], expiration: lifetime))
        }
        _ = try? await sender.send(batch: commands)
    }

    /// `key` with a hash tag that puts it on a slot `endpoint` owns (nil if none of 4,096 tags does).
    static func tagged(_ key: [UInt8], for endpoint: RedisEndpoint, slots: [UInt16], endpoints: [RedisEndpoint]) -> [UInt8]? {
        guard slots.count == RedisHashSlot.count else { return nil }
        for index in 0..<4096 {
            let candidate = key + Array("{\(index)}".utf8)
            let owner = Int(slots[Int(RedisHashSlot.slot(of: candidate))])
            if owner < endpoints.count, endpoints[owner] == endpoint { return candidate }
        }
        return nil
    }
}
