// Two things a shard sizes as it goes: `small`'s share of the budget, and how much a large entry's read
// or ghost hit is worth. See "Eviction" in ShardStorage.swift.
//
// ## `small`'s share, tuned by the ghosts
//
// `small` is where a new key waits to be read before it may stay. At 1 % of the budget it turns over fast,
// which suits a trace whose hot keys return soon (Zipf, the shared block trace); on a trace whose
// popularity drifts (a new hot set every few thousand requests) the new keys come back a little later than
// 1 % allows, are evicted into the small ghost, and a larger `small` replays better
// (docs/lab-notes/eviction.md, `small`'s share tuned by the ghosts: the z11 trace at 1 %, 0.5122 with
// `small` at 1 %, 0.5043 at 20 %, while Zipf at 10 % goes from 0.3684 to 0.3741). No fixed share fits both,
// so it tunes itself, as ARC sizes its T1 against T2, from the ghosts' hits:
//
//  - A key found in the small ghost that left `small` no more than `small`'s size ago would have been a
//    hit with `small` twice its size: the share grows by 5 %.
//  - A key found in the main ghost that left `main` no more than `small`'s size ago would have been a hit
//    had `main` been larger by that much: the share shrinks by 5 %.
//  - "Ago" is the ghost's age: the bytes evicted into that ghost since the key was, its own charge
//    included (its stamp is taken before the ghost counts it). So an entry larger than `small`'s target
//    never grows the share; and the small ghost counts only entries evicted unread (one promoted to
//    `main` leaves no ghost entry), so the age understates the bytes that left `small` since.
//  - A large entry that the size draw evicts from `main` although read goes to the main ghost too; if it
//    returns soon, it shrinks the share as an entry `main` was too small for would. Replay counts it in
//    the figures.
//  - It stays between 1 % (where it starts, and where the policy of 2026-11-27 had it fixed) and 25 %.
//
// Hits further back than `small`'s size say nothing about this margin and move nothing. ARC's rule, with
// the ages the ghosts keep anyway (ShardStorage+Ghost.swift): no state but the share itself.
//
// ## Size: a large entry earns its place in proportion to its size
//
// The budget is in bytes and the miss ratio that services pay for is in requests: an entry of four times
// the mean charge holds the room of four mean ones, and is worth keeping only if it is read about as often
// as four of them. Replays with every object of one size put Magpie ahead of every reference policy on the
// Zipf traces, and with sizes spread 512 B-64 KiB behind LIRS (docs/lab-notes/eviction.md). So two decisions that
// otherwise give a place for one event weigh the event by size:
//
//  - a ghost hit admits a new key to `main` (skipping `small`);
//  - a read makes `main`'s hand re-queue an entry instead of evicting it.
//
// For an entry charged at most `SizeTuning.factor` (2) times the shard's mean charge (live charge / entries)
// nothing changes. A larger one passes with probability factor × mean / charge (a key that fails goes to
// `small`; an entry that fails is evicted into the main ghost as an unread one would be). Over the
// passes that keep a large hot entry, about factor × mean / charge of its reads count: it needs about
// charge / (factor × mean) times as many reads to stay, and a large entry read once in a while gives way
// to smaller ones.
// The mean is the live entries' charge over their count, as θ's is (ShardStorage+Admission.swift): dead
// blocks (removed or replaced entries their ring has not popped yet, `deadCharged`) are left out, so
// removals and overwrites do not raise it.
// The draw is a per-shard generator (64-bit LCG), under the shard's lock like everything here, so a
// replay is deterministic. What this gives up: "an entry in `main` is evicted only after `main` has
// rotated past it frequency + 1 times" holds only for entries up to twice the mean.
//
// Replayed (docs/lab-notes/eviction.md): with the draw and the tuned share, Zipf with sizes 512 B-64 KiB goes from
// 0.5558 / 0.3684 to 0.5366 / 0.3577 at 1 % / 10 % (LIRS 0.5680 / 0.3590); a factor of 1 or the draw on
// `small`'s promotions too were tried and were worse on the drifting traces or the shared one.

/// `small`'s share of a shard's budget, what tunes it, and the target in bytes it gives.
struct SmallShareControl {
    /// The share, between ``SizeTuning/lowestSmallShare`` and ``SizeTuning/highestSmallShare``.
    private(set) var share: Double = SizeTuning.lowestSmallShare
    /// The shard's budget, which the share is of.
    let budget: Int
    /// What `small` may hold before it is evicted from first: `share` of `budget`, in bytes (kept as the
    /// share moves, for the eviction path).
    private(set) var target: Int

    init(budget: Int) {
        self.budget = budget
        target = Int(Double(budget) * share)
    }

    /// A ghost hit at `age` (in the ghosts' stamp units) from the main ghost or else the small one,
    /// with `small`'s target `reach` units: returns whether the share moved (for tests).
    @discardableResult
    mutating func ghostHit(age: UInt32, fromMain: Bool, reach: UInt32) -> Bool {
        guard age <= max(1, reach) else { return false }
        let moved = fromMain ? share * (1 - SizeTuning.smallShareStep) : share * (1 + SizeTuning.smallShareStep)
        share = min(SizeTuning.highestSmallShare, max(SizeTuning.lowestSmallShare, moved))
        target = Int(Double(budget) * share)
        return true
    }
}

/// The constants of ``SmallShareControl`` and of the size draw, chosen by trace replay
/// (docs/lab-notes/eviction.md).
enum SizeTuning {
    static let lowestSmallShare = 0.01
    static let highestSmallShare = 0.25
    /// How far one ghost hit moves the share (a factor of 1 ± step).
    static let smallShareStep = 0.05
    /// Entries up to this many times the mean charge are never subject to the draw.
    static let factor = 2.0
}

/// The size draw's generator: a 64-bit LCG (Knuth's MMIX constants), its top 53 bits as a fraction.
struct SizeDraw {
    private var state: UInt64 = 0x9E37_79B9_7F4A_7C15

    /// A fraction in [0, 1).
    mutating func next() -> Double {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return Double(state &>> 11) * 0x1p-53
    }
}

extension ShardStorage {
    /// Whether an event that earns an entry of `charge` a place (a ghost hit, a read seen by `main`'s hand)
    /// counts: always for an entry up to ``SizeTuning/factor`` times the mean charge, else with probability
    /// factor × mean / charge (see the top of this file).
    @inline(__always)
    mutating func sizeEarnsPlace(charge: Int) -> Bool {
        guard count > 0 else { return true }
        let bound = SizeTuning.factor * Double(liveCharged) / Double(count)
        if Double(charge) <= bound { return true }
        return sizeDraw.next() < bound / Double(charge)
    }

    /// Tunes `small`'s share on a ghost hit (see the top of this file).
    mutating func tuneSmallShare(_ hit: GhostHit) {
        let reach = UInt32(truncatingIfNeeded: min(Int(UInt32.max), smallTarget &>> ghostShift))
        smallShare.ghostHit(age: hit.age, fromMain: hit.fromMain, reach: reach)
    }

    /// What `small` may hold before it is evicted from first: 1-25 % of the budget, tuned by `smallShare`
    /// (see "Eviction" in ShardStorage.swift).
    var smallTarget: Int { smallShare.target }
}
