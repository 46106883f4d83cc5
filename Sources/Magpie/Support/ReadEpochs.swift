import Glibc
import Synchronization

// MARK: - Read epochs: when a block a lock-free reader may still hold can be freed
//
// The memory tier's hits take no lock (see Memory/LockFreeRead.swift). A writer that unlinks an entry
// block cannot free it at once: a reader that loaded its address a moment earlier may still be copying
// it. This file decides when it can, by epochs (Fraser's epoch-based reclamation, reduced to what a
// cache needs):
//
//   global   one process-wide counter, the epoch, from 1, in a cache line of its own. Only writers
//            change it (one atomic add per reclamation pass, never per read).
//   slots    one 64-byte line per thread that ever read lock-free, `capacity` of them: the epoch the
//            thread pinned (0: not reading). Only its thread writes a slot (besides registration and
//            release, under the registry's mutex); writers read them all.
//
// A read: `pin()` loads the global epoch (acquire) and stores it in the thread's slot (sequentially
// consistent: on x86 one `xchg` on a line no other core writes), then loads the index (sequentially
// consistent loads, plain `mov`s on x86); `unpin()` stores 0 (release). A read inside a read (a `body`
// that reads again) finds its slot already pinned and leaves it as it is.
//
// A writer unlinks a block from the index, then `retire`s it into its shard's list (RetiredBlocks).
// A reclamation pass: a sequentially consistent fence, `advance()` (an atomic add: the epoch e it
// returns tags every block retired before it), then `oldestPinned()` (the least non-zero slot, read
// sequentially consistent). A block tagged e is freed once every pinned slot holds more than e.
//
// Why a reader never touches a freed block. Take a block B unlinked by store U, tagged e by the add A
// that follows U, and a reader R that loads B's address from the index (load L, after R's pin P, which
// stored the epoch v that R loaded from the global at G).
//  - If v > e, G read an epoch written by A or later, so A happened before G, and U (before A) happened
//    before L: L cannot see B any more. So a reader that reaches B pinned v ≤ e.
//  - The pass that frees B reads R's slot after A. P and that read, and U and L, form the store-buffer
//    pattern, and all four are sequentially consistent (U through the fence before A): either the pass
//    sees P (then R's slot is v ≤ e and B waits), or L sees U (then R never reaches B). R's slot goes
//    back to 0 (release) only after its last access to B, and the pass reads it with a sequentially
//    consistent (so acquiring) load: the read happens before the free. Thread Sanitizer sees exactly
//    these atomics, so it checks this argument on every run of the stress suites.
//
// Cost. A read: a thread-specific-data load, the slot's `xchg`, a release store; no line another core
// writes. A pass: an atomic add on the global line and a read of every slot ever used (`highWater`
// lines): so passes are batched (RetiredBlocks.isDue). On 64 cores a pass reads 64 lines, each likely in
// another core's cache: a few microseconds, once per 16 retired blocks or 256 KiB. A reader that is
// descheduled while pinned holds back only the blocks retired after it pinned, until it runs again;
// memory freed late is bounded by what the writers retire in that time (it is counted: see
// ``MemoryTierStatistics/unreclaimedBytes``).
//
// A thread beyond `capacity` (256 threads reading at once) gets no slot and reads through the shard's
// lock, which is correct, just not lock-free. A slot is given back when its thread exits (the key's
// destructor), and taken by the next thread that reads.

/// The epoch state of the process and the per-thread slots (see the top of this file).
enum ReadEpochs {
    /// The most threads that read lock-free at once.
    static let capacity = 256
    static let lineSize = 64

    // Invariant: `region` is allocated once (never freed), 64-byte aligned, `(capacity + 2) * 64` bytes
    // (nil only if that failed: then no memory tier can be created, see ``handle``, so the writers'
    // functions below, which only tiers call, always find it):
    // line 0 holds the global epoch (Atomic<UInt64>, starts at 1); line 1 the registry's mutex and, at
    // byte 48, `highWater` (Atomic<Int>); line 2 + s slot s: its pinned epoch (Atomic<UInt64>) at byte 0,
    // and at byte 8 whether a thread holds it (a UInt64 read and written only with the mutex held).
    nonisolated(unsafe) private static let allocatedRegion: UnsafeMutableRawPointer? = {
        var raw: UnsafeMutableRawPointer? = nil
        let length = (capacity + 2) * lineSize
        guard posix_memalign(&raw, lineSize, length) == 0, let raw else { return nil }
        memset(raw, 0, length)
        raw.bindMemory(to: Atomic<UInt64>.self, capacity: 1).pointee.store(1, ordering: .relaxed)
        _ = PThreadMutex(at: raw + lineSize)
        return raw
    }()

