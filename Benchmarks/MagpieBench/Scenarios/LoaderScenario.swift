import ArgumentParser
import Foundation
import Glibc
import Histogram
import Magpie
import Synchronization

// `magpie-bench loader`: callers of a cache in front of a simulated origin (a latency distribution, an
// error rate, a scripted outage window), compared in one run as (a) cache-aside with the plain API,
// (b) the loader with single flight only, (c) the loader with freshness: stale-while-revalidate, eager
// refresh, fail-safe and timeouts.
//
// Every system sees the same requests: `callers` tasks, each with its own Zipf key sequence, paced to
// a total rate (a caller that fell behind, waiting for the origin, issues its next requests at once).
// Every value the origin produces carries the wall-clock instant its call began and the key's rank, so
// every returned value is checked (a wrong key is a `wrong_values` count) and aged without trusting the
// cache's own bookkeeping. The origin records when it last served each key: a call is of an "already
// cached" key when that key was loaded less than the hard lifetime before the call began (the same
// definition for every system), and the row's `latency_ns` is over those calls.

struct LoaderBenchOptions: ParsableArguments {
    @Option(help: "Distinct keys.") var keys = 2_000
    @Option(help: "Zipf exponent of key popularity.") var alpha = 0.99
    @Option(help: "Concurrent callers (tasks).") var callers = 8
    @Option(help: "Requests per second, all callers together.") var rate = 20_000
    @Option(help: "Length of each system's run, in seconds.") var seconds = 20.0
    @Option(help: "Fresh lifetime in ms (the expiry of cache-aside and single-flight).") var freshMs = 1_000
    @Option(help: "Hard expiry in ms (magpie-swr), also fail-safe's maximum age.") var hardMs = 10_000
    @Option(help: "Origin latency median, ms (log-normal).") var originP50Ms = 2.0
    @Option(help: "Origin latency 99th percentile, ms.") var originP99Ms = 40.0
    @Option(help: "Fraction of origin calls that fail (outside the outage).") var errorRate = 0.01
    @Option(help: "When the outage starts, seconds into each run.") var outageAt = 8.0
    @Option(help: "How long the origin is down, seconds (every call fails after its latency).") var outageSeconds = 4.0
    @Option(help: "magpie-swr: eager refresh fraction of the fresh lifetime.") var eagerRefresh = 0.9
    @Option(help: "magpie-swr: soft timeout, ms.") var softTimeoutMs = 10
    @Option(help: "magpie-swr: hard timeout, ms.") var hardTimeoutMs = 1_000
    @Option(help: "magpie-swr: fail-safe throttle, ms.") var throttleMs = 1_000
    @Option(parsing: .upToNextOption, help: "Systems to run.") var systems = LoaderScenario.allSystems
    @Option(help: "Seed of the key sequences and the origin's draws.") var seed: UInt64 = 11

    func validate() throws {
        guard keys >= 10, callers >= 1, rate >= callers, seconds > 0 else {
            throw ValidationError("--keys ≥ 10, --callers ≥ 1, --rate ≥ --callers, --seconds > 0")
        }
        guard freshMs >= 1, hardMs > freshMs, originP50Ms > 0, originP99Ms >= originP50Ms, (0...1).contains(errorRate)
        else { throw ValidationError("--fresh-ms ≥ 1, --hard-ms > --fresh-ms, 0 < p50 ≤ p99, 0 ≤ --error-rate ≤ 1") }
        guard eagerRefresh > 0, eagerRefresh < 1 else { throw ValidationError("--eager-refresh must be in (0, 1)") }
        for system in systems where !LoaderScenario.allSystems.contains(system) {
            throw ValidationError("unknown system \(system); known: \(LoaderScenario.allSystems.joined(separator: ", "))")
        }
    }

    var config: [String: JSONValue] {
        [
            "scenario": .string("loader"), "keys": .int(keys), "alpha": .double(alpha), "callers": .int(callers),
            "rate": .int(rate), "seconds": .double(seconds), "fresh_ms": .int(freshMs), "hard_ms": .int(hardMs),
            "fail_safe_max_age_ms": .int(hardMs), "origin_p50_ms": .double(originP50Ms), "origin_p99_ms": .double(originP99Ms),
            "error_rate": .double(errorRate), "outage_at_s": .double(outageAt), "outage_s": .double(outageSeconds),
            "eager_refresh": .double(eagerRefresh), "soft_timeout_ms": .int(softTimeoutMs),
            "hard_timeout_ms": .int(hardTimeoutMs), "throttle_ms": .int(throttleMs),
            "systems": .array(systems.map { .string($0) }), "seed": .int(Int(truncatingIfNeeded: seed)),
        ]
    }
}

