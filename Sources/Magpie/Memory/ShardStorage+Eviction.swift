// Eviction. See "Eviction" in ShardStorage.swift for the policy and its guarantees.

extension ShardStorage {
    /// Frees at least one block's charge, or (when every entry left in `small` was read) moves all of
    /// `small` to `main`. Returns false only when both queues are empty (nothing is charged).
    mutating func evictOne() -> Bool {
        // `small` first unless `main` is over its share (what `small`'s target leaves it).
        if small.count > 0 && (charged - smallCharged <= budget - smallTarget || main.count == 0) {
            while small.count > 0 && !evictFromSmall() {}
            return true
        }
        if main.count > 0 {
            evictFromMain()
            return true
        }
        return false
    }

    /// Pops `small`'s oldest block: frees it if dead, promotes it to `main` if it was read, else evicts
    /// it and remembers its hash in the small ghost. Returns whether a block was freed.
    private mutating func evictFromSmall() -> Bool {
        let block = small.popFirst()
        let header = block.assumingMemoryBound(to: EntryHeader.self)
        let charge = Self.charge(storedLength: header.pointee.storedLength)
        if header.pointee.isDead {
            small.dead -= 1
            release(block, charge: charge, fromSmall: true)
            return true
        }
        if header.pointee.frequency > 0 && main.push(block) {
            header.pointee.frequency = 0
            header.pointee.state = header.pointee.state & ~EntryHeader.queueMask | EntryHeader.main
            smallCharged -= charge
            return false
        }
        let hash = hashOf(block)
        indexDelete(hash: hash, block: block)
        ghostRemember(hash: hash, charge: charge, fromMain: false)
        count -= 1
        counters.evictions &+= 1
        release(block, charge: charge, fromSmall: true)
        return true
    }

    /// Pops `main` until a block is freed: dead blocks are freed, read entries re-queued with
    /// frequency - 1 (so at most two passes with the cap of 1), and the first unread entry evicted
    /// into the main ghost.
    private mutating func evictFromMain() {
        while main.count > 0 {
            let block = main.popFirst()
            let header = block.assumingMemoryBound(to: EntryHeader.self)
            let charge = Self.charge(storedLength: header.pointee.storedLength)
            if header.pointee.isDead {
                main.dead -= 1
                release(block, charge: charge, fromSmall: false)
                return
            }
            // Re-queueing into the ring it was just popped from never needs more room.
            if header.pointee.frequency > 0 && main.push(block) {
                header.pointee.frequency -= 1
                continue
            }
            let hash = hashOf(block)
            indexDelete(hash: hash, block: block)
            ghostRemember(hash: hash, charge: charge, fromMain: true)
            count -= 1
            counters.evictions &+= 1
            release(block, charge: charge, fromSmall: false)
            return
        }
    }
}