    /// The thread-specific value: nil before the thread's first read, else its slot + 1 as pointer
    /// bits (`capacity + 1`: no slot was free).
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { value in
            guard let value else { return }
            ReadEpochs.release(slot: Int(bitPattern: value) - 1)
        }
        return key
    }()

    private static var region: UnsafeMutableRawPointer { allocatedRegion.unsafelyUnwrapped }

    @inline(__always)
    private static var global: UnsafeMutablePointer<Atomic<UInt64>> {
        region.assumingMemoryBound(to: Atomic<UInt64>.self)
    }

    @inline(__always)
    private static var highWater: UnsafeMutablePointer<Atomic<Int>> {
        (region + lineSize + 48).assumingMemoryBound(to: Atomic<Int>.self)
    }

    /// Slot `slot`'s pinned epoch in the table at `region`.
    @inline(__always)
    static func epoch(of slot: Int, in region: UnsafeMutableRawPointer) -> UnsafeMutablePointer<Atomic<UInt64>> {
        (region + (slot &+ 2) &* lineSize).assumingMemoryBound(to: Atomic<UInt64>.self)
    }

    @inline(__always)
    private static func epoch(of slot: Int) -> UnsafeMutablePointer<Atomic<UInt64>> { epoch(of: slot, in: region) }

    @inline(__always)
    private static func taken(_ slot: Int) -> UnsafeMutablePointer<UInt64> {
        (region + (slot + 2) * lineSize + 8).assumingMemoryBound(to: UInt64.self)
    }

    private static var registry: PThreadMutex { PThreadMutex(initialized: region + lineSize) }

    // MARK: Readers

    /// What a read needs of this file, copied into each tier so that a hit reads no global (a global's
    /// first-use check is a call to `swift_once` on every access).
    struct Handle: @unchecked Sendable {
        // @unchecked Sendable invariant: `region` is the process's read-epoch table, which is never freed
        // and is only accessed atomically (or under its mutex) as described above.
        let region: UnsafeMutableRawPointer
        let key: pthread_key_t

        /// Pins the calling thread's slot at the current epoch (unless a read of this thread already
        /// has): from here until ``unpin(_:)`` no block reachable from an index now is freed. Nil when
        /// the thread has no slot (more than ``ReadEpochs/capacity`` threads read): read under the lock.
        @inline(__always)
        func pin() -> ReadPin? {
            let slot: Int
            if let value = pthread_getspecific(key) {
                slot = Int(bitPattern: value) &- 1
                guard slot < ReadEpochs.capacity else { return nil }
            } else {
                guard let registered = ReadEpochs.register() else { return nil }
                slot = registered
            }
            let pinned = ReadEpochs.epoch(of: slot, in: region)
            if pinned.pointee.load(ordering: .relaxed) != 0 { return ReadPin(slot: slot, outermost: false) }
            let global = region.assumingMemoryBound(to: Atomic<UInt64>.self)
            pinned.pointee.store(global.pointee.load(ordering: .acquiring), ordering: .sequentiallyConsistent)
            return ReadPin(slot: slot, outermost: true)
        }

        /// Ends the read that ``pin()`` began.
        @inline(__always)
        func unpin(_ pin: ReadPin) {
            guard pin.outermost else { return }
            ReadEpochs.epoch(of: pin.slot, in: region).pointee.store(0, ordering: .releasing)
        }
    }

    /// The handle of this process's read epochs; nil when its 16 KiB could not be allocated (a tier
    /// then refuses to be created).
    static var handle: Handle? { allocatedRegion.map { Handle(region: $0, key: key) } }

    /// Whether the calling thread is inside a read (then it must not wait for readers).
    static var callerIsPinned: Bool {
        guard let value = pthread_getspecific(key) else { return false }
        let slot = Int(bitPattern: value) &- 1
        return slot < capacity && epoch(of: slot).pointee.load(ordering: .relaxed) != 0
    }

    /// Takes a free slot for the calling thread; nil (remembered) when all are taken.
    @inline(never)
    static func register() -> Int? {
        let registry = registry
        registry.lock()
        defer { registry.unlock() }
        for slot in 0..<capacity where taken(slot).pointee == 0 {
            taken(slot).pointee = 1
            if slot >= highWater.pointee.load(ordering: .relaxed) {
                highWater.pointee.store(slot + 1, ordering: .sequentiallyConsistent)
            }
            pthread_setspecific(key, UnsafeRawPointer(bitPattern: slot + 1))
            return slot
        }
        pthread_setspecific(key, UnsafeRawPointer(bitPattern: capacity + 1))
        return nil
    }

    /// Gives a slot back (its thread exits).
    private static func release(slot: Int) {
        guard slot >= 0 && slot < capacity else { return }
        let registry = registry
        registry.lock()
        epoch(of: slot).pointee.store(0, ordering: .releasing)
        taken(slot).pointee = 0
        registry.unlock()
    }

    // MARK: Writers

    /// Starts a reclamation pass: returns the epoch that tags every block retired before this call, and
    /// moves the global epoch past it (so that reads starting from now pin a later one).
    static func advance() -> UInt64 {
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        return global.pointee.wrappingAdd(1, ordering: .sequentiallyConsistent).oldValue
    }

    /// The least epoch a reader has pinned, or `UInt64.max` when no thread is reading. A block tagged
    /// below it can be freed.
    static func oldestPinned() -> UInt64 {
        var oldest = UInt64.max
        let used = highWater.pointee.load(ordering: .sequentiallyConsistent)
        for slot in 0..<used {
            let pinned = epoch(of: slot).pointee.load(ordering: .sequentiallyConsistent)
            if pinned != 0 && pinned < oldest { oldest = pinned }
        }
        return oldest
    }

    /// Waits until no reader pinned at `tag` or before is still reading; false (at once) when the caller
    /// itself is reading, which it would wait for forever.
    static func waitForReaders(pastTag tag: UInt64) -> Bool {
        guard !callerIsPinned else { return false }
        while oldestPinned() <= tag { sched_yield() }
        return true
    }

    // MARK: Per-thread counters

    /// Bytes of a per-slot counter table (``allocateCounters()``): one 64-byte line per slot.
    static let counterTableSize = capacity * lineSize

    /// A zeroed table of one counter per slot, each in its own cache line; free it with `free`.
    static func allocateCounters() -> UnsafeMutableRawPointer? {
        var raw: UnsafeMutableRawPointer? = nil
        guard posix_memalign(&raw, lineSize, counterTableSize) == 0, let raw else { return nil }
        memset(raw, 0, counterTableSize)
        return raw
    }

    /// Adds 1 to `slot`'s counter in `table`. Only the thread holding the slot writes it (a thread that
    /// takes a slot given back continues the count: the registry's mutex orders the two), so the add is
    /// a load and a store, not a locked instruction.
    @inline(__always)
    static func count(_ slot: Int, in table: UnsafeMutableRawPointer) {
        let counter = (table + slot &* lineSize).assumingMemoryBound(to: Atomic<UInt64>.self)
        counter.pointee.store(counter.pointee.load(ordering: .relaxed) &+ 1, ordering: .relaxed)
    }

    /// The sum of every slot's counter in `table`.
    static func sum(_ table: UnsafeMutableRawPointer) -> UInt64 {
        var total: UInt64 = 0
        for slot in 0..<capacity {
            total &+= (table + slot * lineSize).assumingMemoryBound(to: Atomic<UInt64>.self).pointee.load(
                ordering: .relaxed)
        }
        return total
    }
}