/// The wall clock in nanoseconds (the origin's stamps, and the ages of returned values).
private func wallNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

private struct OriginDown: Error {}

/// The simulated origin: log-normal latency, random errors, an outage window; counts its calls and
/// remembers when it last served each key.
private final class Origin: Sendable {
    let start: UInt64
    let outage: Range<UInt64>
    let mu: Double
    let sigma: Double
    let errorRate: Double
    let calls = Atomic<Int>(0)
    let draws: Atomic<UInt64>
    /// Per key: the wall-clock instant (ns) at which the last successful call for it began; 0 never.
    private let loaded: Mutex<[UInt64]>

    init(options: LoaderBenchOptions, start: UInt64) {
        self.start = start
        let from = start + UInt64(options.outageAt * 1e9)
        outage = from..<(from + UInt64(options.outageSeconds * 1e9))
        mu = log(options.originP50Ms * 1e6)
        sigma = options.originP99Ms > options.originP50Ms ? log(options.originP99Ms / options.originP50Ms) / 2.326_347_874 : 0
        errorRate = options.errorRate
        draws = Atomic(options.seed &* 0x9E37_79B9_7F4A_7C15)
        loaded = Mutex([UInt64](repeating: 0, count: options.keys))
    }

    /// When the last successful call for the key of `rank` began (ns), 0 if none.
    func lastLoad(_ rank: UInt32) -> UInt64 { loaded.withLock { $0[Int(rank)] } }

    func inOutage(_ wall: UInt64) -> Bool { outage.contains(wall) }

    private func uniform() -> Double {
        let state = draws.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue
        return (Double(splitmix64(state) >> 11) + 0.5) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// A log-normal latency (Box-Muller), in ns, capped at 5 s.
    private func latency() -> UInt64 {
        let normal = (-2 * log(uniform())).squareRoot() * cos(2 * Double.pi * uniform())
        return UInt64(min(5e9, exp(mu + sigma * normal)))
    }

    func fetch(_ rank: UInt32) async throws -> [UInt8] {
        calls.add(1, ordering: .relaxed)
        let began = wallNanoseconds()
        let failing = inOutage(began) || uniform() < errorRate
        try await Task.sleep(for: .nanoseconds(latency()))
        if failing { throw OriginDown() }
        var value = [UInt8](repeating: 0x61, count: 100)
        value.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: began.littleEndian, as: UInt64.self)
            raw.storeBytes(of: rank.littleEndian, toByteOffset: 8, as: UInt32.self)
        }
        loaded.withLock { $0[Int(rank)] = max($0[Int(rank)], began) }
        return value
    }
}

/// One caller's tallies, merged at the end.
private struct CallerTally: Sendable {
    var cached = latencyHistogram()
    var all = latencyHistogram()
    var staleAges = latencyHistogram(highest: 600_000_000_000)
    /// Latency of the calls of cached keys made during the outage.
    var cachedOutage = latencyHistogram()
    /// Latency of the calls of cached keys that returned a stale value (older than the fresh lifetime).
    var cachedStale = latencyHistogram()
    var requests = 0
    var cachedRequests = 0
    var errors = 0
    var outageErrors = 0
    var outageCachedRequests = 0
    var staleServed = 0
    var beyondBound = 0
    var wrongValues = 0

    mutating func merge(_ other: CallerTally) {
        for path in [\Self.cached, \.all, \.staleAges, \.cachedStale, \.cachedOutage] { self[keyPath: path].add(other[keyPath: path]) }
        let counts: [WritableKeyPath<Self, Int>] = [
            \.requests, \.cachedRequests, \.errors, \.outageErrors, \.outageCachedRequests, \.staleServed, \.beyondBound, \.wrongValues,
        ]
        for path in counts { self[keyPath: path] += other[keyPath: path] }
    }
}

struct LoaderScenario {
    static let allSystems = ["cache-aside", "single-flight", "magpie-swr"]
    let options: LoaderBenchOptions

