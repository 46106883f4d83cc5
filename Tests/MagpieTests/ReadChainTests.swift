import Foundation
@testable import Magpie
import MagpieTestSupport
import Testing

// The seams of the one read chain (Tiers/Composition.swift): the storage tier that holds nothing stands
// where "no disk" was an optional, and the coherence policy of a remote tier is a policy of the same walk,
// so a cache with one answers as a cache without one wherever no other instance changes a key.

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

@Suite("Read chain: the empty storage tier and the coherence policy", .serialized, .timeLimit(.minutes(2)))
struct ReadChainTests {
    @Test("the storage tier that holds nothing answers absent, removes nothing, never waits")
    func emptyStorageTier() throws {
        let storage: any StorageTier = NoStorage()
        let key = bytes("k")
        try key.withUnsafeBytes { raw in
            let hashed = HashedKey(raw, hasher: KeyHash(seed: 7))
            #expect(try storage.entry(hashed) == nil)
            #expect(try storage.contains(hashed) == false)
            guard case .done(nil) = try storage.entryIfImmediate(hashed) else { Issue.record("an immediate read answered"); return }
            guard case .done(false) = try storage.containsIfImmediate(hashed) else { Issue.record("contains answered"); return }
            try storage.store(raw, for: hashed, expiry: .never, group: "g", placement: EntryMetadata())
            #expect(try storage.entry(hashed) == nil)  // stores nothing
            #expect(try storage.remove(hashed) == false)
        }
        #expect(try storage.removeAll(inGroup: "g") == 0 && storage.removeExpired() == 0)
        #expect(!storage.mayWait && !storage.buffersWrites && storage.indexesLoaded)
        #expect(storage.largestValue == nil && storage.tierStatistics == nil && storage.owedJournal == nil)
        #expect(storage.placing(.diskOnly) == .memoryOnly && storage.placing(.memoryAndDisk) == .memoryOnly)
    }

    @Test("a memory-only cache over the empty tier keeps what a cache without a disk tier kept")
    func memoryOnlyCache() async throws {
        var configuration = Cache.Configuration(memoryBudget: 1 << 20)
        configuration.metrics = nil
        let cache = try Cache(configuration)
        defer { try? cache.close() }
        #expect(cache.disk == nil && cache.statistics.disk == nil)
        #expect(cache.largestStorableValue == cache.largestMemoryValue)
        // An entry asking for disk only is kept in memory, the only tier there is.
        try cache.set(bytes("d"), forKey: "disk-only", options: EntryOptions(group: "g", tiers: .diskOnly))
        #expect(try cache.value(forKey: "disk-only") == bytes("d"))
        let readAsync = try await cache.async.value(forKey: "disk-only")
        #expect(readAsync == bytes("d"))
        #expect(try cache.lookup("disk-only")?.tier == .memory)
        let containedAsync = try await cache.async.contains("disk-only")
        #expect(try cache.contains("disk-only") && containedAsync)
        #expect(try cache.removeAll(inGroup: "g") == RemovedEntries(memory: 1, disk: 0))
        #expect(try cache.value(forKey: "disk-only") == nil)
        #expect(try cache.removeExpired().disk == 0)
        try cache.flush()
        let removedAsync = try await cache.async.removeValue(forKey: "absent")
        #expect(!removedAsync)
    }

    enum Chain: String, CaseIterable, Sendable {
        case memory, memoryAndDisk
    }

    @Test("with and without the coherence policy the chain gives the same answers (one instance, seeded)", arguments: Chain.allCases)
    func sameAnswers(chain: Chain) async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let directories = (TemporaryDirectory("magpie-chain-local"), TemporaryDirectory("magpie-chain-remote"))
        defer { directories.0.cleanup(); directories.1.cleanup() }
        let withDisk = chain == .memoryAndDisk
        var configuration = Cache.Configuration(directory: withDisk ? directories.0.path : nil, memoryBudget: 8 << 20, diskBudget: 64 << 20)
        configuration.metrics = nil
        let local = try Cache(configuration)
        defer { try? local.close() }
        let (coherent, _) = try inMemoryFleetCache(server, directory: withDisk ? directories.1.path : nil, commandTimeout: .seconds(10))
        defer { try? coherent.close() }
        #expect(await settled(coherent))
        #expect(local.composition.coherent == nil && coherent.composition.coherent != nil)

