import Foundation
import Glibc
import Synchronization

/// The memory the fleet benchmark's processes share (a file each maps): the ground truth of every key,
/// the invalidation-lag probes, and the run's control words.
///
/// Layout (8-byte words, all atomics but the keys' locks, FleetKeyLock.swift's futex words; the file
/// starts zeroed, a valid state for every word):
///   control   16 words: 0 workers ready, 1 the measurement's start (ns), 2 its end, 3 stop, 4 loader
///             runs (single flight), 5 the warm-up's start (0 = not yet; written last), 6 and 7 when the
///             fault run SIGSTOPped Redis and when it resumed it, 8 and 9 when it killed Redis and when
///             the restarted server was up, 10 when it killed the subscriber connections, 11 and 12 when
///             it set Redis's `maxmemory` small enough to evict and when it set it back (0 = not yet)
///   status    16 words per worker: the last instant its change feed was seen 0 healthy (both of the
///             next), 1 confirmed, 2 delivered (`FleetFeedHealth`)
///   keys      8 words per key: 0 lock (a 32-bit futex word in its first 4 bytes, FleetKeyLock.swift),
///             1 the newest version taken (the origin's), 2 latest version returned, 3 latest returned
///             at, 4 latest was a removal, 5 previous version, 6 previous returned at, 7 the record's
///             sequence (odd while a write changes words 2-6: a reader retries, see `truth`)
///   probes    (1 + workers) words per probe: 0 the write returned at, 1 + w dropped on worker w
///
/// Writes of one key (sets and removals) hold the key's lock across the system's write, so versions
/// reach the system in version order and "latest" is what a coherent reader must see. A load on a miss
/// does not: it reads the origin (word 1) and its system stores the value when the load returns, as
/// services load: a write that lands between the load's origin read and its store may be overwritten by
/// the load's older value unless the system prevents it, and the judge counts the reads of that value as
/// stale once the bound has passed, in every system alike.
/// Instants are CLOCK_MONOTONIC nanoseconds: one clock for every process on the machine.
final class FleetShared: @unchecked Sendable {
    // @unchecked Sendable invariant: `base` maps `size` bytes shared with the other processes for the
    // object's lifetime; every access goes through atomics on 8-byte aligned words (a key's lock: its
    // futex word, FleetKeyLock.swift).
    let keys: Int
    let probes: Int
    let workers: Int
    private let base: UnsafeMutableRawPointer
    private let size: Int

    static let controlWords = 16
    static let statusWords = 16
    static let keyWords = 8

    static func size(keys: Int, probes: Int, workers: Int) -> Int {
        8 * (controlWords + statusWords * workers + keyWords * keys + (1 + workers) * probes)
    }

