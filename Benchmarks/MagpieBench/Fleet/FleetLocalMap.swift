import Synchronization

/// The hand-built pattern's local cache (`local-pubsub`): a concurrent map bounded by bytes, as users
/// take from their platform (a `ConcurrentHashMap`, `MemoryCache`): lock stripes, each a dictionary and a
/// CLOCK ring for eviction.
///
/// Each stripe holds at most `budget / stripes` bytes, an entry charged its value, its key and 64 bytes.
/// A hit sets the entry's reference bit; an insertion over the budget sweeps the ring from the hand,
/// clearing set bits and evicting the first entry whose bit is clear. Removal swaps the ring's last key
/// into the removed one's place.
final class FleetLocalMap: Sendable {
    private struct Slot {
        var value: [UInt8]
        var referenced: Bool
        var position: Int
    }

    private struct Stripe {
        var entries: [String: Slot] = [:]
        var ring: [String] = []
        var hand = 0
        var bytes = 0

        mutating func remove(_ key: String) -> Bool {
            guard let slot = entries.removeValue(forKey: key) else { return false }
            bytes -= Self.charge(key, slot.value)
            let last = ring.removeLast()
            if slot.position < ring.count {
                ring[slot.position] = last
                entries[last]?.position = slot.position
            }
            if hand >= ring.count { hand = 0 }
            return true
        }

        mutating func evictOne() {
            while !ring.isEmpty {
                if hand >= ring.count { hand = 0 }
                let key = ring[hand]
                if entries[key]?.referenced == true {
                    entries[key]?.referenced = false
                    hand += 1
                } else {
                    _ = remove(key)
                    return
                }
            }
        }

        static func charge(_ key: String, _ value: [UInt8]) -> Int { key.utf8.count + value.count + 64 }
    }

    private final class Locked: Sendable {
        let stripe = Mutex(Stripe())
    }

    private let stripes: [Locked]
    private let stripeBudget: Int

    init(budget: Int, stripes: Int = 64) {
        self.stripes = (0..<max(1, stripes)).map { _ in Locked() }
        stripeBudget = max(1, budget / max(1, stripes))
    }

    private func stripe(_ key: String) -> Locked {
        stripes[Int(UInt(bitPattern: key.hashValue) % UInt(stripes.count))]
    }

    func value(_ key: String) -> [UInt8]? {
        stripe(key).stripe.withLock { stripe in
            guard let index = stripe.entries.index(forKey: key) else { return nil }
            if !stripe.entries.values[index].referenced { stripe.entries.values[index].referenced = true }
            return stripe.entries.values[index].value
        }
    }

    func contains(_ key: String) -> Bool {
        stripe(key).stripe.withLock { $0.entries[key] != nil }
    }

    func set(_ key: String, _ value: [UInt8]) {
        let charge = Stripe.charge(key, value)
        stripe(key).stripe.withLock { stripe in
            _ = stripe.remove(key)
            guard charge <= stripeBudget else { return }
            while stripe.bytes + charge > stripeBudget, !stripe.ring.isEmpty { stripe.evictOne() }
            stripe.entries[key] = Slot(value: value, referenced: false, position: stripe.ring.count)
            stripe.ring.append(key)
            stripe.bytes += charge
        }
    }

    @discardableResult
    func remove(_ key: String) -> Bool {
        stripe(key).stripe.withLock { $0.remove(key) }
    }

    func removeAll() {
        for locked in stripes { locked.stripe.withLock { $0 = Stripe() } }
    }

    /// Entries held now.
    var count: Int { stripes.reduce(0) { sum, locked in sum + locked.stripe.withLock { $0.entries.count } } }
}