    func run(progress: (String) -> Void) async throws -> [BenchResult] {
        var results: [BenchResult] = []
        for system in options.systems {
            progress("loader \(system): \(options.seconds) s, outage at \(options.outageAt) s for \(options.outageSeconds) s")
            results.append(try await run(system))
        }
        return results
    }

    private func run(_ system: String) async throws -> BenchResult {
        var configuration = Cache.Configuration(memoryBudget: max(64 << 20, options.keys * 512))
        configuration.metrics = nil
        let cache = try Cache(configuration)
        defer { try? cache.close() }
        let options = self.options
        let keys = (0..<options.keys).map { rank in withKey(rank: UInt32(rank)) { [UInt8]($0) } }
        let fresh = Duration.milliseconds(options.freshMs)
        let plain = EntryOptions.expiring(.after(fresh))
        let swr = EntryOptions.fresh(for: fresh, staleUntil: .after(.milliseconds(options.hardMs)))
        let singleFlight = LoaderOptions(staleWhileRevalidate: false)
        let freshness = LoaderOptions(
            staleWhileRevalidate: true, eagerRefresh: options.eagerRefresh, failSafeMaxAge: .milliseconds(options.hardMs),
            failSafeThrottle: .milliseconds(options.throttleMs), softTimeout: .milliseconds(options.softTimeoutMs),
            hardTimeout: .milliseconds(options.hardTimeoutMs))
        let perCaller = max(1, Int(Double(options.rate) * options.seconds) / options.callers)
        let interval = UInt64(1e9 * Double(options.callers) / Double(options.rate))
        let workload = ZipfWorkload(keyCount: options.keys, alpha: options.alpha)
        let sequences = (0..<options.callers).map { workload.ranks(seed: options.seed &+ UInt64($0) &* 7919, count: perCaller) }
        let freshNs = UInt64(options.freshMs) * 1_000_000
        let hardNs = UInt64(options.hardMs) * 1_000_000
        let startWall = wallNanoseconds()
        let startMono = nowNanoseconds()
        let origin = Origin(options: options, start: startWall)

        let tally = try await withThrowingTaskGroup(of: CallerTally.self) { group in
            for sequence in sequences {
                group.addTask {
                    var tally = CallerTally()
                    for (n, rank) in sequence.enumerated() {
                        let due = startMono + UInt64(n) * interval
                        let early = Int64(bitPattern: due &- nowNanoseconds())
                        if early > 1_000_000 { try await Task.sleep(for: .nanoseconds(early)) }
                        let key = keys[Int(rank)]
                        let began = wallNanoseconds()
                        let lastLoad = origin.lastLoad(rank)
                        let isCached = lastLoad != 0 && began - lastLoad < hardNs
                        let fetch: @Sendable () async throws -> [UInt8] = { try await origin.fetch(rank) }
                        let t0 = nowNanoseconds()
                        var value: [UInt8]? = nil
                        do {
                            switch system {
                            case "cache-aside":
                                if let hit = try cache.value(forKey: key) {
                                    value = hit
                                } else {
                                    let loaded = try await fetch()
                                    try cache.set(loaded, forKey: key, options: plain)
                                    value = loaded
                                }
                            case "single-flight":
                                value = try await cache.value(forKey: key, options: plain, loader: singleFlight, load: fetch)
                            default:
                                value = try await cache.value(forKey: key, options: swr, loader: freshness, load: fetch)
                            }
                        } catch {
                            tally.errors += 1
                            if origin.inOutage(began) && isCached { tally.outageErrors += 1 }
                        }
                        let elapsed = nowNanoseconds() - t0
                        let returned = wallNanoseconds()
                        tally.requests += 1
                        tally.all.record(elapsed)
                        if isCached {
                            tally.cachedRequests += 1
                            tally.cached.record(elapsed)
                        }
                        if origin.inOutage(began) && isCached {
                            tally.outageCachedRequests += 1
                            tally.cachedOutage.record(elapsed)
                        }
                        guard let value else { continue }
                        let stamp = value.count >= 12 ? value.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) } : 0
                        let valueRank = value.count >= 12
                            ? value.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)) } : .max
                        if valueRank != rank || value.count != 100 { tally.wrongValues += 1 }
                        let age = returned > stamp ? returned - stamp : 0
                        if age > freshNs {
                            if isCached { tally.cachedStale.record(elapsed) }
                            tally.staleServed += 1
                            tally.staleAges.record(min(age, 600_000_000_000))
                        }
                        if age >= hardNs { tally.beyondBound += 1 }
                    }
                    return tally
                }
            }
            var total = CallerTally()
            for try await tally in group { total.merge(tally) }
            return total
        }
        // Background refreshes may still be running: let them land before the cache closes.
        try await Task.sleep(for: .milliseconds(100))
        let seconds = Double(nowNanoseconds() - startMono) / 1e9
        let statistics = cache.statistics
        let ages = tally.staleServed == 0 ? .zero : Percentiles(tally.staleAges)
        let staleAges: JSONValue = .object(["p50": .int(Int(ages.p50)), "p99": .int(Int(ages.p99)), "max": .int(Int(ages.max))])
        return BenchResult(
            scenario: "loader", system: system, threads: options.callers, operations: tally.requests, seconds: seconds,
            ops_per_sec: Double(tally.requests) / seconds, latency_ns: Percentiles(tally.cached),
            hit_ratio: statistics.hitRatio,
            extra: [
                "origin_calls": .int(origin.calls.load(ordering: .relaxed)), "caller_errors": .int(tally.errors),
                "outage_caller_errors": .int(tally.outageErrors), "outage_cached_requests": .int(tally.outageCachedRequests),
                "stale_age_ns": staleAges, "stale_served": .int(tally.staleServed),
                "stale_beyond_bound": .int(tally.beyondBound), "stale_bound_ns": .int(Int(hardNs)),
                "wrong_values": .int(tally.wrongValues), "cached_requests": .int(tally.cachedRequests),
                "all_latency_ns": Percentiles(tally.all).json,
                "cached_stale_latency_ns": Percentiles(tally.cachedStale).json,
                "cached_outage_latency_ns": Percentiles(tally.cachedOutage).json,
                "origin_latency_ns": .object([
                    "p50": .int(Int(options.originP50Ms * 1e6)), "p99": .int(Int(options.originP99Ms * 1e6)),
                ]),
                "fresh_hits": .int(Int(statistics.freshHits)), "stale_hits": .int(Int(statistics.staleHits)),
                "background_refreshes": .int(Int(statistics.backgroundRefreshes)),
                "fail_safe_activations": .int(Int(statistics.failSafeActivations)),
                "soft_timeouts": .int(Int(statistics.softTimeouts)), "hard_timeouts": .int(Int(statistics.hardTimeouts)),
                "loader_runs": .int(Int(statistics.loaderRuns)), "loader_failures": .int(Int(statistics.loaderFailures)),
            ])
    }
}

