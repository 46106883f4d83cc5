import Foundation

/// The memory scenario's workload, generated exactly as the RocksDB peer (Benchmarks/Peers/rocksdb_cache_peer.cc)
/// generates it, so Magpie and RocksDB see the same keys in the same order: a Zipf(α) popularity over `keys` ranks,
/// drawn with splitmix64 from a seed; the key of rank r is splitmix64(r) ‖ r (16 bytes, little-endian).
struct ZipfWorkload: Sendable {
    let keyCount: Int
    let alpha: Double
    private let cdf: [Double]

    init(keyCount: Int, alpha: Double) {
        self.keyCount = keyCount
        self.alpha = alpha
        var cdf = [Double](repeating: 0, count: keyCount)
        var sum = 0.0
        for i in 0..<keyCount {
            sum += 1.0 / pow(Double(i + 1), alpha)
            cdf[i] = sum
        }
        for i in 0..<keyCount { cdf[i] /= sum }
        self.cdf = cdf
    }

    /// `count` ranks drawn from the distribution with the given seed.
    func ranks(seed: UInt64, count: Int) -> [UInt32] {
        var state = seed
        var ranks = [UInt32](repeating: 0, count: count)
        cdf.withUnsafeBufferPointer { cdf in
            for i in 0..<count {
                state = splitmix64(state)
                let u = Double(state >> 11) * (1.0 / 9_007_199_254_740_992.0)
                var low = 0
                var high = cdf.count
                while low < high {
                    let middle = (low + high) / 2
                    if cdf[middle] < u { low = middle + 1 } else { high = middle }
                }
                ranks[i] = UInt32(min(low, cdf.count - 1))
            }
        }
        return ranks
    }

    /// The probability mass of the `n` most popular keys: the hit ratio of a perfect static cache of n entries.
    func topMass(_ n: Int) -> Double {
        n <= 0 ? 0 : cdf[min(n, cdf.count) - 1]
    }
}

@inline(__always)
func splitmix64(_ seed: UInt64) -> UInt64 {
    var x = seed &+ 0x9e37_79b9_7f4a_7c15
    x = (x ^ (x >> 30)) &* 0xbf58_476d_1ce4_e5b9
    x = (x ^ (x >> 27)) &* 0x94d0_49bb_1331_11eb
    return x ^ (x >> 31)
}

/// The 16-byte key of a rank, as the RocksDB peer builds it.
@inline(__always)
func withKey<R>(rank: UInt32, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    let key = (splitmix64(UInt64(rank)).littleEndian, UInt64(rank).littleEndian)
    return withUnsafeBytes(of: key, body)
}