/// A pinned read (see ``ReadEpochs/Handle/pin()``).
struct ReadPin {
    let slot: Int
    /// False for a read inside another read of the same thread: the outer one unpins.
    let outermost: Bool
}

/// Blocks (and index tables) a shard has unlinked and not yet freed, because a lock-free reader might
/// still hold them (see the top of this file). Owned by a `ShardStorage`, used under its lock.
///
/// Memory: 24 bytes per block (address, tag, bytes); tags are given in order, so the tagged blocks are
/// a prefix sorted by tag, and a pass frees a prefix of that.
struct RetiredBlocks {
    private struct Item {
        let block: UnsafeMutableRawPointer
        var tag: UInt64
        let bytes: Int
    }

    // Invariant: `items` holds `capacity` entries, the first `count` valid; entries below `tagged` have
    // a tag, the others were retired after the last pass started.
    private var items: UnsafeMutablePointer<Item>?
    private var capacity = 0
    private(set) var count = 0
    private var tagged = 0
    /// The blocks' bytes (entries' charges; tables count 0): memory held beyond the charged bytes.
    private(set) var bytes = 0
    /// Blocks and bytes retired since the last pass (what makes the next one due: while a reader stays
    /// pinned, the list does not empty, and a pass on every retire would only repeat the last one).
    private var sincePass = 0
    private var bytesSincePass = 0

    /// Blocks no reader can hold any more, kept for the shard's next stores instead of freed (at most
    /// ``spareCapacity``; their usable sizes, from `malloc_usable_size`, beside them). Why: freed, a block
    /// goes back to the arena of the thread that allocated it, and with lock-free readers the frees fall
    /// on other threads at other moments than the allocations; glibc's per-thread arenas then strand
    /// free chunks in one arena while another grows (measured: resident memory 1.65 × the budget with 2
    /// threads, against 1.35 × with locked reads and 1.37 × with one arena). Reused within the shard, a
    /// block never travels between arenas.
    private var spares: UnsafeMutablePointer<(block: UnsafeMutableRawPointer, usable: Int)>?
    private var spareCount = 0
    /// The spares' usable bytes.
    private(set) var spareBytes = 0
    static let spareCapacity = 32