    /// Maps `path` (created with `create`, sized and zeroed).
    init(path: String, keys: Int, probes: Int, workers: Int, create: Bool) throws {
        (self.keys, self.probes, self.workers) = (keys, probes, workers)
        size = Self.size(keys: keys, probes: probes, workers: workers)
        let fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0o600)
        guard fd >= 0 else { throw BenchError("cannot open \(path): errno \(errno)") }
        defer { close(fd) }
        if create, ftruncate(fd, off_t(size)) != 0 { throw BenchError("cannot size \(path): errno \(errno)") }
        guard let mapped = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), mapped != MAP_FAILED else {
            throw BenchError("cannot map \(path): errno \(errno)")
        }
        base = mapped
    }

    deinit { munmap(base, size) }

    /// The atomic word at index `word` (in bounds by construction of every caller's index).
    private func cell(_ word: Int) -> UnsafeMutablePointer<Atomic<Int64>> {
        (base + 8 * word).assumingMemoryBound(to: Atomic<Int64>.self)
    }

    func load(_ word: Int) -> Int64 { cell(word).pointee.load(ordering: .acquiring) }
    func store(_ word: Int, _ value: Int64) { cell(word).pointee.store(value, ordering: .releasing) }
    func add(_ word: Int, _ value: Int64) -> Int64 { cell(word).pointee.add(value, ordering: .acquiringAndReleasing).oldValue }

    // Control.
    var readyWord: Int { 0 }
    var startWord: Int { 1 }
    var endWord: Int { 2 }
    var stopWord: Int { 3 }
    /// Word 4 counts the single-flight phase's loader runs; word 5 is the warm-up's start (set last).
    var warmupWord: Int { 5 }
    /// When the fault run paused Redis (SIGSTOP) and resumed it; 0 = not (yet).
    var pauseBeganWord: Int { 6 }
    var pauseEndedWord: Int { 7 }
    /// When the fault run killed Redis and when the restarted server was up; 0 = not (yet).
    var downBeganWord: Int { 8 }
    var downEndedWord: Int { 9 }
    /// When the fault run killed every subscriber connection (`CLIENT KILL TYPE pubsub`); 0 = not (yet).
    var pubsubKilledWord: Int { 10 }
    /// When the fault run made Redis evict (a small `maxmemory`) and when it set it back; 0 = not (yet).
    var evictBeganWord: Int { 11 }
    var evictEndedWord: Int { 12 }

    /// Whether `from...to` overlaps the window the words `began` and `ended` mark (one that has begun
    /// and not yet ended reaches to now).
    private func overlaps(_ from: Int64, _ to: Int64, began: Int, ended: Int) -> Bool {
        let start = load(began)
        guard start != 0, to >= start else { return false }
        let end = load(ended)
        return end == 0 || from <= end
    }

    /// Whether an operation from `from` to `to` overlapped the SIGSTOP window (the pause rows).
    func overlapsPause(_ from: Int64, _ to: Int64) -> Bool {
        overlaps(from, to, began: pauseBeganWord, ended: pauseEndedWord)
    }

    /// Whether an operation from `from` to `to` overlapped the time Redis was killed (neither paused nor
    /// running: left out of the pause rows' two columns).
    func overlapsDown(_ from: Int64, _ to: Int64) -> Bool {
        overlaps(from, to, began: downBeganWord, ended: downEndedWord)
    }
    /// Whether an operation from `from` to `to` overlapped any fault: Redis killed or paused, or the
    /// `FaultTimeline.grace` after the subscriber connections were killed (the own-write probes leave
    /// those out).
    func overlapsFault(_ from: Int64, _ to: Int64) -> Bool {
        if overlapsPause(from, to) || overlapsDown(from, to) { return true }
        let killed = load(pubsubKilledWord)
        return killed != 0 && to >= killed && from <= killed + FaultTimeline.grace
    }

    /// The fault windows `instant` falls in, each from the fault's start to `FaultTimeline.grace` after
    /// its end (one that has begun and not yet ended reaches to now): exact when asked at `instant`,
    /// as a fault's start and end are stored when they happen.
    func faultWindows(at instant: Int64) -> FaultWindows {
        func covers(_ began: Int64, _ ended: Int64) -> Bool {
            began != 0 && instant >= began && (ended == 0 || instant <= ended + FaultTimeline.grace)
        }
        var windows: FaultWindows = []
        let killed = load(pubsubKilledWord)
        if covers(killed, killed) { windows.insert(.subscribersKilled) }
        if covers(load(downBeganWord), load(downEndedWord)) { windows.insert(.redisKilled) }
        if covers(load(pauseBeganWord), load(pauseEndedWord)) { windows.insert(.redisPaused) }
        if covers(load(evictBeganWord), load(evictEndedWord)) { windows.insert(.redisEvicting) }
        return windows
    }

    func statusWord(worker: Int) -> Int { Self.controlWords + Self.statusWords * worker }

    // Keys.
    private func keyWord(_ key: Int, _ field: Int) -> Int {
        Self.controlWords + Self.statusWords * workers + Self.keyWords * key + field
    }

    /// How long a caller waits for a key's lock before its worker gives up (exits with an error): a
    /// holder keeps it for one write (a command timeout at most) and the origin's work, never seconds.
    static let lockPatience: Int64 = 30_000_000_000

    /// The key's lock (FleetKeyLock.swift): a futex word in the first half of the key's word 0.
    func keyLock(_ key: Int) -> FleetKeyLock { FleetKeyLock(address: base + 8 * keyWord(key, 0)) }

    /// Ends the worker when a key's lock was not free for `lockPatience` (its holder died or hangs): the
    /// parent reports the failed worker with its log instead of waiting forever.
    static func abandon(_ key: Int) -> Never {
        let seconds = lockPatience / 1_000_000_000
        FileHandle.standardError.write(Data("fleet worker: key \(key)'s lock not free for \(seconds) s\n".utf8))
        exit(3)
    }

    /// A new version of `key` (the caller holds its lock).
    func nextVersion(_ key: Int) -> Int64 { add(keyWord(key, 1), 1) + 1 }

    /// Records that the write of `version` returned at `now` (the caller holds the key's lock, so writes
    /// of one key never overlap). A seqlock: word 7 is odd while words 2-6 change, so that `truth` never
    /// pairs one write's version with another's instant. (Read field by field, a reader between the
    /// version's store and its instant's saw the new version with the old one's return instant, and
    /// judged a read of the old version replaced when the old version was itself written: counted stale
    /// beyond the bound when the writer was descheduled there for as long as the bound, possible on a
    /// loaded 2-core machine, and the likely cause of the one such read `BenchFleetTests` counted once
    /// inside a pause window, docs/lab-notes/testing.md.) `midway`, for tests, runs between the fields' stores.
    func recordWrite(_ key: Int, version: Int64, removal: Bool, now: Int64, midway: (() -> Void)? = nil) {
        let sequence = keyWord(key, 7)
        let begun = load(sequence) + 1
        store(sequence, begun)
        atomicMemoryFence(ordering: .releasing)  // the odd sequence is seen before any field changes
        store(keyWord(key, 5), load(keyWord(key, 2)))
        store(keyWord(key, 6), load(keyWord(key, 3)))
        store(keyWord(key, 2), version)
        midway?()
        store(keyWord(key, 3), now)
        store(keyWord(key, 4), removal ? 1 : 0)
        store(sequence, begun + 1)  // releasing: the fields are seen before the even sequence
    }

    struct Truth {
        var latest: Int64
        var latestAt: Int64
        var removal: Bool
        var previous: Int64
        var previousAt: Int64
    }

    /// The key's latest and previous writes as one write left them, or nil when a write was changing them
    /// through all of `attempts` reads (its writer descheduled midway): the caller then judges nothing.
    func truth(_ key: Int, attempts: Int = 64) -> Truth? {
        let sequence = keyWord(key, 7)
        for attempt in 0..<attempts {
            let before = load(sequence)  // acquiring: the fields are read after it
            if before & 1 == 0 {
                let truth = Truth(
                    latest: load(keyWord(key, 2)), latestAt: load(keyWord(key, 3)), removal: load(keyWord(key, 4)) != 0,
                    previous: load(keyWord(key, 5)), previousAt: load(keyWord(key, 6)))
                atomicMemoryFence(ordering: .acquiring)  // the fields are read before the sequence again
                if load(sequence) == before { return truth }
            }
            if attempt >= 8 { sched_yield() }
        }
        return nil
    }

    /// The key's latest version (one word: never torn).
    func latestVersion(_ key: Int) -> Int64 { load(keyWord(key, 2)) }

    /// The newest version a write of the key has taken (`nextVersion`), returned or not: the origin's
    /// version of the key (a service commits to its database before it writes the cache).
    func committedVersion(_ key: Int) -> Int64 { load(keyWord(key, 1)) }

    // Probes.
    func probeWord(_ probe: Int, _ field: Int) -> Int {
        Self.controlWords + Self.statusWords * workers + Self.keyWords * keys + (1 + workers) * probe + field
    }
}