/// The loader rows side by side, with the bars' inputs; nil without loader rows.
func loaderTable(_ results: [BenchResult]) -> Table? {
    let rows = results.filter { $0.scenario == "loader" }
    guard !rows.isEmpty else { return nil }
    func int(_ row: BenchResult, _ key: String) -> Int { row.extra[key]?.intValue ?? 0 }
    var table = Table(
        "loader: callers of keys already cached (loaded within the hard lifetime), the origin, the outage",
        [
            "system", "cached p50 µs", "cached p99 µs", "all p99 ms", "origin calls", "errors", "outage errors",
            "stale served", "stale p50/p99/max ms", "beyond bound", "wrong",
        ])
    for row in rows {
        let stale = Percentiles(row.extra["stale_age_ns"]).map { ages in
            [ages.p50, ages.p99, ages.max].map { String(format: "%.0f", Double($0) / 1e6) }.joined(separator: "/")
        }
        table.append([
            row.system, micros(row.latency_ns.p50), micros(row.latency_ns.p99),
            Percentiles(row.extra["all_latency_ns"]).map { String(format: "%.1f", Double($0.p99) / 1e6) } ?? "-",
            String(int(row, "origin_calls")), String(int(row, "caller_errors")),
            "\(int(row, "outage_caller_errors")) of \(int(row, "outage_cached_requests"))", String(int(row, "stale_served")),
            stale ?? "-/-/-", String(int(row, "stale_beyond_bound")), String(int(row, "wrong_values")),
        ])
    }
    return table
}
