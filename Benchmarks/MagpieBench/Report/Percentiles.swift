import Histogram

/// Latency percentiles in nanoseconds (keys stable: tuning scripts read them).
struct Percentiles: Codable, Sendable, Equatable {
    var p50: UInt64
    var p90: UInt64
    var p99: UInt64
    var p999: UInt64
    var max: UInt64

    /// No latency measured (a simulation).
    static let zero = Percentiles(p50: 0, p90: 0, p99: 0, p999: 0, max: 0)

    init(p50: UInt64, p90: UInt64, p99: UInt64, p999: UInt64, max: UInt64) {
        (self.p50, self.p90, self.p99, self.p999, self.max) = (p50, p90, p99, p999, max)
    }

    /// The percentiles of a histogram, `value(p)` its p-th percentile.
    init(max: UInt64, _ value: (Double) -> UInt64) {
        self.init(p50: value(50), p90: value(90), p99: value(99), p999: value(99.9), max: max)
    }

    init(_ histogram: Histogram<UInt64>) {
        self.init(max: histogram.max) { histogram.valueAtPercentile($0) }
    }

    /// Read back from a report (an object `json` wrote); nil when `value` is none. A figure the object
    /// lacks reads 0.
    init?(_ value: JSONValue?) {
        guard let object = value?.objectValue else { return nil }
        func figure(_ name: String) -> UInt64 { UInt64(Swift.max(0, object[name]?.intValue ?? 0)) }
        self.init(p50: figure("p50"), p90: figure("p90"), p99: figure("p99"), p999: figure("p999"), max: figure("max"))
    }

    var json: JSONValue {
        .object([
            "p50": .int(Int(p50)), "p90": .int(Int(p90)), "p99": .int(Int(p99)),
            "p999": .int(Int(p999)), "max": .int(Int(max)),
        ])
    }
}

/// A histogram of latencies in nanoseconds, up to `highest` (60 s), to three significant digits.
func latencyHistogram(highest: UInt64 = 60_000_000_000) -> Histogram<UInt64> {
    Histogram<UInt64>(highestTrackableValue: highest, numberOfSignificantValueDigits: .three)
}

/// The rank (from 1) of the p-th percentile of `count` samples: the nearest rank, as HdrHistogram ranks
/// it (the least sample with at least p % of them at or below it).
func percentileRank(_ p: Double, count: Int) -> Int {
    min(count, max(1, Int((p / 100 * Double(count)).rounded(.up))))
}

/// The p-th percentile of `samples` by nearest rank; nil when there are none. The one percentile of the
/// benchmarks: the median pass, a round's p50 and the fleet's histograms are all it.
func percentile<T: Comparable>(_ p: Double, of samples: [T]) -> T? {
    samples.isEmpty ? nil : samples.sorted()[percentileRank(p, count: samples.count) - 1]
}

/// The median of `values`, the mean of the two middle ones when their count is even; NaN when empty.
func median(_ values: [Double]) -> Double {
    // The lower median, and the upper one as the lower median of the values negated.
    guard let lower = percentile(50, of: values), let upper = percentile(50, of: values.map { -$0 }) else { return .nan }
    return (lower - upper) / 2
}

extension BenchResult {
    /// The p50 of the latency figures `key` of `extra`; nil when there are none, or it is 0 (nothing timed).
    func p50(_ key: String) -> Double? { Percentiles(extra[key]).flatMap { $0.p50 > 0 ? Double($0.p50) : nil } }
}
