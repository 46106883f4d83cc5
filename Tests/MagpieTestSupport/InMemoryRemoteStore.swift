import Magpie
import Synchronization

// A remote store in memory, for testing the composer and the coherence logic without a server: one
// `InMemoryRemoteServer` plays Redis (shared by every cache of a fleet), each cache talks to it through
// an `InMemoryRemoteStore` of its own (a client, with its connection's command timeout and change feed).
//
// It keeps the semantics the remote tier relies on, as MagpieRedis gets them from Redis:
// - fenced writes: `storeIfNewer` applies a versioned value ("MV" + 8-byte big-endian version) only over
//   an absent, unversioned or older one, and refuses one whose deadline passed by the server's clock;
//   removals are versioned tombstones written the same way;
// - change messages: every write publishes one message (key, version, origin, partition, the partition's
//   next sequence number, and the value when the write pushes it) to every client, in the order the
//   writes took effect; a heartbeat every `heartbeat` confirms everything before it, with the total of
//   the partitions' numbers and the fleet's delivery watermark (the least over the clients of what each
//   says it delivered); a client whose cache wants the partitions' numbers gets them with the heartbeat;
//   a write by another program (`foreignWrite`) publishes nothing, and is reported as an invalidation to
//   the clients that track foreign writes;
// - faults: `pause()` (commands queue, run in order at `resume()`; a client gives up on one after its
//   command timeout, and the command still runs late, as a command stuck in a socket does; no heartbeat
//   meanwhile), `goDown()` (every command fails at once, the breaker open), `loseFeed()` (a client's feed
//   drops what it is sent until `restoreFeed()`, which reports everything changed, as a re-established
//   subscription does), `dropMessages` (a fraction of a client's change messages lost, one by one),
//   `restartEmpty()` (the data and the partitions' numbers lost, numbering from 1 again) and
//   `withholdSequences` (the check of the partitions' numbers never answered).

/// The shared server: every key's value and expiry, and the clients' feeds.
public final class InMemoryRemoteServer: Sendable {
    struct Entry {
        var value: [UInt8]
        var expiresAt: Int64
    }

    struct State {
        var entries: [[UInt8]: Entry] = [:]
        /// Each partition's last sequence number, and their total.
        var sequences: [Int: UInt64] = [:]
        var total: UInt64 = 0
        var paused = false
        var down = false
        /// The partitions' numbers are not given to the clients that want them (`withholdSequences`).
        var withholdingSequences = false
        /// Commands waiting for the end of a pause, in arrival order.
        var queued: [@Sendable () -> Void] = []
        var clients: [ObjectIdentifier: InMemoryRemoteStore] = [:]
    }

    let state = Locked(State())
    /// The server's clock (ms since 1970): expiries and write deadlines are judged by it.
    public let now: @Sendable () -> Int64
    let heartbeat: Duration
    private let ticker = Locked<Task<Void, Never>?>(nil)

    /// A server whose clock is `now` (the system clock by default) and whose feeds confirm every `heartbeat`.
    public init(heartbeat: Duration = .milliseconds(20), now: @escaping @Sendable () -> Int64 = { CacheClock.system.now() }) {
        self.heartbeat = heartbeat
        self.now = now
    }

    /// Stops the heartbeats (call when the test ends).
    public func stop() {
        ticker.withLock { $0?.cancel() }
    }

    /// Commands wait (queued, in order) until ``resume()``; no heartbeat is sent meanwhile.
    public func pause() { state.withLock { $0.paused = true } }

    /// Runs the queued commands in order, then serves again.
    public func resume() {
        let queued = state.withLock { state -> [@Sendable () -> Void] in
            state.paused = false
            defer { state.queued = [] }
            return state.queued
        }
        for command in queued { command() }
    }

    /// Every command fails at once (the store is unreachable) until ``comeUp()``.
    public func goDown() { state.withLock { $0.down = true } }
    public func comeUp() { state.withLock { $0.down = false } }

