// A load's end (LoadCoordinator.swift has the protocol): its value landed in the tiers, or its failure
// counted and the key throttled; then what its callers get, judged against their fallback and timeouts.

import Logging

extension LoadCoordinator {
    /// A load's end, before its callers hear of it: the value stored (unless superseded), the absence
    /// remembered or the stale value removed, or, for a failure, the error counted and logged and the
    /// key throttled when fail-safe can serve its stale value; then the flight leaves the map.
    /// With a remote tier, the landing's remote write is returned, for the caller to send with no lock
    /// held; it carries `version`, given when the load started: a write of the key by another instance
    /// made while the load ran is newer, and the store keeps it over the load's older value.
    func land(_ flight: Flight, _ call: LoaderCall, _ result: Result<[UInt8]?, any Error>, started: Int64, version: UInt64)
        -> RemoteSend?
    {
        defer { leave(flight, hash: call.hash) }
        var remoteWrite: RemoteSend? = nil
        switch result {
        case .success(let value):
            if throttleCount.load(ordering: .relaxed) != 0 {
                throttles.withLock { throttles in
                    if let throttle = throttles[call.hash], throttle.name == call.name { throttles[call.hash] = nil }
                    throttleCount.store(throttles.count, ordering: .relaxed)
                }
            }
            flight.superseded.withLock { superseded in
                guard !runtime.closed.load(ordering: .relaxed) else { return }  // nothing lands in a closed cache
                guard !superseded else {
                    runtime.count(.loadsSuperseded)
                    return
                }
                do {
                    remoteWrite = try runtime.withKey(call.name, hash: call.hash) { key throws(MagpieError) -> RemoteSend? in
                        if let value {
                            var stamp = call.options.stamp(now: started, hash: call.hash)
                            stamp.version = version
                            return try value.withUnsafeBytes { bytes in
                                Result { () throws(MagpieError) in
                                    try composition.writeLocally(bytes, for: key, options: call.options, stamp: stamp, wait: .block).waited()
                                }
                            }.get()
                        } else if let lifetime = call.loader.negativeLifetime {
                            let deadline = Expiry.after(lifetime).deadline(now: started)
                            var stamp = StoreStamp(memory: deadline, disk: deadline, freshness: Freshness(negative: true))
                            stamp.version = version
                            return try composition.writeLocally(
                                UnsafeRawBufferPointer(start: nil, count: 0), for: key, options: call.options, stamp: stamp, wait: .block
                            ).waited()
                        } else {
                            return try composition.removeLocally(key).1
                        }
                    }
                } catch {
                    runtime.logs.loadNotCached.record(key: call.hash, error: "\(error)")
                }
            }
        case .failure(let error):
            runtime.count(.loaderFailures)
            let now = clock.now()
            var failSafeUntil: Int64? = nil
            if let fallback = flight.fallback, usableByFailSafe(fallback, flight.options, now: now) {
                runtime.count(.failSafeActivations)
                var until = now.saturatingAdd(flight.options.failSafeThrottle.wholeMilliseconds)
                if let maxAge = flight.options.failSafeMaxAge {
                    until = min(until, fallback.freshness.loadedAt.saturatingAdd(maxAge.wholeMilliseconds))
                }
                if fallback.deadline != 0 { until = min(until, fallback.deadline) }
                throttles.withLock { throttles in
                    if throttles.count >= 4096 { throttles = throttles.filter { $0.value.until > now } }
                    throttles[call.hash] = Throttle(name: call.name, until: until)
                    throttleCount.store(throttles.count, ordering: .relaxed)
                }
                failSafeUntil = until
            }
            runtime.logs.loadFailed.record(key: call.hash, error: "\(error)", metadata: {
                var metadata: Logger.Metadata = ["key_bytes": "\(call.name.count)"]
                if let failSafeUntil { metadata["fail_safe"] = "serving the stale value until \(failSafeUntil)" }
                return metadata
            }())
        }
        return remoteWrite
    }

    /// Whether fail-safe may serve `entry` at `now`: not expired, loaded at most its maximum age ago.
    func usableByFailSafe(_ entry: StoredEntry, _ options: LoaderOptions, now: Int64) -> Bool {
        (entry.deadline == 0 || now < entry.deadline) && options.failSafeAllows(loadedAt: entry.freshness.loadedAt, now: now)
    }

    /// What a caller returns when its wait ends: the load's value, the stale value standing in (a
    /// failure or timeout with fail-safe, a soft timeout), or the error. Nil: wait again (a soft timeout
    /// whose stale value expired meanwhile).
    func settle(_ outcome: LoadOutcome, _ call: LoaderCall, fallback: StoredEntry?) throws -> [UInt8]?? {
        let now = clock.now()
        switch outcome {
        case .loaded(.success(let value)):
            return .some(value)
        case .loaded(.failure(let error)):
            if let fallback, usableByFailSafe(fallback, call.loader, now: now) {
                runtime.count(.staleHits)
                return .some(fallback.value)
            }
            throw error
        case .softTimeout:
            runtime.count(.softTimeouts)
            guard let fallback, fallback.deadline == 0 || now < fallback.deadline else { return nil }
            runtime.count(.staleHits)
            return .some(fallback.value)
        case .hardTimeout:
            runtime.count(.hardTimeouts)
            if let fallback, usableByFailSafe(fallback, call.loader, now: now) {
                runtime.count(.staleHits)
                return .some(fallback.value)
            }
            throw MagpieError(.loadTimedOut, "the load did not finish within \(call.loader.hardTimeout ?? .zero)")
        }
    }
}

extension LoadTimers {
    var isEmpty: Bool { soft == nil && hard == nil }
}
