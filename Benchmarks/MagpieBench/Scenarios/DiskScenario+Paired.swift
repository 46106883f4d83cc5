import Foundation
import Histogram
import Magpie

// Gets in alternation (`--workloads paired`, not run by default): the get phase of `plain`, with every
// system loaded at once and sampled in turns, beside the `ZSTD_decompressDCtx` floor.
//
// Why: on these VMs the same code's speed changes by a third or more between runs seconds apart, while
// `plain` measures each system's gets in its own phase. Here each round gives every participant a turn of
// `--paired-block` operations (the systems get the same keys in a round; the order is drawn anew each round,
// so that no participant always follows the same one), so every p50 comes from the same minutes, and each
// round compares Magpie with the others on that round's figures alone. The issue #29 get bars are read
// both ways; `plain`'s stay as they are. Figures: docs/lab-notes/disk.md (every system sampled in turns)
// and BENCHMARKS.md (when a run includes the paired workload).
//
// Turns are long by default (20,000 operations: tens of milliseconds, far shorter than the machine's
// swings): a system's first operations after another's turn find the CPU's caches holding the other's data,
// and shorter turns would measure that more than the system.
//
// Each system stores every key first (untimed, in order, as `plain`'s set phase), nothing flushed after,
// also as in `plain`; then one turn each that is not recorded (background work after the loads settles, the
// caches fill), then the rounds. Every value read is checked against its digest outside the timed call.

extension DiskScenario {
    /// The systems the paired workload can load (file-per-key and URLCache are too slow to fill).
    static let pairedSystems = ["magpie", "rocksdb", "lmdb", "sqlite"]