/// The monotonic clock every fleet process shares, in ns.
func monotonicNanoseconds() -> Int64 { Int64(nowNanoseconds()) }

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A log-linear histogram (32 sub-buckets per power of two, about 3 % resolution) that merges across
/// processes: counts travel as an array.
struct LogHistogram: Sendable {
    var counts = [Int](repeating: 0, count: 64 + 58 * 32)

    static func index(_ value: Int64) -> Int {
        let v = UInt64(max(0, value))
        if v < 64 { return Int(v) }
        let msb = 63 - v.leadingZeroBitCount
        let shift = msb - 5
        return shift * 32 + Int(v >> UInt64(shift))
    }

    static func value(at index: Int) -> Int64 {
        if index < 64 { return Int64(index) }
        let shift = index / 32 - 1
        let mantissa = index - shift * 32
        return Int64(mantissa) << Int64(shift)
    }

    mutating func record(_ value: Int64) { counts[min(Self.index(value), counts.count - 1)] += 1 }

    mutating func merge(_ other: [Int]) {
        for (i, c) in other.enumerated() where i < counts.count { counts[i] += c }
    }

    var total: Int { counts.reduce(0, +) }

    /// The mean, each value taken as the middle of its bucket (within the buckets' 3 %); 0 when empty.
    var mean: Double {
        let total = total
        guard total > 0 else { return 0 }
        var sum = 0.0
        for (index, count) in counts.enumerated() where count > 0 {
            let low = Double(Self.value(at: index))
            let high = index + 1 < counts.count ? Double(Self.value(at: index + 1)) : low
            sum += Double(count) * (low + high) / 2
        }
        return sum / Double(total)
    }

    /// The p-th percentile (`percentileRank`) as its bucket's value; 0 when empty.
    func percentile(_ p: Double) -> UInt64 {
        let rank = percentileRank(p, count: total)
        var seen = 0
        let bucket = counts.firstIndex { seen += $0; return seen >= rank } ?? counts.count - 1
        return UInt64(Self.value(at: bucket))
    }

    var percentiles: Percentiles {
        Percentiles(max: UInt64(counts.lastIndex { $0 > 0 }.map { Self.value(at: $0) } ?? 0)) { percentile($0) }
    }
}

/// The fault windows an instant falls in (`FleetShared.faultWindows(at:)`).
struct FaultWindows: OptionSet {
    let rawValue: Int
    static let subscribersKilled = FaultWindows(rawValue: 1)
    static let redisKilled = FaultWindows(rawValue: 2)
    static let redisPaused = FaultWindows(rawValue: 4)
    /// Redis running but evicting: not an outage (its stale reads count in `stale_reads_beyond_bound`).
    static let redisEvicting = FaultWindows(rawValue: 8)
    /// Redis killed or paused: what `stale_reads_beyond_bound` leaves out.
    static let outage: FaultWindows = [.redisKilled, .redisPaused]
}
