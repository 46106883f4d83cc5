/// Reference eviction policies for trace replay, each charging only object sizes against a byte
/// capacity (as libCacheSim does), so that Magpie's miss ratio can be read against them on the same
/// trace. Exact, single-threaded, and simple on purpose: they are the yardstick, not the product.

/// Misses of one replay, and optionally which requests hit.
struct ReplayOutcome {
    var requests = 0
    var misses = 0
    var requestBytes = 0
    var missBytes = 0
    /// When recording (`replay --hits-directory`), a byte per request: 1 for a hit, 0 for a miss.
    private(set) var hits: [UInt8]?

    init(recordingHits: Bool = false) { hits = recordingHits ? [] : nil }

    var missRatio: Double { requests == 0 ? 0 : Double(misses) / Double(requests) }
    var byteMissRatio: Double { requestBytes == 0 ? 0 : Double(missBytes) / Double(requestBytes) }

    mutating func count(size: UInt32, hit: Bool) {
        requests += 1
        requestBytes += Int(size)
        hits?.append(hit ? 1 : 0)
        if !hit {
            misses += 1
            missBytes += Int(size)
        }
    }
}

enum ReferencePolicy: String, CaseIterable {
    case lru = "LRU", fifo = "FIFO", arc = "ARC", s3fifo = "S3-FIFO", wTinyLFU = "W-TinyLFU", lirs = "LIRS"
    case belady = "Belady"

    /// The policy's misses on `trace` at `capacity` bytes; with `recordingHits`, which requests hit.
    func replay(_ trace: Trace, capacity: Int, recordingHits: Bool = false) -> ReplayOutcome {
        switch self {
        case .lru: replayLRU(trace, capacity: capacity, recordingHits: recordingHits)
        case .fifo: replayFIFO(trace, capacity: capacity, recordingHits: recordingHits)
        case .arc: replayARC(trace, capacity: capacity, recordingHits: recordingHits)
        case .s3fifo: replayS3FIFO(trace, capacity: capacity, recordingHits: recordingHits)
        case .wTinyLFU: replayWTinyLFU(trace, capacity: capacity, recordingHits: recordingHits)
        case .lirs: replayLIRS(trace, capacity: capacity, recordingHits: recordingHits)
        case .belady: replayBelady(trace, capacity: capacity, recordingHits: recordingHits)
        }
    }
}

/// An LRU-ordered list of (id, size) with its byte total: most recent at the front.
struct RecencyList {
    private var slotOf: [UInt64: Int32] = [:]
    private var ids: [UInt64] = []
    private var sizes: [Int] = []
    private var previous: [Int32] = []
    private var next: [Int32] = []
    private var freeSlots: [Int32] = []
    private var head: Int32 = -1
    private var tail: Int32 = -1
    private(set) var bytes = 0

    var isEmpty: Bool { head < 0 }
    var count: Int { slotOf.count }
    func contains(_ id: UInt64) -> Bool { slotOf[id] != nil }

    /// The size `id` was pushed with, if present.
    func size(of id: UInt64) -> Int? { slotOf[id].map { sizes[Int($0)] } }

    /// The least recent entry, left in place.
    var last: (id: UInt64, size: Int)? { tail < 0 ? nil : (ids[Int(tail)], sizes[Int(tail)]) }

    /// Makes `id` the most recent entry; false if it is absent.
    @discardableResult
    mutating func moveToFront(_ id: UInt64) -> Bool {
        guard let slot = slotOf[id] else { return false }
        guard slot != head else { return true }
        let (p, n) = (previous[Int(slot)], next[Int(slot)])
        next[Int(p)] = n  // slot is not the head, so it has a predecessor
        if n >= 0 { previous[Int(n)] = p } else { tail = p }
        previous[Int(slot)] = -1
        next[Int(slot)] = head
        previous[Int(head)] = slot
        head = slot
        return true
    }

    mutating func pushFront(_ id: UInt64, size: Int) {
        let slot: Int32
        if let reused = freeSlots.popLast() {
            slot = reused
            ids[Int(slot)] = id
            sizes[Int(slot)] = size
        } else {
            slot = Int32(ids.count)
            ids.append(id)
            sizes.append(size)
            previous.append(-1)
            next.append(-1)
        }
        previous[Int(slot)] = -1
        next[Int(slot)] = head
        if head >= 0 { previous[Int(head)] = slot }
        head = slot
        if tail < 0 { tail = slot }
        slotOf[id] = slot
        bytes += size
    }

    /// Removes `id`; returns its size.
    @discardableResult
    mutating func remove(_ id: UInt64) -> Int? {
        guard let slot = slotOf.removeValue(forKey: id) else { return nil }
        let (p, n) = (previous[Int(slot)], next[Int(slot)])
        if p >= 0 { next[Int(p)] = n } else { head = n }
        if n >= 0 { previous[Int(n)] = p } else { tail = p }
        freeSlots.append(slot)
        bytes -= sizes[Int(slot)]
        return sizes[Int(slot)]
    }

