/// Reference eviction policies for trace replay, each charging only object sizes against a byte
/// capacity (as libCacheSim does), so that Magpie's miss ratio can be read against them on the same
/// trace. Exact, single-threaded, and simple on purpose: they are the yardstick, not the product.

/// Misses of one replay.
struct ReplayOutcome {
    var requests = 0
    var misses = 0
    var requestBytes = 0
    var missBytes = 0

    var missRatio: Double { requests == 0 ? 0 : Double(misses) / Double(requests) }
    var byteMissRatio: Double { requestBytes == 0 ? 0 : Double(missBytes) / Double(requestBytes) }

    mutating func count(size: UInt32, hit: Bool) {
        requests += 1
        requestBytes += Int(size)
        if !hit {
            misses += 1
            missBytes += Int(size)
        }
    }
}

enum ReferencePolicy: String, CaseIterable {
    case lru = "LRU", fifo = "FIFO", belady = "Belady"

    func replay(_ trace: Trace, capacity: Int) -> ReplayOutcome {
        switch self {
        case .lru: replayLRU(trace, capacity: capacity)
        case .fifo: replayFIFO(trace, capacity: capacity)
        case .belady: replayBelady(trace, capacity: capacity)
        }
    }
}

/// Exact LRU: a doubly linked list over slot arrays, most recent at the head.
private func replayLRU(_ trace: Trace, capacity: Int) -> ReplayOutcome {
    var outcome = ReplayOutcome()
    var slotOf: [UInt64: Int32] = [:]
    var ids: [UInt64] = []
    var sizes: [Int] = []
    var previous: [Int32] = []
    var next: [Int32] = []
    var freeSlots: [Int32] = []
    var head: Int32 = -1
    var tail: Int32 = -1
    var used = 0
    func unlink(_ slot: Int32) {
        let (p, n) = (previous[Int(slot)], next[Int(slot)])
        if p >= 0 { next[Int(p)] = n } else { head = n }
        if n >= 0 { previous[Int(n)] = p } else { tail = p }
    }
    func pushFront(_ slot: Int32) {
        previous[Int(slot)] = -1
        next[Int(slot)] = head
        if head >= 0 { previous[Int(head)] = slot }
        head = slot
        if tail < 0 { tail = slot }
    }
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = trace.sizes[request]
        if let slot = slotOf[id] {
            outcome.count(size: size, hit: true)
            unlink(slot)
            pushFront(slot)
            continue
        }
        outcome.count(size: size, hit: false)
        guard Int(size) <= capacity else { continue }
        while used + Int(size) > capacity, tail >= 0 {
            let victim = tail
            unlink(victim)
            used -= sizes[Int(victim)]
            slotOf[ids[Int(victim)]] = nil
            freeSlots.append(victim)
        }
        let slot: Int32
        if let reused = freeSlots.popLast() {
            slot = reused
            ids[Int(slot)] = id
            sizes[Int(slot)] = Int(size)
        } else {
            slot = Int32(ids.count)
            ids.append(id)
            sizes.append(Int(size))
            previous.append(-1)
            next.append(-1)
        }
        pushFront(slot)
        slotOf[id] = slot
        used += Int(size)
    }
    return outcome
}

/// FIFO: objects leave in insertion order; a hit changes nothing.
private func replayFIFO(_ trace: Trace, capacity: Int) -> ReplayOutcome {
    var outcome = ReplayOutcome()
    var cached: [UInt64: Int] = [:]
    var queue: [UInt64] = []
    var front = 0
    var used = 0
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = trace.sizes[request]
        if cached[id] != nil {
            outcome.count(size: size, hit: true)
            continue
        }
        outcome.count(size: size, hit: false)
        guard Int(size) <= capacity else { continue }
        while used + Int(size) > capacity, front < queue.count {
            used -= cached.removeValue(forKey: queue[front]) ?? 0
            front += 1
        }
        if front > 4096 && front * 2 > queue.count {
            queue.removeFirst(front)
            front = 0
        }
        queue.append(id)
        cached[id] = Int(size)
        used += Int(size)
    }
    return outcome
}

/// Belady's optimum (evict the object requested farthest in the future; one never requested again
/// first). A new object is admitted and may be the one evicted at once, which is the optimum's bypass.
/// A max-heap of (next access, id) with lazy deletion: an entry is current only if it matches the
/// object's recorded next access.
private func replayBelady(_ trace: Trace, capacity: Int) -> ReplayOutcome {
    var outcome = ReplayOutcome()
    var cached: [UInt64: (size: Int, next: Int32)] = [:]
    var heap = MaxHeap()
    var used = 0
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = trace.sizes[request]
        let next = trace.nextAccess[request]
        if cached[id] != nil {
            outcome.count(size: size, hit: true)
            cached[id]!.next = next
            heap.push(next, id)
            continue
        }
        outcome.count(size: size, hit: false)
        guard Int(size) <= capacity else { continue }
        cached[id] = (Int(size), next)
        heap.push(next, id)
        used += Int(size)
        while used > capacity, let popped = heap.pop() {
            let (farthest, victim) = popped
            guard let entry = cached[victim], entry.next == farthest else { continue }  // stale
            cached[victim] = nil
            used -= entry.size
        }
    }
    return outcome
}

/// A binary max-heap of (key, id).
private struct MaxHeap {
    private var keys: [Int32] = []
    private var ids: [UInt64] = []

    mutating func push(_ key: Int32, _ id: UInt64) {
        keys.append(key)
        ids.append(id)
        var child = keys.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard keys[parent] < keys[child] else { break }
            keys.swapAt(parent, child)
            ids.swapAt(parent, child)
            child = parent
        }
    }

    mutating func pop() -> (Int32, UInt64)? {
        guard let top = keys.first else { return nil }
        let id = ids[0]
        let lastKey = keys.removeLast()
        let lastId = ids.removeLast()
        if !keys.isEmpty {
            keys[0] = lastKey
            ids[0] = lastId
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var largest = parent
                if left < keys.count && keys[left] > keys[largest] { largest = left }
                if right < keys.count && keys[right] > keys[largest] { largest = right }
                if largest == parent { break }
                keys.swapAt(parent, largest)
                ids.swapAt(parent, largest)
                parent = largest
            }
        }
        return (top, id)
    }
}
