/// LIRS (Jiang and Zhang, "LIRS: An Efficient Low Inter-reference Recency Set Replacement Policy to
/// Improve Buffer Cache Performance", SIGMETRICS '02) in bytes, as libCacheSim's `LIRS` runs it
/// (`LIRS.c`, the same in its GitHub tree of October 2024 and in the `libcachesim` 0.3.5 Python
/// package), so that the replay reproduces its numbers (on the shared trace 0.822037 and 0.738979 at
/// 1 % and 10 %, to the sixth digit):
///
///  - Resident HIR blocks get 1 % of the capacity (⌊1 %⌋, at least 1 B), LIR blocks the rest.
///  - Stack S holds LIR blocks, resident HIR blocks and non-resident HIR entries in recency order;
///    list Q holds the resident HIR blocks (and only them) in recency order. An object larger than
///    either share is never cached.
///  - A hit on an LIR block moves it to the top of S, then S is pruned (HIR entries leave its bottom
///    until an LIR block is there; non-resident ones are forgotten).
///  - A hit on a resident HIR block that is in S moves it to the top of S, removes it from Q and
///    makes it LIR; while the LIR blocks (with it) would exceed their share, the LIR block at the
///    bottom of S is demoted: it leaves S, and enters Q as a resident HIR block (evicting Q's LRU end
///    while Q would exceed its share), then S is pruned.
///  - A hit on a resident HIR block that is not in S moves it to Q's MRU end and puts it on top of S,
///    still HIR. (libCacheSim first demotes LIR blocks while the LIR blocks plus this block's size
///    exceed the LIR share — which they nearly always do once it is full; the paper does not. Kept,
///    as it is what produces libCacheSim's numbers.)
///  - A miss on a non-resident HIR entry of S (moved to S's top by the lookup) demotes LIR blocks
///    until it fits in the LIR share; then, while the cache lacks room for the request, evicts Q's
///    LRU end while Q is full (≥ its share) and demotes one LIR block; then it becomes a resident LIR
///    block (of the size its entry recorded).
///  - A miss on an object in neither S nor Q: while the LIR blocks have room it becomes LIR (on top of
///    S); otherwise it becomes a resident HIR block on top of S and at Q's MRU end, after evicting Q's
///    LRU end while Q would exceed its share.
///  - Evicting a resident HIR block from Q marks its S entry, if any, non-resident.
///  - Non-resident entries are bounded by bytes, as libCacheSim bounds them: after each request,
///    while the entries of S (resident or not, by object size) exceed twice the capacity, the oldest
///    non-resident entry — the one made non-resident longest ago — is removed from S. With at most
///    2 × capacity bytes of S entries and the cache's objects, memory stays proportional to the
///    capacity in objects.
///
/// libCacheSim's byte counters (LIR set, HIR set, cache) are updated exactly where it updates them.
/// One deviation: on a hit to a resident HIR block that is in Q but not in S, the LIR blocks demoted
/// first may push that very block out of Q (only when it and a demoted block together exceed the HIR
/// share, i.e. for objects over half of 1 % of the capacity — never on the shared trace). libCacheSim
/// then still records it in S as resident though no longer cached or counted, so it would hit later
/// without being charged; here it becomes a non-resident HIR entry, which keeps the cache within its
/// capacity. (The eviction loop also stops if a step frees nothing, where libCacheSim would spin.)
func replayLIRS(_ trace: Trace, capacity: Int, recordingHits: Bool) -> ReplayOutcome {
    var outcome = ReplayOutcome(recordingHits: recordingHits)
    var lirs = LIRSState(capacity: capacity)
    for request in 0..<trace.count {
        let id = trace.ids[request]
        let size = Int(trace.sizes[request])
        let hit = lirs.request(id, size: size)
        outcome.count(size: UInt32(size), hit: hit)
    }
    return outcome
}

private struct LIRSState {
    /// An S entry's status: LIR (always resident), resident HIR, or non-resident HIR.
    enum Status { case lir, residentHIR, nonResidentHIR }

    let capacity: Int
    let hirLimit: Int
    let lirLimit: Int
    /// Stack S: recency order and sizes, with each entry's status beside it.
    var stack = RecencyList()
    var status: [UInt64: Status] = [:]
    /// List Q of resident HIR blocks: the front is the most recent, the back is evicted first.
    var queue = RecencyList()
    /// The non-resident entries of S, in the order they became non-resident (the back is the oldest).
    var nonResident = RecencyList()
    /// libCacheSim's counters: bytes of LIR blocks, of resident HIR blocks, and in the cache.
    var lirBytes = 0
    var hirBytes = 0
    var occupied = 0

    init(capacity: Int) {
        self.capacity = capacity
        hirLimit = max(1, Int(0.01 * Double(capacity)))
        lirLimit = capacity - hirLimit
    }

    /// One request; true on a hit.
    mutating func request(_ id: UInt64, size: Int) -> Bool {
        let hit = lookup(id)
        if !hit && admit(id, size: size) {
            while occupied + size > capacity {
                let before = (occupied, lirBytes, hirBytes, stack.count, queue.count)
                makeRoom(for: id, size: size)
                if before == (occupied, lirBytes, hirBytes, stack.count, queue.count) { break }  // no progress
            }
            insert(id, size: size)
        }
        limitStack()
        assert(
            occupied == lirBytes + hirBytes && hirBytes == queue.bytes && hirBytes <= hirLimit && occupied <= capacity
                && stack.bytes <= 2 * capacity,
            "LIRS's counters disagree with its lists or exceed the capacity")
        return hit
    }