    /// Removes the least recent entry.
    mutating func popBack() -> (id: UInt64, size: Int)? {
        guard tail >= 0 else { return nil }
        let id = ids[Int(tail)]
        return remove(id).map { (id, $0) }
    }
}

/// ARC (Megiddo and Modha), in bytes: T1 (seen once) and T2 (seen again) hold the cached objects, the
/// ghosts B1 and B2 remember what each evicted, and the target size of T1 adapts on ghost hits by the
/// missed object's size scaled by the ghosts' ratio.
private func replayARC(_ trace: Trace, capacity: Int, recordingHits: Bool) -> ReplayOutcome {
    var outcome = ReplayOutcome(recordingHits: recordingHits)
    var t1 = RecencyList(), t2 = RecencyList(), b1 = RecencyList(), b2 = RecencyList()
    var target = 0.0  // bytes T1 should hold
    let c = Double(capacity)
    /// Makes room for `size` bytes, evicting from T1 or T2 into their ghosts.
    func replace(_ size: Int, inB2: Bool) {
        while t1.bytes + t2.bytes + size > capacity {
            if !t1.isEmpty && (Double(t1.bytes) > target || (inB2 && Double(t1.bytes) >= target) || t2.isEmpty) {
                if let (id, s) = t1.popBack() { b1.pushFront(id, size: s) }
            } else if let (id, s) = t2.popBack() {
                b2.pushFront(id, size: s)
            } else {
                return
            }
        }
    }
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = Int(trace.sizes[request])
        if let s = t1.remove(id) ?? t2.remove(id) {
            outcome.count(size: UInt32(size), hit: true)
            t2.pushFront(id, size: s)
            continue
        }
        outcome.count(size: UInt32(size), hit: false)
        guard size <= capacity else { continue }
        if b1.contains(id) {
            target = min(c, target + max(Double(b2.bytes) / Double(max(1, b1.bytes)), 1) * Double(size))
            b1.remove(id)
            replace(size, inB2: false)
            t2.pushFront(id, size: size)
        } else if b2.contains(id) {
            target = max(0, target - max(Double(b1.bytes) / Double(max(1, b2.bytes)), 1) * Double(size))
            b2.remove(id)
            replace(size, inB2: true)
            t2.pushFront(id, size: size)
        } else {
            // Keep |T1| + |B1| ≤ c and the whole directory ≤ 2c, in bytes.
            while t1.bytes + b1.bytes + size > capacity, !b1.isEmpty { _ = b1.popBack() }
            while t1.bytes + b1.bytes + size > capacity, let (_, _) = t1.popBack() {}
            while t1.bytes + t2.bytes + b1.bytes + b2.bytes + size > 2 * capacity, !b2.isEmpty { _ = b2.popBack() }
            replace(size, inB2: false)
            t1.pushFront(id, size: size)
        }
    }
    return outcome
}

/// Exact LRU over a `RecencyList`.
private func replayLRU(_ trace: Trace, capacity: Int, recordingHits: Bool) -> ReplayOutcome {
    var outcome = ReplayOutcome(recordingHits: recordingHits)
    var cached = RecencyList()
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = trace.sizes[request]
        if let held = cached.remove(id) {
            outcome.count(size: size, hit: true)
            cached.pushFront(id, size: held)
            continue
        }
        outcome.count(size: size, hit: false)
        guard Int(size) <= capacity else { continue }
        while cached.bytes + Int(size) > capacity, cached.popBack() != nil {}
        cached.pushFront(id, size: Int(size))
    }
    return outcome
}

/// FIFO: objects leave in insertion order; a hit changes nothing.
private func replayFIFO(_ trace: Trace, capacity: Int, recordingHits: Bool) -> ReplayOutcome {
    var outcome = ReplayOutcome(recordingHits: recordingHits)
    var cached: [UInt64: Int] = [:]
    var queue = IDQueue()
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
        while used + Int(size) > capacity, let (old, _) = queue.pop() { used -= cached.removeValue(forKey: old) ?? 0 }
        queue.push(id, 0)
        cached[id] = Int(size)
        used += Int(size)
    }
    return outcome
}

/// Belady's optimum (evict the object requested farthest in the future; one never requested again
/// first). A new object is admitted and may be the one evicted at once, which is the optimum's bypass.
/// A max-heap of (next access, id) with lazy deletion: an entry is current only if it matches the
/// object's recorded next access.
private func replayBelady(_ trace: Trace, capacity: Int, recordingHits: Bool) -> ReplayOutcome {
    var outcome = ReplayOutcome(recordingHits: recordingHits)
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
