import Glibc

// MARK: - Admission: a new key straight into `main` when it was missed often enough for its size
//
// S3-FIFO sends a new key to `small`, where it must be read before `small` turns over to reach `main`.
// A key whose requests are further apart than `small`'s turnover is then missed every time, however often
// it comes back. The shard counts misses (FrequencySketch.swift: the stores of keys it did not hold) and
// sends a new key straight to `main` when
//
//     (estimate − 1) × mean charge ≥ θ × charge
//
// where the estimate counts this miss, so estimate − 1 is how often the key was missed before, lately;
// the mean charge is the shard's live entries' charge over their count (dead blocks left out). Per byte,
// because what a key costs `main` is its charge: a small key missed twice is worth admitting before a
// large one missed twice (on the shared block trace, 4 KiB objects come back 3.5 times on average, 64 KiB
// ones 2.2 times).
//
// θ adapts (no knob): `main`'s hand sees every entry it passes. An entry admitted this way is tagged in
// `main`'s ring (EntryRing's tag) until the hand first reaches it; there, whether it was read since
// admission is its outcome. Every other entry the hand passes (but an entry a ghost admitted, on the
// hand's first pass: that outcome tunes the ghosts' window the same way, ShardStorage+Ghost.swift; on
// later passes it is a resident) updates the read rate of `main`'s residents (an average over about the
// last 100). Each tagged outcome moves log2 θ by −step × (outcome − max(κ × resident read rate, floor)),
// step 0.1: a read one lowers θ (admit more), an
// unread one raises it, and θ settles where the keys it admits are read κ (0.7) times as often as
// `main`'s residents, and at least half the time (the floor: when nothing in `main` is read, as during
// a long scan, admitting is pure churn; and a key admitted only to be evicted unread more often than not
// costs `main` a resident for nothing. With the floor at 0.35 the shared trace's miss ratio rose with the
// budget from 15 % to 17 %, 0.6775 to 0.7066: a loop over 30 % of its footprint was admitted, and
// thrashed; at 0.5, 0.6755 at 17 %, docs/lab-notes/eviction.md: the admission floor at one half).
// log2 θ starts at 1 (θ = 2: a key of the mean size missed twice before, or one of half of it missed once)
// and stays within −1 and 3.5 (θ from 0.5 to about 11).
// The ceiling bounds how long θ takes to come down after a spell of unread admissions (a scan, a hot set
// that moved on): at the ceiling admissions are rarest, and only their read outcomes lower θ, by 0.05
// each at the floor's target, so the way down from the ceiling is the slowest part of the range (50 read
// outcomes from 3.5 to the start, 80 from 5). With the ceiling at 5, replays of the traces whose
// popularity drifts missed more at every budget (docs/lab-notes/eviction.md: θ's ceiling); below 3.25,
// the kv trace at 1 % missed more.
// The doorkeeper's false positives (FrequencySketch.swift) make some one-time keys look missed once
// before: a start at θ = 1 admitted them whenever they were no larger than the mean. The hand passes each entry
// about once per turn of `main`, so θ moves with the eviction rate: no period to choose (a hill climber
// on the hit rate, as Caffeine tunes its window, was tried first: on the shared trace its result
// depended on the period), and a shard with no evictions has nothing to learn.
//
// An admitted key replaced, removed or expired before the hand reaches it gives no outcome (its dead
// block is freed when the hand pops it, without an outcome; a replacement block is untagged, counted as
// a resident): θ learns from the admissions that stayed, only.
//
// A hit never touches any of this: the sketch counts misses only, under the shard's lock. That is also
// why the sketch does not choose between `small`'s candidate and `main`'s victim as TinyLFU does: a
// resident's hits are not counted, and in a model of this policy that counted them the comparison made
// the shared trace's miss ratio worse (0.8244-0.8309 at 1 %, 0.7520-0.8010 at 10 %; docs/lab-notes/eviction.md).

/// The shard's admission threshold θ and what tunes it.
struct AdmissionControl {
    /// log2 θ.
    private(set) var log2Threshold: Double = AdmissionTuning.initialLog2
    /// θ (2 ^ log2Threshold).
    private(set) var threshold: Double = exp2(AdmissionTuning.initialLog2)
    /// How often `main`'s other entries were read when the hand reached them (a moving average).
    private(set) var residentReadRate: Double = 0.5

    /// Whether a new key missed `previousMisses` times before (≥ 1), of charge `charge`, goes to `main`,
    /// in a shard whose `count` live entries are charged `charged` bytes.
    @inline(__always)
    func admits(previousMisses: Int, charge: Int, charged: Int, count: Int) -> Bool {
        Double(previousMisses) * Double(charged) >= threshold * Double(charge) * Double(max(1, count))
    }

    /// An entry admitted by ``admits(previousMisses:charge:charged:count:)`` reached `main`'s hand,
    /// `read` since its admission or not.
    mutating func admittedReached(read: Bool) {
        let outcome: Double = read ? 1 : 0
        log2Threshold -= AdmissionTuning.step * (outcome - target)
        log2Threshold = min(AdmissionTuning.highestLog2, max(AdmissionTuning.lowestLog2, log2Threshold))
        threshold = exp2(log2Threshold)
    }

    /// The read rate asked of a key admitted to `main` (by its misses, or by a ghost: the ghosts' window
    /// is tuned to it too, ShardStorage+Ghost.swift): κ × the residents', and at least the floor.
    var target: Double { max(AdmissionTuning.floor, AdmissionTuning.kappa * residentReadRate) }

    /// Any other entry reached `main`'s hand, `read` since the hand last passed it (or it came in).
    @inline(__always)
    mutating func residentReached(read: Bool) {
        residentReadRate += ((read ? 1 : 0) - residentReadRate) * AdmissionTuning.rateWeight
    }
}

/// The constants of ``AdmissionControl``, chosen by trace replay (docs/lab-notes/eviction.md).
enum AdmissionTuning {
    static let initialLog2: Double = 1
    static let lowestLog2: Double = -1
    static let highestLog2: Double = 3.5
    /// How far one outcome moves log2 θ.
    static let step: Double = 0.1
    /// An admitted key must be read at least this share as often as `main`'s residents...
    static let kappa: Double = 0.7
    /// ... and at least this often, however seldom the residents are read.
    static let floor: Double = 0.5
    /// The weight of one resident's outcome in their read rate (about the last 100 count).
    static let rateWeight: Double = 0.01
}