        let seed = UInt64.random(in: 1...UInt64.max)
        var random = SeededGenerator(seed: seed)
        let groups = ["a", "b", nil]
        for step in 0..<1_500 {
            let name = "key:\(Int.random(in: 0..<40, using: &random))"
            let context = "step \(step), \(name), seed \(seed)"
            switch Int.random(in: 0..<12, using: &random) {
            case 0..<3:
                let value = bytes("\(name)/\(step)")
                let tiers: Tiers = [.memoryAndDisk, .memoryOnly, .diskOnly][Int.random(in: 0..<3, using: &random)]
                let options = EntryOptions(group: groups[Int.random(in: 0..<3, using: &random)], tiers: tiers)
                if Bool.random(using: &random) {
                    for cache in [local, coherent] { try cache.set(value, forKey: name, options: options) }
                } else {
                    for cache in [local, coherent] { try await cache.async.set(value, forKey: name, options: options) }
                }
            case 3:
                #expect(try local.removeValue(forKey: name) == coherent.removeValue(forKey: name), "\(context)")
            case 4:
                let group = ["a", "b"][Int.random(in: 0..<2, using: &random)]
                #expect(try local.removeAll(inGroup: group) == coherent.removeAll(inGroup: group), "\(context)")
            case 5:
                #expect(try local.contains(name) == coherent.contains(name), "\(context)")
                let (a, b) = (try await local.async.contains(name), try await coherent.async.contains(name))
                #expect(a == b, "\(context)")
            case 6:
                let (a, b) = (try local.lookup(name), try coherent.lookup(name))
                #expect(a?.value == b?.value && a?.tier == b?.tier, "\(context)")
            case 7:
                let (a, b) = (try await local.async.lookup(name), try await coherent.async.lookup(name))
                #expect(a?.value == b?.value && a?.tier == b?.tier, "\(context)")
            case 8:
                let (a, b) = (try await local.async.value(forKey: name), try await coherent.async.value(forKey: name))
                #expect(a == b, "\(context)")
            case 9:
                #expect(try local.data(forKey: name) == coherent.data(forKey: name), "\(context)")
            default:
                #expect(try local.value(forKey: name) == coherent.value(forKey: name), "\(context)")
            }
        }
        // Every local copy was this instance's own write: none needed the store.
        #expect(coherent.statistics.remote?.readHits == 0)
    }

    @Test("the loader's first probe serves a servable copy with no round trip, and hands one past the floor to the remote tier, read and counted once", arguments: [false, true])
    func loaderProbeJudgesCopies(async: Bool) async throws {
        let server = InMemoryRemoteServer()
        defer { server.stop() }
        let (cache, _) = try inMemoryFleetCache(server, commandTimeout: .seconds(10))
        defer { try? cache.close() }
        #expect(await settled(cache))
        let loads = SharedCount()
        let value = bytes("v1")
        func load() async throws -> [UInt8] {
            if async {
                return try await cache.value(forKey: "k") { loads.add(); return value }
            }
            return try cache.loadValue(forKey: "k") { loads.add(); return value }
        }
        #expect(try await load() == value)  // a miss: the store has nothing, the loader runs
        #expect(loads.value == 1)
        let remote = try #require(cache.statistics.remote)
        let memory = cache.statistics.memory
        for _ in 0..<50 { #expect(try await load() == value) }
        var now = cache.statistics
        #expect(now.remote?.readHits == remote.readHits && now.remote?.readMisses == remote.readMisses)  // no round trip
        #expect(now.memory.hits == memory.hits + 50 && now.freshHits >= 50 && now.remote?.unservedCopies == remote.unservedCopies)
        #expect(loads.value == 1)

        // Every copy stamped until now is a miss: the next call asks the store (which holds the loaded
        // value) once, judging memory's copy once, and keeps the fetched value.
        // (Stamps are in milliseconds, and a copy is servable only when stamped after the floor: the floor
        // goes above the loaded copy's stamp, and the fetch below starts after the floor.)
        let coherence = try #require(cache.composition.coherent?.remote.coherence)
        try await Task.sleep(for: .milliseconds(2))
        coherence.raiseFloor(to: cache.configuration.clock.now())
        try await Task.sleep(for: .milliseconds(2))
        #expect(try await load() == value)
        now = cache.statistics
        #expect(now.remote?.readHits == remote.readHits + 1)
        #expect(now.remote?.unservedCopies == remote.unservedCopies + 1)
        #expect(now.memory.hits == memory.hits + 51)  // the probe's read; the walk did not read memory again
        #expect(loads.value == 1)
        // Kept: served from memory again.
        #expect(try await load() == value)
        #expect(cache.statistics.remote?.readHits == remote.readHits + 1 && loads.value == 1)
    }
}
