import Glibc

// The ghosts. See "Eviction" in ShardStorage.swift.
//
// Two ghosts remember the hashes of entries evicted: one of those evicted from `small`, one of those
// evicted from `main` (unread, or read but over twice the mean charge and refused by the size draw,
// ShardStorage+Sizing.swift). Each behaves like a FIFO holding the last window's bytes (charges) that
// left its queue, without storing a FIFO:
//
//  - Each ghost counts the bytes ever evicted into it (`GhostWindow.evicted`); an entry is stamped
//    with that count, in units of `budget >> ghostShift` (a budget is 512 to 1,023 units), as it
//    enters. It is still remembered while its ghost's count has advanced by at most the window since:
//    1/√2 budget at first, then tuned between that and 2 budgets (`GhostWindowControl`).
//  - All entries share one table of UInt32 slots, as many as the index has buckets:
//    bit 31 = which ghost, bits 12-30 = 19 bits of the hash (a fingerprint, never all zero),
//    bits 0-11 = the stamp. 0 is empty. A hash may sit in any slot of the aligned group of 8 that
//    holds (hash >> 16) & mask (32 bytes: one cache line); a new entry takes an empty or forgotten
//    slot of the group, else the oldest. A lost entry only costs a ghost hit, never correctness. The
//    loss is part of the policy as measured: with twice or four times the slots, the shared trace's miss
//    ratio at 10 % rose from 0.7248 to 0.7434 and 0.7467 (an earlier configuration of the sketch; the
//    policy of 2026-10 likewise went from 0.7336 to 0.7475 with four times): a ghost hit admits to
//    `main`, and the hashes forgotten are the oldest, the least likely to pay for their place.
//  - A key never evicted matches a remembered slot of its group by chance (its fingerprint equal)
//    about once in 65,536 lookups, and a slot untouched for 4 budgets or more (the stamp wraps every
//    4,096 units) can look recent again: an eviction into its group clears it once it is forgotten
//    (before that, 116 of 15,000 keys returning beyond the window were admitted in a test that now
//    sees 8), but a group no eviction writes keeps it. Either is a false ghost hit: it admits a new
//    entry to `main`, nothing more.
//  - When the index doubles, every slot is copied to each position of the larger table that maps
//    back to it, so the ghosts survive growth.

/// The ghosts' window and what tunes it.
///
/// How long the ghosts should remember is the trace's to say: replayed with fixed windows, the shared
/// block trace did best with half the budget, a drifting key-value trace with twice it and Zipf traces
/// with a third (docs/lab-notes/eviction.md: the ghosts' window). So the window tunes itself as θ
/// does (ShardStorage+Admission.swift): a key a ghost admits to `main` is tagged in `main`'s ring until
/// the hand first reaches it, and whether it was read by then moves log2 (window / budget) by
/// step × (outcome − target), where the target is θ's (``AdmissionControl/target``): keys the ghosts
/// admit must be read as often as θ asks of keys admitted by their misses, else the window shrinks and
/// fewer keys skip `small`.
///
/// The window starts at its narrowest, 1/√2 budget, and must earn its width: a ghost admission skips
/// `small`'s probation (as θ starts high). On the shared trace a start at one budget replayed 0.6982 at
/// 10 % and 0.5666 at 40 %, one at 1/√2 0.7056 and 0.5619 (docs/lab-notes/eviction.md: the
/// ghosts' window tunes itself, which also shows how the figures move with these constants).
///
/// It stays between 1/√2 and 2 budgets. Below: on the drifting key-value trace the tuner shrinks the
/// window (its ghost-admitted keys are read less than half the time before the hand returns, yet it
/// replays best with a long window), and a floor of half a budget cost it 0.3 points at 1 %. Above: the
/// 12-bit stamp keeps half its range beyond the window, so a slot unwritten for twice the window still
/// reads as forgotten.
///
/// What it cannot see: the window moves only on ghost hits, so keys that return after more than the
/// window (at the start, 1/√2 budget) and less than 2 budgets give it nothing to widen on, unless other
/// keys' hits widen it first.
struct GhostWindowControl {
    /// log2 (window / budget).
    private(set) var log2Scale: Double = GhostTuning.lowestLog2
    /// The window in stamp units.
    private(set) var units: UInt32
    /// The budget in stamp units.
    private let budgetUnits: Double

    init(budgetUnits: UInt32) {
        self.budgetUnits = Double(budgetUnits)
        units = 1
        recompute()
    }

    /// A key a ghost admitted reached `main`'s hand, `read` since its admission or not; `target` is the
    /// read rate asked of admissions.
    mutating func admittedReached(read: Bool, target: Double) {
        log2Scale += GhostTuning.step * ((read ? 1 : 0) - target)
        log2Scale = min(GhostTuning.highestLog2, max(GhostTuning.lowestLog2, log2Scale))
        recompute()
    }

    private mutating func recompute() {
        units = UInt32(max(1, (budgetUnits * exp2(log2Scale)).rounded()))
    }
}

/// The constants of ``GhostWindowControl``, chosen by trace replay (docs/lab-notes/eviction.md).
enum GhostTuning {
    static let lowestLog2: Double = -0.5
    static let highestLog2: Double = 1
    /// How far one outcome moves log2 of the window.
    static let step: Double = 0.1
}

