// The ghosts and the adaptation of `small`'s target. See "Eviction" in ShardStorage.swift.
//
// Two ghosts remember the hashes of entries evicted unread: one of those evicted from `small`, one of
// those evicted from `main`. Each behaves like a FIFO holding the last `budget` bytes (charges) that
// left its queue, without storing a FIFO:
//
//  - Each ghost counts the bytes ever evicted into it (`GhostWindow.evicted`); an entry is stamped
//    with that count, in units of `budget >> ghostShift` (the window is 512 to 1,023 units), as it
//    enters. It is still remembered while its ghost's count has advanced by at most one budget since.
//  - All entries share one table of UInt32 slots, as many as the index has buckets:
//    bit 31 = which ghost, bits 12-30 = 19 bits of the hash (a fingerprint, never all zero),
//    bits 0-11 = the stamp. 0 is empty. A hash may sit in any slot of the aligned group of 8 that
//    holds (hash >> 16) & mask (32 bytes: one cache line); a new entry takes an empty or forgotten
//    slot of the group, else the oldest. A lost entry only costs a ghost hit, never correctness.
//  - A key never evicted matches a remembered slot of its group by chance (its fingerprint equal)
//    about once in 65,536 lookups, and a slot untouched for 4 to 8 windows (the stamp wraps) can look
//    recent again. Either is a false ghost hit: it admits a new entry to `main` and nudges `small`'s
//    target, nothing more.
//  - When the index doubles, every slot is copied to each position of the larger table that maps
//    back to it, so the ghosts survive growth.
//
// The ghosts also estimate how many bytes each remembers (what ARC's |B1| and |B2| are): the window,
// or what has been evicted if less, less what ghost hits took out, those taken bytes fading as the
// window moves past them.

/// One ghost's position: bytes evicted into it so far, and bytes recently taken out by hits.
struct GhostWindow {
    var evicted: UInt64 = 0
    var taken: Double = 0

    /// Counts `charge` bytes entering the ghost; the taken bytes fade by the share of the window moved.
    mutating func advance(by charge: Int, window: Int) {
        evicted &+= UInt64(charge)
        taken -= taken * Double(charge) / Double(max(1, window))
    }

    /// About how many bytes the ghost remembers, given its window of `window` bytes.
    func remembered(window: Int) -> Double {
        max(1, Double(min(UInt64(window), evicted)) - taken)
    }
}

/// Which ghost remembered a hash.
enum GhostHit {
    case none, small, main
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

    /// The window in stamp units.
    @inline(__always)
    var ghostWindowUnits: UInt32 { UInt32(truncatingIfNeeded: max(1, budget >> ghostShift)) }

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
        if fromMain { mainGhost.advance(by: charge, window: budget) } else { smallGhost.advance(by: charge, window: budget) }
        let base = Int(truncatingIfNeeded: hash &>> 16) & ghostMask & ~(Self.ghostWays - 1)
        var target = base
        var oldest: UInt32 = 0
        for position in base..<base + Self.ghostWays {
            let existing = ghost[position]
            guard ghostIsRemembered(existing) else {
                target = position
                break
            }
            let age = ghostAge(existing)
            if age >= oldest {
                oldest = age
                target = position
            }
        }
        ghost[target] = slot
    }

    /// Which ghost remembers `hash`, forgetting it there, and counting `charge` bytes taken.
    mutating func ghostTake(hash: UInt64, charge: Int) -> GhostHit {
        let fingerprint = ghostFingerprint(hash)
        let base = Int(truncatingIfNeeded: hash &>> 16) & ghostMask & ~(Self.ghostWays - 1)
        for position in base..<base + Self.ghostWays {
            let slot = ghost[position]
            if slot & fingerprintMask == fingerprint & fingerprintMask && ghostIsRemembered(slot) {
                ghost[position] = 0
                if slot & mainGhostBit != 0 {
                    mainGhost.taken += Double(charge)
                    return .main
                }
                smallGhost.taken += Double(charge)
                return .small
            }
        }
        return .none
    }

    /// Moves `small`'s target after a ghost hit, as ARC moves its target for T1: a hash remembered by
    /// the small ghost means `small` was too small for it, one remembered by the main ghost means
    /// `main` was; the step is the entry's charge, times the other ghost's size over this one's when
    /// that is over 1. The target stays within 1 % and 90 % of the budget.
    mutating func adaptSmallTarget(after hit: GhostHit, charge: Int) {
        let window = budget
        let small = smallGhost.remembered(window: window)
        let main = mainGhost.remembered(window: window)
        switch hit {
        case .none:
            return
        case .small:
            let step = Double(charge) * max(1, main / small)
            smallTarget = min(budget / 10 * 9, smallTarget + Int(min(step, Double(budget))))
        case .main:
            let step = Double(charge) * max(1, small / main)
            smallTarget = max(budget / 100, smallTarget - Int(min(step, Double(budget))))
        }
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
