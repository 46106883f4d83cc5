import CXXHash
import CZstd
import Foundation
import Histogram

/// The floors of a disk get (the `disk-floor` rows: a peer that does only the unavoidable work), measured in the same run as the systems, each timed one sample at a time
/// exactly as the gets are (so the timer's own cost is in both):
///
/// - `pread-4k`: one `pread` of a block from a page-cache-hot file into a reused buffer;
/// - `mmap-copy-4k`: a block copied out of a populated shared mapping of that file into a new
///   `[UInt8]` (what every system's get returns; `extra.memcpy_only_ns` is the copy into a reused
///   buffer alone);
/// - `zstd-decompress-4k`: `ZSTD_decompressDCtx` with one reused context into a reused buffer, over the
///   JSON values of the workload compressed at level 1 (the blocks Magpie stores compressed);
///   `extra.zstd_decompress_p50_ns` is the plain `ZSTD_decompress` (a context per call);
/// - `xxh3-4k`: XXH3-64 of a hot block (the run-time-dispatched entry Magpie uses for records).
///
/// Blocks are drawn uniformly from a 64 MiB file (16,384 blocks of 4 KiB), written and read once first.
struct DiskFloors {
    let directory: String
    let samples: Int
    let seed: UInt64
    var blockSize = 4096
    var blocks = 16_384

    private var label: String { Self.label(blockSize) }

    /// How rows name a block of `size` bytes: `4k`, `512b`.
    static func label(_ size: Int) -> String { size % 1024 == 0 ? "\(size / 1024)k" : "\(size)b" }