/// A ghost hit: how far its ghost has moved on since the key was evicted (stamp units, within the window),
/// and which queue evicted it.
struct GhostHit {
    let age: UInt32
    let fromMain: Bool
}

/// One ghost's position: bytes evicted into it so far.
struct GhostWindow {
    var evicted: UInt64 = 0

    /// Counts `charge` bytes entering the ghost.
    mutating func advance(by charge: Int) {
        evicted &+= UInt64(charge)
    }
}

private let mainGhostBit: UInt32 = 1 << 31
private let fingerprintMask: UInt32 = 0x7fff_f000
private let stampMask: UInt32 = 0x0fff

extension ShardStorage {
    /// Slots a hash may occupy: an aligned group of 8 (32 bytes, within one cache line).
    static let ghostWays = 8
    /// The ghost has as many slots as the index has buckets.
    @inline(__always)
    var ghostMask: Int { indexMask }
    /// `ghostShift` for a shard budget: a window of `budget >> shift` units, between 512 and 1,023
    /// (fewer for budgets under 512 bytes, whose unit is the byte).
    static func ghostShift(budget: Int) -> Int {
        max(0, (Int.bitWidth - budget.leadingZeroBitCount) - 10)
    }

    /// A budget in stamp units of `budget >> shift` (512 to 1,023; fewer for budgets under 512 bytes).
    static func ghostBudgetUnits(budget: Int, shift: Int) -> UInt32 {
        UInt32(truncatingIfNeeded: max(1, budget >> shift))
    }

    /// The window in stamp units (tuned: see ``GhostWindowControl``).
    @inline(__always)
    var ghostWindowUnits: UInt32 { ghostControl.units }

    @inline(__always)
    private func ghostFingerprint(_ hash: UInt64) -> UInt32 {
        UInt32(truncatingIfNeeded: hash &>> 33) & fingerprintMask | 0x0000_1000
    }

    @inline(__always)
    private func ghostStamp(_ window: GhostWindow) -> UInt32 {
        UInt32(truncatingIfNeeded: window.evicted &>> UInt64(ghostShift)) & stampMask
    }

    /// How far (in stamp units) a slot's ghost has moved on since the slot was written.
    @inline(__always)
    private func ghostAge(_ slot: UInt32) -> UInt32 {
        let now = ghostStamp(slot & mainGhostBit != 0 ? mainGhost : smallGhost)
        return (now &- slot) & stampMask
    }

    @inline(__always)
    private func ghostIsRemembered(_ slot: UInt32) -> Bool {
        slot != 0 && ghostAge(slot) <= ghostWindowUnits
    }

    /// Remembers `hash`, evicted from `main` (or else from `small`) with `charge` bytes.
    mutating func ghostRemember(hash: UInt64, charge: Int, fromMain: Bool) {
        let slot = ghostFingerprint(hash) | (fromMain ? mainGhostBit : 0)
            | ghostStamp(fromMain ? mainGhost : smallGhost)
        if fromMain { mainGhost.advance(by: charge) } else { smallGhost.advance(by: charge) }
        let base = Int(truncatingIfNeeded: hash &>> 16) & ghostMask & ~(Self.ghostWays - 1)
        // The first free slot, else the oldest. Every forgotten slot of the group is cleared on the way:
        // left, it would look recent again once its stamp wrapped (see the top of this file).
        var free = -1
        var oldestPosition = base
        var oldest: UInt32 = 0
        for position in base..<base + Self.ghostWays {
            let existing = ghost[position]
            guard ghostIsRemembered(existing) else {
                if existing != 0 { ghost[position] = 0 }
                if free < 0 { free = position }
                continue
            }
            let age = ghostAge(existing)
            if age >= oldest {
                oldest = age
                oldestPosition = position
            }
        }
        ghost[free >= 0 ? free : oldestPosition] = slot
    }

    /// Whether either ghost remembers `hash` (and how long ago it was evicted, from which queue),
    /// forgetting it there.
    mutating func ghostTake(hash: UInt64) -> GhostHit? {
        let fingerprint = ghostFingerprint(hash)
        let base = Int(truncatingIfNeeded: hash &>> 16) & ghostMask & ~(Self.ghostWays - 1)
        for position in base..<base + Self.ghostWays {
            let slot = ghost[position]
            if slot & fingerprintMask == fingerprint & fingerprintMask && ghostIsRemembered(slot) {
                ghost[position] = 0
                return GhostHit(age: ghostAge(slot), fromMain: slot & mainGhostBit != 0)
            }
        }
        return nil
    }

    /// Re-places the ghost into a table of `buckets` slots (a power of two ≥ the current one): the
    /// position of a hash in the larger table is its old position plus a multiple of the old size, so
    /// copying each slot to every such position keeps every entry findable.
    static func regrowGhost(
        _ old: UnsafeMutablePointer<UInt32>, oldMask: Int, into new: UnsafeMutablePointer<UInt32>, buckets: Int
    ) {
        for position in 0..<buckets { new[position] = old[position & oldMask] }
    }
}
