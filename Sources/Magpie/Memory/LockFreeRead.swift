import Glibc
import Synchronization

// MARK: - Lock-free hits
//
// A memory hit takes no lock and writes no cache line another core reads, except the entry's frequency
// byte the first time the entry is read after the policy cleared it. Misses, stores, removals and
// eviction keep the shard's mutex (ShardStorage.swift); a read that finds nothing, or finds an entry it
// may not serve by itself (expired, or a trace-replay placeholder), asks again under the mutex, which
// then counts it and, for an expired entry, removes it.
//
// ### What a reader reads, and who writes it
//
//   published  one word per shard, in a cache line of its own: the address of the current index
//              table. Stored (release) by the writer when it replaces the table (growth, removeAll).
//   table      a 16-byte header holding the bucket mask, then the buckets: atomic 64-bit words
//              (tag | distance | block address, ShardStorage+Index.swift). The writer stores them
//              (release) under the mutex; readers load them (sequentially consistent: a plain `mov`).
//   block      header, extras, key, value. Written whole before its bucket points to it, never changed
//              after, but for two bytes accessed only atomically: the frequency (which hits set) and
//              the queue and dead bits of the state (the reader reads only the flag bits beside them,
//              which never change). A replacement is a new block, never an overwrite in place.
//   slot       the thread's read-epoch slot (Support/ReadEpochs.swift), and the thread's line in the
//              tier's hit counters (`hitCounts`, summed by `statistics`).
//
// ### A read
//
//   pin the thread's slot → load `published` (acquire) → probe from home: load bucket; empty → miss;
//   tag equal → compare key length and bytes in the block → equal: check the flags (deadline, placeholder),
//   set the frequency if it is 0, count the hit in the thread's line, run `body` over the value bytes →
//   unpin.
//
// ### Why a reader never sees a freed or half-written entry
//
//  - Half-written: a block's bytes are stored before the release store that puts its address in a
//    bucket (or before the table that holds it is published, release); the reader's load of that bucket
//    (or of `published`) acquires them. Nothing in a published block changes but the two atomic bytes.
//  - Freed: a writer never frees an unlinked block or a replaced table itself; it retires it, and the
//    read epochs free it only once every reader that pinned before it was unlinked has unpinned
//    (ReadEpochs.swift gives the argument). A reader pins before its first load, so any block or table
//    it can reach stays allocated until it unpins.
//  - Stale: a bucket's block was the key's value when the bucket was loaded (a writer takes the bucket out
//    before it marks the block dead, and a replacement's new bucket is stored after the old one is gone),
//    so a read returns a value that was current at an instant within the read: never one that a store
//    completed before the read began had replaced.
//  - Moved: a deletion shifts later buckets of a run back one by one (no tombstones), and growth builds a
//    new table. A reader racing either may miss a key that is present, never find a wrong one (the key is
//    compared in the block); a miss is asked again under the mutex, which is exact.
//
// ### What it costs
//
// A hit: one thread-specific-data load, an `xchg` on the thread's own slot line, the probe (two dependent
// loads as before), at most one byte store (first hit after the policy cleared the bit), a load and a
// store on the thread's own counter line, a release store. No instruction with a lock prefix touches a
// line another core writes, so hits on the same keys from any number of cores do not queue: on 64 cores
// the lines they share (the table, the blocks) stay in every core's cache in the shared state. A writer
// pays a reclamation pass per 16 blocks (or 256 KiB) it retires: an atomic add on the epoch line and one
// load per thread that ever read. A block freed late is memory held beyond the budget until the next pass
// after its readers unpin (``MemoryTierStatistics/unreclaimedBytes``). Blocks that pass are kept, up to
// 32 per shard, for the shard's next stores rather than freed (RetiredBlocks.takeSpare): freed on
// whichever thread ran the pass, they drifted between glibc's per-thread arenas and resident memory grew
// from 1.35 × to 1.65 × the budget at 2 threads; reused in place it is 1.39 ×.
//
// A miss probes twice (without and with the mutex); a miss costs a disk read or a load anyway.

extension Shard {
    /// The value bytes of `key`, found without taking the lock, its hit counted in `hitCounts`; nil when
    /// the key was not found, or found expired, negative or a placeholder (ask under the lock then). The
    /// caller has pinned its thread (`pin`) and may use the bytes until it unpins. Not generic, so that a
    /// caller's generic read needs no run-time metadata for it (measured: an `R?` returned from here
    /// cost every hit a metadata look-up).
    @inline(__always)
    func findLockFree(
        hash: UInt64, key: UnsafeRawBufferPointer, clock: CacheClock, pin: ReadPin, hitCounts: UnsafeMutableRawPointer
    ) -> UnsafeRawBufferPointer? {
        guard let (block, header) = findBlockLockFree(
            hash: hash, key: key, clock: clock, pin: pin, hitCounts: hitCounts, refusing: EntryHeader.plainReadCheckFlags)
        else { return nil }
        return ShardStorage.value(of: block, header)
    }

    /// The block of `key` and its header, found without taking the lock, its hit counted; nil when not
    /// found, or found expired or a placeholder, or with a flag of `refusing` (beyond the expiry and
    /// placeholder flags, always checked) set. See ``findLockFree(hash:key:clock:pin:hitCounts:)``.
    @inline(__always)
    func findBlockLockFree(
        hash: UInt64, key: UnsafeRawBufferPointer, clock: CacheClock, pin: ReadPin, hitCounts: UnsafeMutableRawPointer,
        refusing: UInt8
    ) -> (UnsafeMutableRawPointer, EntryHeader)? {
        // Invariant: `published` always holds the address of a live table (ShardStorage.init, replaceTable).
        let table = UnsafeMutableRawPointer(bitPattern: published.pointee.load(ordering: .acquiring)).unsafelyUnwrapped
        let mask = IndexTable.mask(table)
        let buckets = IndexTable.buckets(table)
        let tag = hash &>> 56
        var position = Int(truncatingIfNeeded: hash &>> 12) & mask
        // A run is never longer than the table; the bound only keeps a reader racing a shift finite.
        for _ in 0...mask {
            let bucket = (buckets + position).pointee.load(ordering: .sequentiallyConsistent)
            if bucket == 0 { return nil }
            if bucket &>> 56 == tag {
                let block = ShardStorage.block(in: bucket)
                let header = EntryHeader(of: block)
                if ShardStorage.keyEquals(block, header, key) {
                    if header.state & (refusing | EntryHeader.expiryFlag | EntryHeader.placeholderFlag) != 0 {
                        if header.state & (refusing | EntryHeader.placeholderFlag) != 0
                            || ShardStorage.isExpired(block, header, now: clock.now())
                        {
                            return nil
                        }
                    }
                    if header.frequency < ShardStorage.frequencyCap {
                        EntryHeader.setFrequency(block, header.frequency &+ 1)
                    }
                    ReadEpochs.count(pin.slot, in: hitCounts)
                    return (block, header)
                }
            }
            position = (position &+ 1) & mask
        }
        return nil
    }
}