    func measure(values: DiskValues) throws -> [BenchResult] {
        let path = directory + "/floor-\(getpid()).data"
        defer { unlink(path) }
        let fileBytes = blockSize * blocks
        // The file: the workload's values back to back (JSON and random, as the systems store them).
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw PeerError(system: "floor", message: "open \(path): errno \(errno)") }
        defer { Glibc.close(fd) }
        var offset = 0
        var n = 0
        while offset < fileBytes {
            let value = values.value(n)
            let count = min(value.count, fileBytes - offset)
            guard count > 0 else { break }
            let written = value.withUnsafeBytes { pwrite(fd, $0.baseAddress, count, off_t(offset)) }
            guard written == count else { throw PeerError(system: "floor", message: "pwrite: errno \(errno)") }
            offset += count
            n += 1
        }
        if offset < fileBytes { _ = ftruncate(fd, off_t(fileBytes)) }
        // The floors are measured page-cache hot: one read of the whole file first.
        // Invariants of the pointer code below: `buffer` holds at least one block (and 1 MiB, the warm-up
        // read's size), lives until this function returns, and every write into it (pread, memcpy, zstd's
        // output bounded by `buffer.count`) stays within it; every block offset `nextBlock()` returns is
        // a multiple of `blockSize` below `fileBytes`, so `map + at ..< map + at + blockSize` lies inside
        // the mapping, which covers the whole file until the `munmap` at the end.
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(blockSize, 1 << 20), alignment: 4096)
        defer { buffer.deallocate() }
        for start in stride(from: 0, to: fileBytes, by: buffer.count) { _ = pread(fd, buffer.baseAddress, buffer.count, off_t(start)) }

        var state = seed ^ 0xF100
        func nextBlock() -> Int {
            state = splitmix64(state)
            return Int(state % UInt64(blocks)) * blockSize
        }
        var results: [BenchResult] = []

        // pread into a reused buffer.
        var latency = latencyHistogram()
        for _ in 0..<samples {
            let at = nextBlock()
            let start = nowNanoseconds()
            let got = pread(fd, buffer.baseAddress, blockSize, off_t(at))
            _ = latency.record(nowNanoseconds() - start)
            guard got == blockSize else { throw PeerError(system: "floor", message: "pread: \(got)") }
        }
        results.append(row("pread-\(label)", latency, ["what": .string("pread of \(blockSize) B from a hot 64 MiB file")]))

        // A copy out of a populated mapping, into a new array (and into a reused buffer).
        guard let map = mmap(nil, fileBytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0), map != MAP_FAILED else {
            throw PeerError(system: "floor", message: "mmap: errno \(errno)")
        }
        // The mapping covers the whole file, which stays its size until `munmap` below; blocks are inside it.
        defer { munmap(map, fileBytes) }
        latency = latencyHistogram()
        var memcpyOnly = latencyHistogram()
        var sink: UInt8 = 0
        for _ in 0..<samples {
            let at = nextBlock()
            let start = nowNanoseconds()
            let copy = [UInt8](UnsafeRawBufferPointer(start: map + at, count: blockSize))
            _ = latency.record(nowNanoseconds() - start)
            sink ^= copy[copy.count / 2]
            let other = nextBlock()
            let copyStart = nowNanoseconds()
            buffer.baseAddress!.copyMemory(from: map + other, byteCount: blockSize)
            _ = memcpyOnly.record(nowNanoseconds() - copyStart)
            sink ^= buffer[blockSize / 2]
        }
        results.append(
            row(
                "mmap-copy-\(label)", latency,
                [
                    "what": .string("\(blockSize) B copied out of a MAP_POPULATE'd shared mapping into a new [UInt8]"),
                    "memcpy_only_ns": Percentiles(memcpyOnly).json, "sink": .int(Int(sink)),
                ]))

        // ZSTD_decompress of the workload's JSON blocks, compressed at level 1.
        results.append(try zstdFloor(values: values))

        // XXH3 of a hot block, through the entry Magpie's records use on this CPU.
        let dispatch = magpie_xxh3_dispatch_wanted()
        latency = latencyHistogram()
        var hashes: UInt64 = 0
        for _ in 0..<samples {
            let at = nextBlock()
            let start = nowNanoseconds()
            let hash = magpie_xxh3_64_long(map + at, blockSize, 0, dispatch)
            _ = latency.record(nowNanoseconds() - start)
            hashes ^= hash
        }
        results.append(row("xxh3-\(label)", latency, ["what": .string("XXH3-64 of \(blockSize) B, hot, \(dispatch != 0 ? "dispatched" : "plain entry")"), "sink": .int(Int(hashes & 0xFFFF))]))
        return results
    }

    private func zstdFloor(values: DiskValues) throws -> BenchResult {
        let floor = try ZstdFloorFrames(values: values, blockSize: blockSize, areaBytes: nil)
        var latency = latencyHistogram()
        var plain = latencyHistogram()
        var state = seed ^ 0x2575
        for n in 0..<samples {
            state = splitmix64(state)
            let slot = Int(state % UInt64(floor.slots))
            _ = latency.record(try floor.decompress(slot))
            // The plain entry point (a context per call), on a quarter of the samples.
            if n % 4 == 0 { _ = plain.record(floor.decompressWithoutContext(slot)) }
        }
        return row(
            "zstd-decompress-\(label)", latency,
            [
                "what": .string("ZSTD_decompressDCtx (reused context) of the workload's JSON values, level 1, into a reused buffer"),
                "zstd_decompress_p50_ns": .int(Int(Percentiles(plain).p50)), "compression_ratio": .double(floor.compressionRatio),
            ])
    }

    private func row(_ system: String, _ latency: Histogram<UInt64>, _ extra: [String: JSONValue]) -> BenchResult {
        let percentiles = Percentiles(latency)
        let seconds = Double(percentiles.p50) * Double(samples) / 1e9
        var extra = extra
        extra["block_bytes"] = .int(blockSize)
        extra["mean_ns"] = .double(latency.mean)
        return BenchResult(
            scenario: "disk-floor", system: system, threads: 1, operations: samples, seconds: seconds,
            ops_per_sec: percentiles.p50 == 0 ? 0 : 1e9 / Double(percentiles.p50), latency_ns: percentiles, hit_ratio: 1,
            extra: extra)
    }
}