    /// The lookup (libCacheSim's `find`): moves `id` to the top of S and to Q's MRU end where present,
    /// and handles the hit cases.
    private mutating func lookup(_ id: UInt64) -> Bool {
        let inStack = stack.moveToFront(id)
        let inQueue = queue.moveToFront(id)
        if inStack {
            switch status[id]! {
            case .lir:
                prune()
                return true
            case .residentHIR:
                // Becomes LIR; it leaves Q.
                if let queued = queue.remove(id) {
                    hirBytes -= queued
                    occupied -= queued
                }
                let size = stack.size(of: id)!
                while lirBytes + size > lirLimit, demoteLIR() {}
                status[id] = .lir
                lirBytes += size
                occupied += size
                return true
            case .nonResidentHIR:
                return false
            }
        }
        guard inQueue, let size = queue.size(of: id) else { return false }
        // A resident HIR block not in S: back on top of S, still HIR (after libCacheSim's demotions).
        while lirBytes + size > lirLimit, demoteLIR() {}
        if queue.contains(id) {
            pushStack(id, size: size, .residentHIR)
        } else {
            // The demotions pushed it out of Q: it is no longer cached (see the note above).
            pushStack(id, size: size, .nonResidentHIR)
            nonResident.pushFront(id, size: size)
        }
        return true
    }

    /// Whether a missed object may be cached (libCacheSim's `can_insert`, which also makes room in
    /// the LIR or HIR share).
    private mutating func admit(_ id: UInt64, size: Int) -> Bool {
        guard size <= capacity else { return false }
        if let entry = stack.size(of: id) {
            // A non-resident HIR entry of S (a miss found nothing else in S).
            while lirBytes + entry > lirLimit, demoteLIR() {}
            nonResident.remove(id)
            return true
        }
        guard size <= lirLimit, size <= hirLimit else { return false }
        if lirBytes + size > lirLimit && hirBytes + size > hirLimit {
            while hirBytes + size > hirLimit, evictHIR() {}
        }
        return true
    }

    /// One step of libCacheSim's `evict` for the missed object `id`.
    private mutating func makeRoom(for id: UInt64, size: Int) {
        if stack.contains(id) {
            while hirBytes >= hirLimit, evictHIR() {}
            demoteLIR()
        } else if lirBytes + size > lirLimit && hirBytes + size > hirLimit {
            evictHIR()
        }
    }

    /// Caches the missed object `id` (libCacheSim's `insert`).
    private mutating func insert(_ id: UInt64, size: Int) {
        if let entry = stack.size(of: id) {
            // The non-resident HIR entry becomes a resident LIR block, keeping its recorded size.
            status[id] = .lir
            lirBytes += entry
            occupied += entry
            return
        }
        if lirBytes + size <= lirLimit {
            pushStack(id, size: size, .lir)
            lirBytes += size
        } else {
            pushStack(id, size: size, .residentHIR)
            pushQueue(id, size: size)
            hirBytes += size
        }
        occupied += size
    }

    private mutating func pushStack(_ id: UInt64, size: Int, _ entryStatus: Status) {
        stack.remove(id)
        stack.pushFront(id, size: size)
        status[id] = entryStatus
    }

    private mutating func pushQueue(_ id: UInt64, size: Int) {
        queue.remove(id)
        queue.pushFront(id, size: size)
    }

    private mutating func removeFromStack(_ id: UInt64) {
        stack.remove(id)
        status[id] = nil
    }

    /// Removes HIR entries from the bottom of S until an LIR block is there (or one entry is left).
    private mutating func prune() {
        while stack.count > 1, let (bottom, _) = stack.last, status[bottom] != .lir {
            if status[bottom] == .nonResidentHIR { nonResident.remove(bottom) }
            removeFromStack(bottom)
        }
    }

    /// Demotes the block at the bottom of S (an LIR block once S is pruned) into Q, then prunes S.
    /// False if S is empty.
    @discardableResult
    private mutating func demoteLIR() -> Bool {
        guard let (bottom, size) = stack.last else { return false }
        assert(status[bottom] == .lir, "S is pruned, so its bottom is an LIR block")
        lirBytes -= size
        removeFromStack(bottom)
        occupied -= size
        if size <= hirLimit {
            while hirBytes + size > hirLimit, evictHIR() {}
            pushQueue(bottom, size: size)
            hirBytes += size
            occupied += size
        }
        prune()
        return true
    }

    /// Evicts Q's LRU end; its S entry, if any, becomes non-resident. False if Q is empty.
    @discardableResult
    private mutating func evictHIR() -> Bool {
        guard let (victim, size) = queue.popBack() else { return false }
        hirBytes -= size
        if stack.contains(victim) {
            status[victim] = .nonResidentHIR
            nonResident.remove(victim)
            nonResident.pushFront(victim, size: size)
        }
        occupied -= size
        return true
    }

    /// Bounds S: while its entries exceed twice the capacity in bytes, forgets the oldest
    /// non-resident entry.
    private mutating func limitStack() {
        while stack.bytes > 2 * capacity, let (oldest, _) = nonResident.popBack() {
            removeFromStack(oldest)
        }
    }
}