    /// A pass runs once this many blocks, or ``dueBytes``, wait. Not 1: a pass reads every reading
    /// thread's slot line, each a transfer from another core, so a check on every retire costs a
    /// 64-core process 64 transfers per eviction (on this project's 2 cores the two forms measured
    /// within noise: 5 same-minute pairs, medians 0.94-1.09). Small, so that what a pass frees is still
    /// in the cache; the shard reuses it for its next stores (``takeSpare(_:)``).
    static let dueCount = 16
    static let dueBytes = 256 * 1024

    init() {}

    /// Frees every block at once. Only when no reader can hold one: the tier is being destroyed.
    /// The list is unusable afterwards.
    func freeAll() {
        for offset in 0..<count { free(items.unsafelyUnwrapped[offset].block) }
        free(items)
        for offset in 0..<spareCount { free(spares.unsafelyUnwrapped[offset].block) }
        free(spares)
    }

    /// Takes `block` (unlinked from the index, out of every ring) to free once no reader can hold it.
    /// Runs a pass when enough are waiting.
    mutating func retire(_ block: UnsafeMutableRawPointer, bytes charge: Int) {
        if count == capacity && !grow() {
            // Out of memory for the list: wait for the readers instead (a read takes nanoseconds), unless
            // this thread is itself reading (a `body` that stores): then the block is leaked, never freed
            // while a reader might hold it.
            if ReadEpochs.waitForReaders(pastTag: ReadEpochs.advance()) { free(block) }
            return
        }
        items.unsafelyUnwrapped[count] = Item(block: block, tag: 0, bytes: charge)
        count += 1
        bytes += charge
        sincePass += 1
        bytesSincePass += charge
        if sincePass >= Self.dueCount || bytesSincePass >= Self.dueBytes { reclaim() }
    }

    /// A reclamation pass: tags the untagged blocks, then frees those no reader can hold.
    mutating func reclaim() {
        sincePass = 0
        bytesSincePass = 0
        guard count > 0, let items else { return }
        if tagged < count {
            let tag = ReadEpochs.advance()
            for offset in tagged..<count { items[offset].tag = tag }
            tagged = count
        }
        let oldest = ReadEpochs.oldestPinned()
        var freed = 0
        while freed < tagged && items[freed].tag < oldest {
            keepOrFree(items[freed].block, isEntry: items[freed].bytes > 0)
            bytes -= items[freed].bytes
            freed += 1
        }
        guard freed > 0 else { return }
        for offset in freed..<count { items[offset - freed] = items[offset] }
        count -= freed
        tagged -= freed
    }

    /// A block no reader holds: kept as a spare (an entry block, while there is room), else freed.
    private mutating func keepOrFree(_ block: UnsafeMutableRawPointer, isEntry: Bool) {
        if isEntry && spareCount < Self.spareCapacity {
            if spares == nil {
                spares = malloc(Self.spareCapacity * MemoryLayout<(block: UnsafeMutableRawPointer, usable: Int)>.stride)?
                    .bindMemory(to: (block: UnsafeMutableRawPointer, usable: Int).self, capacity: Self.spareCapacity)
            }
            if let spares {
                let usable = malloc_usable_size(block)
                spares[spareCount] = (block, usable)
                spareCount += 1
                spareBytes += usable
                return
            }
        }
        free(block)
    }

    /// A spare block of at least `length` usable bytes and less than twice that (so a small entry does not
    /// pin a large block), or nil; the newest such first (likeliest in the cache).
    @inline(__always)
    mutating func takeSpare(_ length: Int) -> UnsafeMutableRawPointer? {
        guard spareCount > 0, let spares else { return nil }
        var index = spareCount - 1
        while index >= 0 {
            let usable = spares[index].usable
            if usable >= length && usable < 2 * length { break }
            index -= 1
        }
        guard index >= 0 else { return nil }
        let block = spares[index].block
        spareBytes -= spares[index].usable
        spareCount -= 1
        spares[index] = spares[spareCount]
        return block
    }

    /// Frees the spares (the shard was emptied: they would only hold memory).
    mutating func freeSpares() {
        for offset in 0..<spareCount { free(spares.unsafelyUnwrapped[offset].block) }
        spareCount = 0
        spareBytes = 0
    }

    private mutating func grow() -> Bool {
        let wanted = max(16, capacity * 2)
        guard let raw = realloc(items, wanted * MemoryLayout<Item>.stride) else { return false }
        items = raw.bindMemory(to: Item.self, capacity: wanted)
        capacity = wanted
        return true
    }
}

/// glibc's `malloc_usable_size` (declared in <malloc.h>, which the Glibc module does not export): the
/// bytes a block from `malloc` can hold, at least what was asked for.
@_silgen_name("malloc_usable_size")
private func malloc_usable_size(_ block: UnsafeMutableRawPointer?) -> Int