    /// One `disk-paired-get` row per system and two `disk-paired-floor` rows (`zstd-decompress-<size>`, the
    /// bar's, and `zstd-decompress-<size>-cold`).
    func measurePaired(root: String, values: DiskValues, progress: (String) -> Void) throws -> [BenchResult] {
        let names = options.systems.filter { Self.pairedSystems.contains($0) }
        guard !names.isEmpty else { return [] }
        let keys = options.keys
        let block = options.pairedBlock
        let rounds = options.pairedRounds
        let keyNames = (0..<keys).map { values.key($0) }
        let digest = KeyHash(seed: 0)
        var digests = [UInt64](repeating: 0, count: keys)
        for i in 0..<keys { digests[i] = digest.hash(values.value(i)) }

        var systems: [any DiskSystem] = []
        defer { for system in systems { system.close() } }
        for name in names {
            progress("disk: paired gets, loading \(name)")
            let system = try open(name, root + "/paired-" + name, budget: options.effectiveBudget)
            systems.append(system)
            var failures = 0
            for i in 0..<keys where !system.set(values.value(i), key: keyNames[i]) { failures += 1 }
            if failures > 0 { throw PeerError(system: name, message: "\(failures) of \(keys) stores failed while loading") }
        }

        // The floors: the `disk-floor` row's work (ZstdFloorFrames, Peers/DiskFloors.swift), sampled in their
        // turns like the systems. The hot floor's area holds each of its 256 frames once (in the CPU's caches
        // after its first turn); the cold floor's (informative) repeats them over 1 GiB, more than this VM
        // reports for its caches (300 MiB of L3), so that most of its samples read their frame from memory,
        // as a get reads its record. The bar's floor is the hot one.
        let hot = try ZstdFloorFrames(values: values, blockSize: options.valueSize, areaBytes: nil)
        let cold = try ZstdFloorFrames(values: values, blockSize: options.valueSize, areaBytes: 1 << 30)

        progress("disk: paired gets, \(rounds) rounds of \(block) per system and floor")
        let hotFloor = systems.count
        let coldFloor = systems.count + 1
        let participants = systems.count + 2  // the floors last
        var text = [PairedSamples](repeating: PairedSamples(), count: participants)
        var random = text
        var all = [Histogram<UInt64>](repeating: latencyHistogram(), count: participants)
        var (hits, wrong) = ([Int](repeating: 0, count: participants), [Int](repeating: 0, count: participants))
        var nanoseconds = [UInt64](repeating: 0, count: participants)
        var frameState = options.seed ^ 0x2575
        var orderState = options.seed ^ 0x0BDE
        var order = Array(0..<participants)
        var roundText = [[UInt64]](repeating: [], count: participants)
        var roundRandom = roundText
        // Round -1 is the turns that are not recorded.
        for round in -1..<rounds {
            // A new order each round (seeded Fisher-Yates).
            for index in stride(from: participants - 1, to: 0, by: -1) {
                orderState = splitmix64(orderState)
                order.swapAt(index, Int(orderState % UInt64(index + 1)))
            }
            for p in order {
                roundText[p].removeAll(keepingCapacity: true)
                roundRandom[p].removeAll(keepingCapacity: true)
                var turnNanoseconds: UInt64 = 0
                var turnHits = 0
                var turnWrong = 0
                if p >= hotFloor {
                    let floor = p == hotFloor ? hot : cold
                    for _ in 0..<block {
                        frameState = splitmix64(frameState)
                        let elapsed = try floor.decompress(Int(frameState % UInt64(floor.slots)))
                        turnNanoseconds += elapsed
                        roundText[p].append(elapsed)
                        turnHits += 1
                    }
                } else {
                    // The same keys for every system in a round.
                    var state = options.seed ^ 0xA1E5 &+ UInt64(bitPattern: Int64(round)) &* 0x9E37_79B9
                    let system = systems[p]
                    for _ in 0..<block {
                        state = splitmix64(state)
                        let i = Int(state % UInt64(keys))
                        let start = nowNanoseconds()
                        let got = system.get(keyNames[i])
                        let elapsed = nowNanoseconds() - start
                        turnNanoseconds += elapsed
                        guard let got else { continue }
                        turnHits += 1
                        if i % 2 == 0 { roundText[p].append(elapsed) } else { roundRandom[p].append(elapsed) }
                        if digest.hash(got) != digests[i] { turnWrong += 1 }
                    }
                }
                // Wrong values count in the warm-up turns too; nothing else does.
                wrong[p] += turnWrong
                guard round >= 0 else { continue }
                nanoseconds[p] += turnNanoseconds
                hits[p] += turnHits
                text[p].add(round: roundText[p])
                random[p].add(round: roundRandom[p])
                for sample in roundText[p] { _ = all[p].record(sample) }
                for sample in roundRandom[p] { _ = all[p].record(sample) }
            }
        }

        // Per round: Magpie's p50 against each other system's (raw hits) and against each floor + 0.8 µs
        // (compressible hits), each on that round's samples alone.
        let magpie = names.firstIndex(of: "magpie")
        let label = DiskFloors.label(options.valueSize)
        var results: [BenchResult] = []
        for p in 0..<participants {
            let isFloor = p >= hotFloor
            let operations = rounds * block
            var extra: [String: JSONValue] = ["rounds": .int(rounds), "block": .int(block)]
            if isFloor {
                extra["round_p50_ns"] = .array(text[p].roundP50s.map { .int(Int($0)) })
                let frames = p == hotFloor ? "256 frames, hot in the CPU's caches" : "copies of those frames over 1 GiB (most read from memory)"
                extra["what"] = .string("ZSTD_decompressDCtx (reused context) of the workload's JSON values, level 1, into a reused buffer: \(frames); in turns with the systems' gets")
            } else {
                extra["configuration"] = .string(systems[p].configuration)
                let mappings = hugePageMappings(under: root + "/paired-" + names[p])
                extra["mapped_resident_bytes"] = .int(mappings.resident)
                extra["huge_page_mapped_bytes"] = .int(mappings.pmdMapped)
                extra["get_text_hit_latency_ns"] = text[p].percentiles.json
                extra["get_random_hit_latency_ns"] = random[p].percentiles.json
                extra["round_raw_p50_ns"] = .array(random[p].roundP50s.map { .int(Int($0)) })
                extra["round_text_p50_ns"] = .array(text[p].roundP50s.map { .int(Int($0)) })
                extra["wrong_values"] = .int(wrong[p])
            }
            if let magpie, p == magpie {
                // {"rounds": in how many rounds Magpie's p50 was at most the other's (+ 0.8 µs for the floor),
                // "of": rounds in which both had samples}.
                func tally(_ a: PairedSamples, _ b: PairedSamples, plus: UInt64) -> JSONValue {
                    .object(["rounds": .int(PairedSamples.rounds(a, atMost: b, plus: plus)), "of": .int(PairedSamples.comparable(a, b))])
                }
                for (q, name) in names.enumerated() where q != magpie {
                    extra["raw_p50_at_most_\(name)"] = tally(random[p], random[q], plus: 0)
                }
                extra["text_p50_at_most_floor_plus_800ns"] = tally(text[p], text[hotFloor], plus: 800)
                extra["text_p50_at_most_cold_floor_plus_800ns"] = tally(text[p], text[coldFloor], plus: 800)
            }
            results.append(
                BenchResult(
                    scenario: isFloor ? "disk-paired-floor" : "disk-paired-get",
                    system: p == hotFloor ? "zstd-decompress-\(label)" : p == coldFloor ? "zstd-decompress-\(label)-cold" : names[p],
                    threads: 1, operations: operations, seconds: Double(nanoseconds[p]) / 1e9,
                    ops_per_sec: nanoseconds[p] == 0 ? 0 : Double(operations) * 1e9 / Double(nanoseconds[p]),
                    latency_ns: Percentiles(all[p]), hit_ratio: Double(hits[p]) / Double(max(operations, 1)), extra: extra))
        }
        return results
    }
}
/// One participant's samples of one kind (raw hits, compressible hits, or floor samples): all of them,
/// and each round's p50 (nil for a round without a sample).
struct PairedSamples {
    private var histogram = latencyHistogram()
    private(set) var roundMedians: [UInt64?] = []

    /// Adds one round's samples (in any order).
    mutating func add(round samples: [UInt64]) {
        for sample in samples { _ = histogram.record(sample) }
        // The lower median of an even count, as HdrHistogram's p50 reports.
        roundMedians.append(percentile(50, of: samples))
    }

    var percentiles: Percentiles { Percentiles(histogram) }

    /// Each round's p50, rounds without a sample left out.
    var roundP50s: [UInt64] { roundMedians.compactMap { $0 } }

    /// In how many rounds `a`'s p50 was at most `b`'s + `plus` ns (rounds where either had no sample left out).
    static func rounds(_ a: PairedSamples, atMost b: PairedSamples, plus: UInt64) -> Int {
        zip(a.roundMedians, b.roundMedians).reduce(0) { count, pair in
            guard let x = pair.0, let y = pair.1 else { return count }
            return count + (x <= y + plus ? 1 : 0)
        }
    }

    /// Rounds in which both had a sample.
    static func comparable(_ a: PairedSamples, _ b: PairedSamples) -> Int {
        zip(a.roundMedians, b.roundMedians).reduce(0) { $0 + ($1.0 != nil && $1.1 != nil ? 1 : 0) }
    }
}
