import Foundation
import Magpie
import MagpieRedis

// What a worker's callers do: Zipf reads, with a share of sets and removals of the same keys, through
// the system under test (FleetSystem.swift); a miss goes to the "origin" (the shared table's newest
// version, after `origin-us` of simulated work) and fills the system. Every read is checked against
// the shared truth. These are the thread callers (`--tasks 0`, the systems' blocking forms); the task
// callers are in FleetWorker+Tasks.swift. Each measured call to the system runs with its kind in
// `FleetRoundTrips.cause`, which the Redis round trips it causes are counted by (FleetRoundTrips.swift).

extension FleetInstance {
    /// Runs the workload from the warm-up until `end` on this thread (`--tasks 0`); only what happens
    /// from `start` on is counted.
    func drive(thread: Int, from start: Int64, until end: Int64, tally: FleetTally) {
        let local = FleetTally()
        let warmup = FleetTally(measured: false)
        var operations = FleetOperations(self, seed: UInt64(options.index * 1000 + thread))
        while true {
            let now = monotonicNanoseconds()
            if now >= end || table.load(table.stopWord) != 0 { break }
            let (key, kind) = operations.next()
            let counted = now >= start ? local : warmup
            switch kind {
            case .remove: change(key, removal: true, tally: counted)
            case .set: change(key, removal: false, tally: counted)
            case .read: read(key, tally: counted)
            }
            counted.allLatency.record(monotonicNanoseconds() - now)
        }
        tally.merge(local)
    }

    /// A set (a new version, written through) or a removal (a new version in the origin, the cached
    /// value removed), with the key's lock held.
    private func change(_ key: Int, removal: Bool, tally: FleetTally) {
        if !keyLocks.lockBlocking(key) { FleetShared.abandon(key) }
        defer { keyLocks.unlockBlocking(key) }
        let version = table.nextVersion(key)
        let began = monotonicNanoseconds()
        do {
            if removal {
                try FleetRoundTrips.runBlocking(.removal, measured: tally.measured) { try system.removeBlocking(Self.name(key)) }
                tally.removes += 1
            } else {
                let value = value(key, version: version)
                try FleetRoundTrips.runBlocking(.set, measured: tally.measured) { try system.setBlocking(Self.name(key), value) }
                tally.writes += 1
            }
        } catch {
            tally.recordCallerError(table)
        }
        let finished = monotonicNanoseconds()
        recordChange(removal: removal, began: began, finished: finished, tally: tally)
        // The origin changed whether or not the system's call succeeded.
        table.recordWrite(key, version: version, removal: removal, now: finished)
    }

    private func read(_ key: Int, tally: FleetTally) {
        let started = monotonicNanoseconds()
        tally.reads += 1
        do {
            let read = try FleetRoundTrips.runBlocking(.read, measured: tally.measured) { try system.readBlocking(Self.name(key), key: key) }
            judgeRead(key, read, started: started, tally: tally)
        } catch {
            tally.recordCallerError(table)
        }
    }

    /// A set's or removal's latency, tallied (a set's also in the pause rows).
    func recordChange(removal: Bool, began: Int64, finished: Int64, tally: FleetTally) {
        if removal {
            tally.removeLatency.record(finished - began)
        } else {
            tally.storeLatency.record(finished - began)
            tally.recordPhase(store: true, began: began, finished: finished, table: table)
        }
    }

    /// A read that returned `read`: counted, timed (in the pause rows too; a memory hit also in the hit
    /// rows), and judged against the ground truth.
    func judgeRead(_ key: Int, _ read: FleetRead, started: Int64, tally: FleetTally) {
        let finished = monotonicNanoseconds()
        tally.readLatency.record(finished - started)
        tally.recordReadPhase(began: started, finished: finished, table: table)
        switch read.source {
        case .memory:
            tally.memoryHits += 1
            tally.recordPhase(store: false, began: started, finished: finished, table: table)
        case .disk: tally.diskHits += 1
        case .remote: tally.remoteHits += 1
        case .origin, .unknown: break
        }
        guard let (owner, version) = FleetValue.parse(read.value), owner == key else {
            tally.wrongValues += 1
            return
        }
        judge(key, version: version, readStarted: started, source: read.source, tally: tally)
    }

    /// A read of `version` that started at `readStarted` is stale beyond the bound when a newer version
    /// had replaced it more than the bound before the read began (the replacing write's return instant
    /// is known exactly when it is the latest or the one before; older ones replaced it no later than
    /// the previous write returned, so this never over-counts). A read whose key's record stayed mid-write
    /// through every attempt to read it whole is not judged (rare: its writer was descheduled midway).
    private func judge(_ key: Int, version: Int64, readStarted: Int64, source: FleetSource, tally: FleetTally) {
        guard let truth = table.truth(key), version < truth.latest else { return }
        let replacedAt = version == truth.previous ? truth.latestAt : truth.previousAt
        guard replacedAt > 0, replacedAt < readStarted - boundNs else { return }
        tally.staleBeyondBound += 1
        if source == .remote { tally.staleFromRemote += 1 }
        let windows = table.faultWindows(at: readStarted)
        if FleetInstance.tracing {
            // Instants in ms from the measurement's start, as the trace lines (FleetWorker.swift).
            let start = table.load(table.startWord)
            func ms(_ instant: Int64) -> Int64 { (instant - start) / 1_000_000 }
            let line = "stale read: key \(key) version \(version) from \(source) at \(ms(readStarted)) ms (windows \(windows.rawValue)); "
                + "latest \(truth.latest)\(truth.removal ? " (removal)" : "") returned at \(ms(truth.latestAt)) ms, "
                + "previous \(truth.previous) at \(ms(truth.previousAt)) ms\n"
            FileHandle.standardError.write(Data(line.utf8))
        }
        tally.windows.count(.stale, windows)
        // The value was removed (the latest change is a removal) long enough ago: served again.
        if truth.removal && truth.latestAt < readStarted - boundNs {
            tally.resurrected += 1
            tally.windows.count(.resurrected, windows)
        }
    }
}

/// One caller's operations: Zipf-ranked keys, each a read, a set or a removal by the configured shares.
struct FleetOperations {
    enum Kind { case read, set, remove }

    private let workload: ZipfWorkload
    private let setShare: Double
    private let removeShare: Double
    private var state: UInt64
    private var draws: UInt64
    private var ranks: [UInt32] = []
    private var position: Int
    private static let batch = 4096

    init(_ instance: FleetInstance, seed: UInt64) {
        workload = instance.workload
        setShare = instance.options.setShare
        removeShare = instance.options.removeShare
        state = splitmix64(seed &+ 0x5EED)
        // The operation draws come from a generator of their own: the ranks' generator's outputs are the
        // Zipf draws themselves (a shared stream would send every write to the hottest key).
        draws = splitmix64(state ^ 0xD1CE_D1CE_D1CE_D1CE)
        position = Self.batch
    }

    mutating func next() -> (key: Int, kind: Kind) {
        if position == Self.batch {
            state = splitmix64(state)
            ranks = workload.ranks(seed: state, count: Self.batch)
            position = 0
        }
        let key = Int(ranks[position])
        position += 1
        draws = splitmix64(draws)
        let draw = Double(draws >> 11) * (1.0 / 9_007_199_254_740_992.0)
        if draw < removeShare { return (key, .remove) }
        if draw < removeShare + setShare { return (key, .set) }
        return (key, .read)
    }
}