/// The zstd floor's frames and the timed decompression of one of them: 256 JSON values (even keys) of
/// `blockSize`, each compressed at level 1 on its own, laid out one per slot in an area of their own, and
/// decompressed with one reused context into a reused buffer. With `areaBytes`, the area repeats the frames
/// over that many bytes, so that a sample reads its frame from memory rather than from the CPU's caches
/// (the paired workload's cold floor, DiskScenario+Paired.swift).
final class ZstdFloorFrames {
    /// Slots in the area (256, or as many as `areaBytes` holds).
    let slots: Int
    /// The frames' original bytes over their compressed bytes.
    let compressionRatio: Double
    private let lengths: [Int]
    private let slotBytes: Int
    private let context: OpaquePointer
    // Invariants: `area` holds `slots` slots of `slotBytes` bytes, slot `j` beginning with the frame of
    // `lengths[j % lengths.count]` bytes (no longer than a slot); `output` holds `blockSize` bytes (at least 1),
    // and ZSTD_decompressDCtx writes at most `output.count` bytes into it. Both live until deinit.
    private let area: UnsafeMutableRawBufferPointer
    private let output: UnsafeMutableRawBufferPointer

    init(values: DiskValues, blockSize: Int, areaBytes: Int?) throws {
        var frames: [[UInt8]] = []
        var original = 0
        for i in stride(from: 0, to: 512, by: 2) {
            let value = values.value(i).prefix(blockSize)
            var frame = [UInt8](repeating: 0, count: ZSTD_compressBound(value.count))
            let size = value.withUnsafeBytes { v in
                frame.withUnsafeMutableBytes { f in ZSTD_compress(f.baseAddress, f.count, v.baseAddress, v.count, 1) }
            }
            guard ZSTD_isError(size) == 0 else { throw PeerError(system: "floor", message: "ZSTD_compress failed") }
            frames.append(Array(frame.prefix(size)))
            original += value.count
        }
        guard let context = ZSTD_createDCtx() else { throw PeerError(system: "floor", message: "ZSTD_createDCtx") }
        self.context = context
        lengths = frames.map(\.count)
        compressionRatio = Double(original) / Double(lengths.reduce(0, +))
        slotBytes = ((lengths.max() ?? 0) + 63) / 64 * 64
        slots = max(frames.count, (areaBytes ?? 0) / max(slotBytes, 1))
        let (slots, slotBytes) = (self.slots, self.slotBytes)
        let area = UnsafeMutableRawBufferPointer.allocate(byteCount: slots * slotBytes, alignment: 4096)
        for j in 0..<slots {
            frames[j % frames.count].withUnsafeBytes { (area.baseAddress! + j * slotBytes).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        }
        self.area = area
        output = UnsafeMutableRawBufferPointer.allocate(byteCount: max(blockSize, 1), alignment: 64)
    }

    deinit {
        ZSTD_freeDCtx(context)
        area.deallocate()
        output.deallocate()
    }

    /// Decompresses slot `slot` (below `slots`) with the reused context; the nanoseconds it took.
    func decompress(_ slot: Int) throws -> UInt64 {
        let source = area.baseAddress! + slot * slotBytes
        let start = nowNanoseconds()
        let size = ZSTD_decompressDCtx(context, output.baseAddress, output.count, source, lengths[slot % lengths.count])
        let elapsed = nowNanoseconds() - start
        guard ZSTD_isError(size) == 0 else { throw PeerError(system: "floor", message: "ZSTD_decompressDCtx failed") }
        return elapsed
    }

    /// The same through the plain entry point (a context per call); the nanoseconds it took.
    func decompressWithoutContext(_ slot: Int) -> UInt64 {
        let source = area.baseAddress! + slot * slotBytes
        let start = nowNanoseconds()
        _ = ZSTD_decompress(output.baseAddress, output.count, source, lengths[slot % lengths.count])
        return nowNanoseconds() - start
    }
}
