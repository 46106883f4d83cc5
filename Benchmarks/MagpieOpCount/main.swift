// magpie-opcount: a small, synchronous driver over the public `Cache` API for counting instructions per
// operation with callgrind (Benchmarks/opcount.sh), which is deterministic where timings on our VMs
// swing by ±30 %. Synchronous on purpose: valgrind 3.19 crashes on Swift's async main.
//
//   magpie-opcount <operation> <count>
//     memory-hit  read a 4 KiB value from memory                  (1,000 keys, cycled)
//     memory-lookup  the same through `lookup` (value and tier)    (1,000 keys, cycled)
//     disk-hit    read a 4 KiB noise value stored disk-only (raw)   (1,000 keys, cycled)
//     disk-hit-zstd  read a 4 KiB JSON-like value stored disk-only (zstd) (1,000 keys, cycled)
//     store       overwrite a 4 KiB noise value in both tiers (raw) (1,000 keys, cycled)
//     promote     read a key that is on disk only, promoting it     (`count` keys, each read once)
//     aside       a memory-only cache, 1 MiB: cache-aside over 50,000 keys (a miss, then a 100-byte store
//                 that evicts)                                      (50,000 keys, cycled)
//     cycle       reads cycling over 1,000 keys with a 1 MiB memory tier: mostly disk hits whose
//                 promotion evicts, as in the tiered scenario       (1,000 keys, cycled)
//     loader-hit  the loader API (`loadValue`, synchronous) on a fresh 4 KiB value stored with a fresh
//                 lifetime, as `magpie-bench loader`'s magpie-swr  (1,000 keys, cycled)
//     loader-stale  the same on stale values whose background refresh is running (its loader never
//                 returns): stale-while-revalidate's common case   (1,000 keys, cycled)
// Only `measuredLoop` is counted (callgrind --toggle-collect), so setup does not enter the figures;
// instructions per operation = the difference of two runs with different counts over the difference.
import Dispatch
import Glibc
import Magpie

/// What `loader-stale`'s refreshes wait on: never signalled, so each key's refresh stays running.
let never = DispatchSemaphore(value: 0)

func noise(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed
    return (0..<count).map { _ in
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return UInt8(truncatingIfNeeded: state >> 56)
    }
}

/// A 4 KiB JSON-like text that zstd compresses about 3:1, different for every seed.
func jsonLike(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed
    var text = ""
    while text.utf8.count < count {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        text += "{\"id\":\(state >> 40),\"name\":\"user-\(state >> 52)\",\"active\":\(state & 1 == 0),\"tags\":[\"a\",\"b\"]},"
    }
    return Array(text.utf8.prefix(count))
}

func open(_ directory: String, memoryBudget: Int = 1 << 30) -> Cache {
    var configuration = Cache.Configuration(directory: directory, memoryBudget: memoryBudget, diskBudget: 4 << 30)
    configuration.hashSeed = 42
    configuration.metrics = nil
    configuration.diskBufferWriteInterval = nil
    return try! Cache(configuration)
}

@inline(never)
func measuredLoop(_ cache: Cache, _ operation: String, _ count: Int, _ keys: [String], _ value: [UInt8]) -> Int {
    var checksum = 0
    switch operation {
    case "store":
        for i in 0..<count { try! cache.set(value, forKey: keys[i % keys.count]) }
    case "memory-lookup":
        for i in 0..<count { checksum &+= Int(try! cache.lookup(keys[i % keys.count])!.value[7]) }
    case "aside":  // a memory-only cache: a miss, then the store of a 100-byte value (evicting)
        for i in 0..<count {
            let key = keys[i % keys.count]
            if let value = try! cache.value(forKey: key) { checksum &+= Int(value[7]) } else { try! cache.set(value.prefix(100), forKey: key) }
        }
    case "promote":
        for i in 0..<count { checksum &+= Int(try! cache.value(forKey: keys[i])![7]) }
    case "loader-hit":
        let options = EntryOptions.fresh(for: .seconds(3600), staleUntil: .after(.seconds(7200)))
        for i in 0..<count { checksum &+= Int(try! cache.loadValue(forKey: keys[i % keys.count], options: options) { value }[7]) }
    case "loader-stale":
        let options = EntryOptions.fresh(for: .zero, staleUntil: .after(.seconds(7200)))
        for i in 0..<count {
            checksum &+= Int(try! cache.loadValue(forKey: keys[i % keys.count], options: options) { never.wait(); return [] }[7])
        }
    default:  // memory-hit, disk-hit, disk-hit-zstd, cycle
        for i in 0..<count { checksum &+= Int(try! cache.value(forKey: keys[i % keys.count])![7]) }
    }
    return checksum
}

let arguments = CommandLine.arguments
guard arguments.count == 3, let count = Int(arguments[2]), count > 0,
    ["memory-hit", "memory-lookup", "disk-hit", "disk-hit-zstd", "store", "promote", "cycle", "aside", "loader-hit", "loader-stale"]
        .contains(arguments[1])
else {
    print("usage: magpie-opcount memory-hit|memory-lookup|disk-hit|disk-hit-zstd|store|promote|cycle|aside|loader-hit|loader-stale <count>")
    exit(2)
}
let operation = arguments[1]
var template = Array("/dev/shm/magpie-opcount-XXXXXX".utf8CString)
guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else { exit(1) }
let directory = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
let value = operation == "disk-hit-zstd" ? jsonLike(4096, seed: 7) : noise(4096, seed: 7)
let keys = (0..<(operation == "promote" ? count : operation == "aside" ? 50_000 : 1000)).map { "key-\($0)" }
var cache = operation == "aside"
    ? try! Cache(memoryBudget: 1 << 20) : open(directory, memoryBudget: operation == "cycle" ? 1 << 20 : 1 << 30)
let options = operation == "disk-hit" || operation == "disk-hit-zstd" ? EntryOptions(tiers: .diskOnly)
    : operation == "loader-hit" ? EntryOptions.fresh(for: .seconds(3600), staleUntil: .after(.seconds(7200)))
    : operation == "loader-stale" ? EntryOptions.fresh(for: .zero, staleUntil: .after(.seconds(7200))) : nil
if operation != "aside" { for key in keys { try! cache.set(value, forKey: key, options: options) } }
try! cache.flush()  // disk reads come from the files, not from the buckets' write buffers
if operation == "promote" {
    try! cache.close()
    cache = open(directory, memoryBudget: operation == "cycle" ? 1 << 20 : 1 << 30)
}
let checksum = measuredLoop(cache, operation, count, keys, value)
try! cache.close()
_ = system("rm -rf '\(directory)'")
print("\(operation) \(count) checksum \(checksum) promotions \(cache.statistics.promotions)")