    /// The server restarts empty (as Redis without persistence does after a crash): every key and every
    /// partition's number is gone (numbering starts over at 1), and every client's feed is re-established,
    /// reporting everything changed.
    public func restartEmpty() {
        state.withLock { state in
            state.entries = [:]
            state.sequences = [:]
            state.total = 0
            for client in state.clients.values { client.report(.all) }
        }
    }

    /// The partitions' numbers a client's cache asks for never come (their read fails, each time) while
    /// `withholding`; heartbeats still do.
    public func withholdSequences(_ withholding: Bool) { state.withLock { $0.withholdingSequences = withholding } }

    /// The raw value under `key` (a logical key with the client's namespace: the store adds none).
    public func value(_ key: [UInt8]) -> [UInt8]? { state.withLock { $0.entries[key]?.value } }

    /// The partitions of the server's keys.
    public static let partitionCount = 256

    static func partition(of key: [UInt8]) -> Int {
        Int(key.reduce(UInt32(2_166_136_261)) { ($0 ^ UInt32($1)) &* 16_777_619 } % UInt32(partitionCount))
    }

    /// Writes `value` under `key` as another program would (no fence, no change message), reported to the
    /// clients that track foreign writes.
    public func foreignWrite(_ key: [UInt8], _ value: [UInt8]) {
        execute { state in
            state.entries[key] = Entry(value: value, expiresAt: 0)
            for client in state.clients.values where client.tracksForeignWrites { client.report(.keys([key])) }
            return []
        }
    }

    /// The change message of a write of `key` by `origin`: the partition's next number, to every client.
    static func publish(_ key: [UInt8], version: UInt64, by origin: InMemoryRemoteStore, value: [UInt8]?, in state: inout State) {
        let partition = partition(of: key)
        let sequence = (state.sequences[partition] ?? 0) + 1
        state.sequences[partition] = sequence
        state.total += 1
        for client in state.clients.values {
            let message = RemoteChangeMessage(
                key: key, version: version, own: client === origin, partition: partition, sequence: sequence, value: value)
            client.report(.message(message))
        }
    }

    // MARK: Commands

    /// Runs `command` now, or queued until the pause ends (a command publishes its own messages, under the
    /// server's lock: every client hears them in the order the commands ran).
    func execute(_ command: @escaping @Sendable (inout State) -> [[UInt8]]) {
        let run: @Sendable () -> Void = { [self] in
            state.withLock { state in _ = command(&state) }
        }
        let queued = state.withLock { state -> Bool in
            guard state.paused else { return false }
            state.queued.append(run)
            return true
        }
        if !queued { run() }
    }

    /// A live value (an expired one is removed, as Redis's lazy expiry does; expiries publish nothing).
    static func live(_ key: [UInt8], in state: inout State, now: Int64) -> [UInt8]? {
        guard let entry = state.entries[key] else { return nil }
        if entry.expiresAt != 0 && entry.expiresAt <= now {
            state.entries[key] = nil
            return nil
        }
        return entry.value
    }

    func attach(_ client: InMemoryRemoteStore) {
        state.withLock { $0.clients[ObjectIdentifier(client)] = client }
        ticker.withLock { ticker in
            guard ticker == nil else { return }
            ticker = Task { [weak self] in
                while !Task.isCancelled {
                    guard let self else { return }
                    try? await Task.sleep(for: self.heartbeat)
                    self.beat()
                }
            }
        }
    }

    func detach(_ client: InMemoryRemoteStore) {
        state.withLock { _ = $0.clients.removeValue(forKey: ObjectIdentifier(client)) }
    }

    /// A heartbeat on every feed (unless paused): the partitions' numbers to a client whose cache wants
    /// them, then the confirmation of every message before it with the total, and the fleet's delivery
    /// watermark, the least of the clients'.
    private func beat() {
        state.withLock { state in
            guard !state.paused, !state.down else { return }
            let sentAt = now()
            let watermark = state.clients.values.compactMap { $0.ownWritesDelivered() }.min()
            for client in state.clients.values {
                if client.sequencesWanted && !state.withholdingSequences { client.report(.sequences(state.sequences)) }
                client.report(.confirmed(sentAt, total: state.total))
                if let watermark { client.report(.delivered(watermark)) }
            }
        }
    }
}

