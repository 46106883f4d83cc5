// The loader API: single flight, stale-while-revalidate, eager refresh, fail-safe, soft and hard
// timeouts, negative caching. The article "Freshness and loaders" says what a user sees; this says how.
//
// A call reads the key's entry with its freshness (memory, then disk; negative entries included) and
// judges it at one instant `now`:
//   fresh (now < fresh-until, or no freshness)  → served; an eager refresh starts when it is due.
//   stale (fresh-until ≤ now < expiry)          → served at once when the key is throttled (a failed
//                                                 load left it in place) or with stale-while-revalidate
//                                                 (a background load starts); else it is the fallback
//                                                 of a load the caller waits for.
//   absent or expired                           → the caller waits for a load.
// Nothing past its expiry is ever served: the tiers never return it, and a fallback is checked again
// against its expiry (and fail-safe's maximum age) at the instant it would be served.
//
// `flights` maps a key (by its 64-bit hash; the flight holds the key's bytes, which every look-up
// compares) to the load running for it: one per key, whatever started it (a caller
// who missed, a background refresh). The first caller to need a load creates the flight; the load runs
// in a task of its own (async API) or on the caller's thread or a loader thread (synchronous API), so
// cancelling a caller never cancels a load another caller waits for, nor a background refresh, nor a
// load a caller stopped waiting for at a timeout. When the load returns, its value lands in the cache
// *before* the flight leaves the map, and a caller that finds no flight re-checks memory under the
// map's lock: so a caller arriving just after a load sees its value instead of starting another.
//
// Landing never undoes a newer write. Every store and removal of a key marks the key's running flight
// superseded (`LoadCoordinator.supersede`, one atomic load when no load runs), and a group removal or a
// removal of everything marks all of them, *before* writing; the landing checks the mark and stores
// holding the same lock (`Flight.superseded`), so either the landing comes first and the write then
// replaces or removes its value, or the mark comes first and the value is not stored (counted in
// `loadsSuperseded`; its callers still get it). A load that started after the write began is newer
// than it and lands.
//
// A failed load leaves the key's stale value in place; when fail-safe allows that value, the key is
// throttled: for `failSafeThrottle` (never past the value's maximum age or expiry) callers get it
// without a load, so a failing origin sees one load per key per throttle period.

import Logging
import Synchronization

// MARK: - The protocol

/// A key throttled after a failed load (see `LoadCoordinator.throttles`).
struct Throttle: Sendable {
    let name: [UInt8]
    let until: Int64
}

/// One loader call: its key and what it was asked with.
struct LoaderCall: Sendable {
    let name: [UInt8]
    let hash: UInt64
    let options: EntryOptions
    let loader: LoaderOptions
    let work: LoadWork
    let acceptsAbsence: Bool
    /// The caller did not read the store: its load asks for the value with the lease (one round trip).
    var readsWithLease = false
}

/// What a call does with what it read.
enum LoaderVerdict {
    /// Return this (nil: a remembered absence).
    case serve([UInt8]?)
    /// Wait for a load; the stale value, if any, may stand in (fail-safe, soft timeout).
    case load(fallback: StoredEntry?)
}

/// The loader API's state and protocol for one cache: the load running for each key (its flight), the
/// keys fail-safe throttles, the threads that run synchronous loads, and the supersede marks every store
/// and removal sets. It reads and writes through the cache's composition, whatever its tiers.
final class LoadCoordinator: Sendable {
    let composition: Composition
    let runtime: Runtime
    let defaultOptions: EntryOptions
    let defaultLoaderOptions: LoaderOptions
    /// Runs the synchronous loader API's loads that must not run on their caller's thread.
    let loaderPool: IOThreadPool
    /// The load running for each key, keyed by the key's 64-bit hash; each flight holds its key's bytes,
    /// which every look-up compares.
    let flights = Locked<[UInt64: Flight]>([:])
    /// How many loads `flights` holds: read without the lock by every store and removal, which
    /// supersede a running load of their key only when there is one.
    let flightCount = Atomic<Int>(0)
    /// Keys whose stale value fail-safe serves without loading until the instant given (ms).
    let throttles = Locked<[UInt64: Throttle]>([:])
    /// How many keys `throttles` holds (read without the lock: a stale hit looks only when some are).
    let throttleCount = Atomic<Int>(0)

    var clock: CacheClock { runtime.clock }

    init(_ composition: Composition, runtime: Runtime, configuration: Cache.Configuration) {
        self.composition = composition
        self.runtime = runtime
        defaultOptions = configuration.defaultOptions
        defaultLoaderOptions = configuration.defaultLoaderOptions
        loaderPool = IOThreadPool(threadCount: configuration.loaderThreadCount, name: "magpie-load")
    }

    // MARK: Supersede

    /// Marks the running load of `key`, if any, superseded, so that its value does not land over this
    /// newer write. Waits while that load's value is landing. Costs one atomic load when no load runs.
    @inline(__always)
    func supersede(_ key: HashedKey) {
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return }
        supersedeRunning(key)
    }

    @inline(never)
    private func supersedeRunning(_ key: HashedKey) {
        let flight = flights.withLock { flights in flights[key.hash].flatMap { sameKey($0.name, key.bytes) ? $0 : nil } }
        flight?.superseded.withLock { $0 = true }
    }

    /// ``supersede(_:)`` for a caller that must not wait (an inline async store): false, with nothing
    /// marked, when the key's load is landing now (its value is being stored, with the disk's waits, under
    /// the lock this would take).
    @inline(__always)
    func supersede(_ key: HashedKey, wait: ReadWait) -> Bool {
        guard wait == .ifImmediate else {
            supersede(key)
            return true
        }
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return true }
        let flight = flights.withLock { flights in flights[key.hash].flatMap { sameKey($0.name, key.bytes) ? $0 : nil } }
        guard let flight else { return true }
        return flight.superseded.withLockIfAvailable { $0 = true } != nil
    }

    /// Marks every running load superseded (a removal of all entries, or of a group).
    func supersedeAll() {
        guard flightCount.load(ordering: .sequentiallyConsistent) != 0 else { return }
        for flight in flights.withLock({ Array($0.values) }) { flight.superseded.withLock { $0 = true } }
    }

    func shutdown() { loaderPool.shutdown() }

    // MARK: The protocol

    nonisolated(nonsending)
    func loadingValue(
        _ name: [UInt8], _ options: EntryOptions?, _ loader: LoaderOptions?, _ work: LoadWork, acceptsAbsence: Bool,
        _ probe: LoaderProbe
    ) async throws -> [UInt8]? {
        var (call, firstEntry, probedMemory) = try makeCall(name, options, loader, work, acceptsAbsence: acceptsAbsence, probe)
        var (first, memory) = (firstEntry, probedMemory)
        while true {
            defer { memory = nil }  // later rounds read again
            let entry: StoredEntry?
            if let found = first.take() {
                entry = found
            } else if case .nothing? = memory, !composition.readsPastMemory {
                entry = nil
            } else {
                // A key removed lately: the load's lease round trip reads the value too.
                call.readsWithLease = composition.policy.readsWithLease(call.hash)
                entry = try await composition.read(
                    call.name, hash: call.hash, .entry, memory: memory, unverifiedFallback: true, fetching: !call.readsWithLease)?.0
            }
            let fallback: StoredEntry?
            switch judge(entry, call) {
            case .serve(let value): return value
            case .load(let stale): fallback = stale
            }
            guard let flight = joinOrStart(call, fallback: fallback) else { continue }
            let outcome = try await flight.wait(
                timers: timers(call, fallback: fallback), clock: clock,
                onAbandon: { [self, hash = call.hash] in leave(flight, hash: hash) })
            if let settled = try settle(outcome, call, fallback: fallback) { return settled }
        }
    }

    func loadingValueBlocking(
        _ name: [UInt8], _ options: EntryOptions?, _ loader: LoaderOptions?, _ work: LoadWork, acceptsAbsence: Bool,
        _ probe: LoaderProbe
    ) throws -> [UInt8]? {
        var (call, firstEntry, probedMemory) = try makeCall(name, options, loader, work, acceptsAbsence: acceptsAbsence, probe)
        var (first, memory) = (firstEntry, probedMemory)
        while true {
            defer { memory = nil }  // later rounds read again
            let walkMemory = memory
            let entry: StoredEntry?
            if let found = first.take() {
                entry = found
            } else {
                call.readsWithLease = composition.policy.readsWithLease(call.hash)
                let fetching = !call.readsWithLease
                entry = try runtime.withKey(call.name, hash: call.hash) { key throws(MagpieError) -> StoredEntry? in
                    try composition.read(key, .entry, memory: walkMemory, unverifiedFallback: true, fetching: fetching)?.0
                }
            }
            let fallback: StoredEntry?
            switch judge(entry, call) {
            case .serve(let value): return value
            case .load(let stale): fallback = stale
            }
            guard let flight = joinOrStart(call, fallback: fallback, callerRunsLoad: timers(call, fallback: fallback).isEmpty)
            else { continue }
            let outcome = flight.waitBlocking(timers: timers(call, fallback: fallback), clock: clock)
            if let settled = try settle(outcome, call, fallback: fallback) { return settled }
        }
    }

    /// The call, with what its first probe found: the entry to judge first, and what the first walk
    /// need not read of memory again.
    private func makeCall(
        _ name: [UInt8], _ options: EntryOptions?, _ loader: LoaderOptions?, _ work: LoadWork, acceptsAbsence: Bool,
        _ probe: LoaderProbe
    ) throws(MagpieError) -> (LoaderCall, StoredEntry?, MemorySeen?) {
        // No hash: the probe refused the key (too long, or the cache closed).
        guard case (let first, let hash?) = probe.found else { throw runtime.refusal(keyLength: name.count) }
        let call = LoaderCall(
            name: name, hash: hash, options: options ?? defaultOptions, loader: loader ?? defaultLoaderOptions, work: work,
            acceptsAbsence: acceptsAbsence)
        return (call, first, probe.memory)
    }

    /// What to do with `entry` (see the top of this file); counts the hit it serves and starts the
    /// background refresh it calls for.
    private func judge(_ entry: StoredEntry?, _ call: LoaderCall) -> LoaderVerdict {
        guard let entry, call.acceptsAbsence || !entry.freshness.negative else { return .load(fallback: nil) }
        let now = clock.now()
        if entry.unverified {
            // Past the remote tier's staleness bound: only fail-safe may serve it (a failed load, or
            // the throttle a failed load left).
            guard call.name.withUnsafeBytes({ isThrottled(call.hash, $0, now: now) }) else { return .load(fallback: entry) }
            runtime.count(.staleHits)
            return .serve(entry.value)
        }
        let freshness = entry.freshness
        if freshness.isFresh(at: now) {
            if freshness.negative {
                runtime.count(.negativeHits)
            } else {
                runtime.count(.freshHits)
            }
            if call.loader.eagerRefreshDue(freshUntil: freshness.freshUntil, loadedAt: freshness.loadedAt, now: now) {
                refreshInBackground(call, current: entry, now: now)
            }
            return .serve(freshness.negative ? nil : entry.value)
        }
        if call.name.withUnsafeBytes({ isThrottled(call.hash, $0, now: now) }) || call.loader.staleWhileRevalidate {
            runtime.count(.staleHits)
            refreshInBackground(call, current: entry, now: now)
            return .serve(entry.value)
        }
        return .load(fallback: entry)
    }

    /// Whether a failed load left `name` throttled at `now`.
    @inline(__always)
    func isThrottled(_ hash: UInt64, _ name: UnsafeRawBufferPointer, now: Int64) -> Bool {
        guard throttleCount.load(ordering: .relaxed) != 0 else { return false }
        return throttles.withLock { throttles in
            guard let throttle = throttles[hash], sameKey(throttle.name, name) else { return false }
            if throttle.until > now { return true }
            throttles[hash] = nil
            throttleCount.store(throttles.count, ordering: .relaxed)
            return false
        }
    }

    /// Whether a load of the key `name` (hash `hash`) is running.
    @inline(__always)
    func loadRunning(_ hash: UInt64, _ name: UnsafeRawBufferPointer) -> Bool {
        flights.withLock { flights in flights[hash].map { sameKey($0.name, name) } ?? false }
    }

    /// Starts a load of `call`'s key that no caller waits for, unless one is running or the key is
    /// throttled.
    private func refreshInBackground(_ call: LoaderCall, current: StoredEntry, now: Int64) {
        guard !call.name.withUnsafeBytes({ isThrottled(call.hash, $0, now: now) }) else { return }
        let flight = flights.withLock { flights -> Flight? in
            // A running load of this key, or of another with the same 64-bit hash: no refresh now (the
            // stale value stays served; a later stale hit asks again).
            guard flights[call.hash] == nil else { return nil }
            let flight = Flight(name: call.name, fallback: current, options: call.loader, detached: true)
            flights[call.hash] = flight
            flightCount.add(1, ordering: .sequentiallyConsistent)
            return flight
        }
        guard let flight else { return }
        runtime.count(.loaderRuns)
        runtime.count(.backgroundRefreshes)
        run(flight, call)
    }

    /// Joins the key's running load or starts one; nil when a load that ended just now may have stored
    /// a value the caller can serve (read again). With `callerRunsLoad`, a load this caller starts runs
    /// here, on its thread, before the call returns (the synchronous API without timeouts).
    private func joinOrStart(_ call: LoaderCall, fallback: StoredEntry?, callerRunsLoad: Bool = false) -> Flight? {
        let joined = flights.withLock { flights -> (Flight, Bool)? in
            let running = flights[call.hash]
            if let running, running.name == call.name, running.join() { return (running, false) }
            if composition.servableInMemory(call, now: clock.now()) { return nil }  // stored by a flight that just ended?
            let flight = Flight(name: call.name, fallback: fallback, options: call.loader, detached: false)
            _ = flight.join()
            // Another key with the same 64-bit hash has the slot: this load runs unregistered (no single
            // flight for it; astronomically rare).
            guard running == nil || running?.name == call.name else { return (flight, true) }
            flights[call.hash] = flight
            flightCount.add(1, ordering: .sequentiallyConsistent)
            return (flight, true)
        }
        guard let (flight, isNew) = joined else { return nil }
        if isNew {
            runtime.count(.loaderRuns)
            if callerRunsLoad, case .blocking(let load) = call.work {
                runBlocking(flight, call, load)
            } else {
                run(flight, call)
            }
        } else {
            runtime.count(.loaderCoalesced)
        }
        return flight
    }

    private func timers(_ call: LoaderCall, fallback: StoredEntry?) -> LoadTimers {
        // A soft timeout serves the stale value while the load goes on: not one past the remote tier's
        // staleness bound (fail-safe alone may).
        LoadTimers(soft: fallback == nil || fallback?.unverified == true ? nil : call.loader.softTimeout, hard: call.loader.hardTimeout)
    }

    /// Takes an abandoned flight out of the map (its last caller was cancelled).
    func leave(_ flight: Flight, hash: UInt64) {
        flights.withLock { flights in
            if flights[hash] === flight {
                flights[hash] = nil
                flightCount.subtract(1, ordering: .sequentiallyConsistent)
            }
        }
    }

    /// Starts `flight`'s load where it runs: a task (async API), or a loader thread.
    private func run(_ flight: Flight, _ call: LoaderCall) {
        switch call.work {
        case .async(let load):
            flight.start(
                Task { [self] in
                    // A cache with a remote tier loads once for the fleet: the lease's holder loads, the
                    // others wait for its value (RemotePolicy+Lease.swift).
                    let lease = await composition.acquireLoad(call)
                    guard let (started, version) = begin(flight, call, lease) else { return }
                    let result: Result<[UInt8]?, any Error>
                    do { result = .success(try await load()) } catch { result = .failure(error) }
                    let landed: RemoteSend?? = try? await composition.local.offload { [self] () throws(MagpieError) -> RemoteSend? in
                        land(flight, call, result, started: started, version: version)
                    }
                    if landed == nil { leave(flight, hash: call.hash) }  // cancelled or closed before it could land
                    // The value goes through to the store before (or with) the lease's release (a waiter
                    // that then takes the lease finds it), and before the callers hear of it.
                    await composition.sendLanding(landed ?? nil, call, lease)
                    flight.finish(result)
                })
        case .blocking(let load):
            let submitted = loaderPool.submit { [self] in runBlocking(flight, call, load) }
            if !submitted {
                leave(flight, hash: call.hash)
                flight.finish(.failure(MagpieError(.closed, "the cache is closed")))
            }
        }
    }

    /// A load's start once its lease is settled: the instant and version it lands with; nil when another
    /// instance's load stored the value (`flight` then ends with it).
    private func begin(_ flight: Flight, _ call: LoaderCall, _ lease: LeaseOutcome) -> (Int64, UInt64)? {
        if case .shared(let value) = lease {
            leave(flight, hash: call.hash)
            flight.finish(.success(value))
            return nil
        }
        return (clock.now(), composition.loadVersion())
    }

    /// Runs a synchronous load on this thread, lands it and ends the flight.
    private func runBlocking(_ flight: Flight, _ call: LoaderCall, _ load: @Sendable () throws -> [UInt8]?) {
        let lease = composition.acquireLoadBlocking(call)
        guard let (started, version) = begin(flight, call, lease) else { return }
        let result: Result<[UInt8]?, any Error>
        do { result = .success(try load()) } catch { result = .failure(error) }
        composition.sendLandingBlocking(land(flight, call, result, started: started, version: version), call, lease)
        flight.finish(result)
    }
}