/// One cache's client of an ``InMemoryRemoteServer``.
public final class InMemoryRemoteStore: RemoteStore {
    enum Report {
        case message(RemoteChangeMessage)
        case sequences([Int: UInt64])
        case keys([[UInt8]])
        case all
        case confirmed(Int64, total: UInt64)
        case delivered(Int64)
    }

    public let server: InMemoryRemoteServer
    /// How long a call waits for a paused server before it fails (its command still runs later).
    let commandTimeout: Duration
    /// Whether writes by other programs are reported to this client (`foreignWrite`).
    let tracksForeignWrites: Bool
    private let feed = Locked<(changes: RemoteChanges?, lost: Bool, dropping: Double)>((nil, false, 0))
    private let closed = Atomic<Bool>(false)
    private let conditionalRemovals = Atomic<Int>(0)

    public init(_ server: InMemoryRemoteServer, commandTimeout: Duration = .milliseconds(300), tracksForeignWrites: Bool = false) {
        self.server = server
        self.commandTimeout = commandTimeout
        self.tracksForeignWrites = tracksForeignWrites
    }

    /// A fraction (0…1) of this client's change messages is lost from now on, each on its own.
    public func dropMessages(_ fraction: Double) { feed.withLock { $0.dropping = fraction } }

    var sequencesWanted: Bool { feed.withLock { $0.changes }?.sequencesWanted ?? false }

    /// This client's feed drops what it is sent (no changes, no confirmations) until ``restoreFeed()``.
    public func loseFeed() { feed.withLock { $0.lost = true } }

    /// The feed is back: everything may have changed meanwhile.
    public func restoreFeed() {
        let changes = feed.withLock { feed -> RemoteChanges? in
            feed.lost = false
            return feed.changes
        }
        changes?.invalidateAll()
    }

    func report(_ report: Report) {
        let (changes, dropping) = feed.withLock { ($0.lost ? nil : $0.changes, $0.dropping) }
        guard let changes else { return }
        switch report {
        case .message(let message):
            if dropping > 0 && Double.random(in: 0..<1) < dropping { return }
            changes.changed(message)
        case .sequences(let numbers): changes.sequences(numbers)
        case .keys(let keys): changes.invalidate(keys: keys)
        case .all: changes.invalidateAll()
        case .confirmed(let instant, let total): changes.confirm(through: instant, total: total)
        case .delivered(let instant): changes.allDelivered(through: instant)
        }
    }

    func ownWritesDelivered() -> Int64? {
        feed.withLock { $0.changes }?.ownWritesDelivered()
    }

    /// Runs `body` on the server (queued while it is paused) and waits for it, at most the command timeout.
    /// `body` publishes the change messages of what it wrote (``InMemoryRemoteServer/publish(_:version:by:value:in:)``).
    private func call<R: Sendable>(_ body: @escaping @Sendable (inout InMemoryRemoteServer.State, Int64) -> R) async throws(MagpieError) -> R {
        guard !closed.load(ordering: .relaxed) else { throw MagpieError(.remoteUnavailable, "the store is shut down") }
        guard !server.state.withLock({ $0.down }) else { throw MagpieError(.remoteUnavailable, "the server is down") }
        let reply = Reply<R>()
        let now = server.now
        server.execute { state in
            reply.fill(body(&state, now()))
            return []
        }
        guard let result = await reply.wait(upTo: commandTimeout) else {
            throw MagpieError(.remoteUnavailable, "the command timed out")
        }
        return result
    }

    // MARK: RemoteStore

    public func values(forKeys keys: [[UInt8]]) async throws(MagpieError) -> [[UInt8]?] {
        try await call { state, now in keys.map { InMemoryRemoteServer.live($0, in: &state, now: now) } }
    }

    public func store(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, onlyIfAbsent: Bool) async throws(MagpieError) -> Bool {
        try await call { [self] state, now in
            if onlyIfAbsent && InMemoryRemoteServer.live(key, in: &state, now: now) != nil { return false }
            if expiresAt != 0 && expiresAt <= now {
                state.entries[key] = nil
            } else {
                state.entries[key] = .init(value: value, expiresAt: expiresAt)
            }
            // A conditional store (a lease taken, a token created) changes nothing a cache holds: no message.
            if !onlyIfAbsent { InMemoryRemoteServer.publish(key, version: 0, by: self, value: nil, in: &state) }
            return true
        }
    }

    public func storeIfNewer(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool)
        async throws(MagpieError) -> Bool
    {
        guard let version = Self.version(value) else {
            throw MagpieError(.invalidConfiguration, "a versioned value must start with \"MV\" and its 8-byte version")
        }
        return try await call { [self] state, now in
            if notAfter != 0 && now > notAfter { return false }
            if let current = InMemoryRemoteServer.live(key, in: &state, now: now), let held = Self.version(current), held >= version {
                return false
            }
            if expiresAt != 0 && expiresAt <= now { return false }
            state.entries[key] = .init(value: value, expiresAt: expiresAt)
            InMemoryRemoteServer.publish(key, version: version, by: self, value: pushing ? value : nil, in: &state)
            return true
        }
    }

    public func remove(keys: [[UInt8]]) async throws(MagpieError) {
        try await call { [self] state, _ in
            for key in keys where state.entries.removeValue(forKey: key) != nil {
                InMemoryRemoteServer.publish(key, version: 0, by: self, value: nil, in: &state)
            }
        }
    }

    /// How many times ``remove(_:ifValue:)`` was called (a lease's release), whether it reached the server or not.
    public var conditionalRemovalsAsked: Int { conditionalRemovals.load(ordering: .relaxed) }

    public func remove(_ key: [UInt8], ifValue value: [UInt8]) async throws(MagpieError) -> Bool {
        conditionalRemovals.add(1, ordering: .relaxed)
        return try await call { [self] state, now in
            guard InMemoryRemoteServer.live(key, in: &state, now: now) == value else { return false }
            state.entries[key] = nil
            InMemoryRemoteServer.publish(key, version: 0, by: self, value: nil, in: &state)
            return true
        }
    }

    public var partitionCount: Int { InMemoryRemoteServer.partitionCount }

    public func partition(of key: [UInt8]) -> Int { InMemoryRemoteServer.partition(of: key) }

    public var taskExecutor: (any TaskExecutor)? { nil }

    public func startReporting(to changes: RemoteChanges) {
        feed.withLock { $0.changes = changes }
        server.attach(self)
        // Changes made before the feed started were never reported here.
        changes.invalidateAll()
    }

    public var failsFast: Bool { server.state.withLock { $0.down } }

    public var callerMayWait: Bool { true }

    public func shutdown() async {
        closed.store(true, ordering: .relaxed)
        server.detach(self)
        feed.withLock { $0.changes = nil }
    }

    /// The version of a fenced value, nil for one without a fence.
    static func version(_ value: [UInt8]) -> UInt64? {
        guard value.count >= 10, value[0] == 0x4D, value[1] == 0x56 else { return nil }
        return value[2..<10].reduce(0) { $0 << 8 | UInt64($1) }
    }
}

/// A command's reply, waited for with a time limit: filled at most once.
private final class Reply<R: Sendable>: Sendable {
    private let state = Locked<(value: R?, waiter: CheckedContinuation<R?, Never>?, done: Bool)>((nil, nil, false))

    func fill(_ value: R) {
        let waiter = state.withLock { state -> CheckedContinuation<R?, Never>? in
            guard !state.done else { return nil }
            state.value = value
            state.done = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: value)
    }

    private func give(up: Void) {
        let waiter = state.withLock { state -> CheckedContinuation<R?, Never>? in
            guard !state.done else { return nil }
            state.done = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
    }

    /// The value, or nil if it did not come within `limit`.
    func wait(upTo limit: Duration) async -> R? {
        let timer = Task { [self] in
            try? await Task.sleep(for: limit)
            give(up: ())
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { (continuation: CheckedContinuation<R?, Never>) in
            let now = state.withLock { state -> (Bool, R?) in
                guard !state.done else { return (true, state.value) }
                state.waiter = continuation
                return (false, nil)
            }
            if now.0 { continuation.resume(returning: now.1) }
        }
    }
}
