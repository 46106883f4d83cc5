import Foundation
import Magpie
import MagpieTestSupport
import Testing

/// Damage to the directory as a whole: bucket files deleted or swapped, index snapshots damaged, the
/// MANIFEST garbled, cut or deleted, stray files, the LOCK deleted. The tier either opens, and then every
/// read is nil or exactly the value written for that key, or it refuses with a clear error, and only when
/// the MANIFEST itself is unusable; `destroy(directory:)` then resets it.
@Suite("DiskTier: directory damage")
struct DirectoryDamageTests {
    enum Damage: String, CaseIterable {
        case bitFlips, truncateBucket, zeroRange, garbageTail, swapBuckets, deleteBucket
        case deleteSnapshot, damageSnapshot, garbageManifest, truncateManifest, deleteManifest
        case strayInBuckets, strayAtRoot, deleteLock

        var breaksManifest: Bool { [.garbageManifest, .truncateManifest, .deleteManifest].contains(self) }
    }

    static func open(_ path: String) throws(MagpieError) -> DiskTier {
        try DiskTier(.init(directory: path, budget: 4 << 20))
    }

    static func apply(_ damage: Damage, to path: String, using generator: inout SeededGenerator) throws {
        let manager = FileManager.default
        let files = DiskCorruptionTests.bucketFiles(path)
        let names = ["00", "01", "02", "03"]  // populate() makes 4 buckets; strays may sit beside them
        let buckets = files.filter { names.contains(URL(fileURLWithPath: $0).lastPathComponent) }
        let snapshots = files.filter { $0.hasSuffix(".index") }
        func rewrite(_ file: String, _ change: (inout [UInt8]) -> Void) throws {
            guard var bytes = try? [UInt8](Data(contentsOf: URL(fileURLWithPath: file))) else { return }
            change(&bytes)
            try Data(bytes).write(to: URL(fileURLWithPath: file))
        }
        guard let bucket = buckets.randomElement(using: &generator) else { return }
        switch damage {
        case .bitFlips:
            try rewrite(bucket) { bytes in
                for _ in 0..<16 where !bytes.isEmpty {
                    bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^= 1 << UInt8.random(in: 0..<8, using: &generator)
                }
            }
        case .truncateBucket:
            try rewrite(bucket) { bytes in bytes.removeLast(Int.random(in: 0...bytes.count, using: &generator)) }
        case .zeroRange:
            try rewrite(bucket) { bytes in
                guard !bytes.isEmpty else { return }
                let start = Int.random(in: 0..<bytes.count, using: &generator)
                for at in start..<min(bytes.count, start + Int.random(in: 1...4096, using: &generator)) { bytes[at] = 0 }
            }
        case .garbageTail:
            try rewrite(bucket) { bytes in
                bytes += (0..<Int.random(in: 1...3000, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            }
        case .swapBuckets:
            guard let other = buckets.filter({ $0 != bucket }).randomElement(using: &generator) else { return }
            try manager.moveItem(atPath: bucket, toPath: bucket + ".swap")
            try manager.moveItem(atPath: other, toPath: bucket)
            try manager.moveItem(atPath: bucket + ".swap", toPath: other)
        case .deleteBucket:
            try? manager.removeItem(atPath: bucket)
        case .deleteSnapshot:
            if let snapshot = snapshots.randomElement(using: &generator) { try manager.removeItem(atPath: snapshot) }
        case .damageSnapshot:
            if let snapshot = snapshots.randomElement(using: &generator) {
                try rewrite(snapshot) { bytes in
                    guard !bytes.isEmpty else { return }
                    if Bool.random(using: &generator) {
                        bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^= 0x10
                    } else {
                        bytes.removeLast(Int.random(in: 1...bytes.count, using: &generator))
                    }
                }
            }
        case .garbageManifest:
            try rewrite(path + "/MANIFEST") { bytes in
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^= 1 << UInt8.random(in: 0..<8, using: &generator)
            }
        case .truncateManifest:
            try rewrite(path + "/MANIFEST") { bytes in bytes.removeLast(Int.random(in: 1...bytes.count, using: &generator)) }
        case .deleteManifest:
            try? manager.removeItem(atPath: path + "/MANIFEST")
        case .strayInBuckets:
            for name in ["07.compact", "notes.txt", "ff", "0"] {
                _ = manager.createFile(atPath: path + "/buckets/" + name, contents: Data(repeating: 0xAB, count: 5000))
            }
        case .strayAtRoot:
            _ = manager.createFile(atPath: path + "/README.txt", contents: Data("not Magpie's".utf8))
        case .deleteLock:
            try? manager.removeItem(atPath: path + "/LOCK")
        }
    }

    @Test("each kind of damage alone: opens and serves only exact values, or (MANIFEST damage only) refuses clearly; destroy resets",
        arguments: Damage.allCases)
    func single(_ damage: Damage) throws {
        var generator = SeededGenerator(seed: TestSeed.value(default: 2718) &+ UInt64(damage.rawValue.count * 31))
        try check([damage], using: &generator)
    }

    /// MAGPIE_DAMAGE_ROUNDS rounds (40 by default) of one to four random kinds of damage at once.
    @Test("random combinations of damage never trap and never yield a wrong value")
    func combinations() throws {
        let seed = TestSeed.value(default: 31337)
        var generator = SeededGenerator(seed: seed)
        let rounds = Int(ProcessInfo.processInfo.environment["MAGPIE_DAMAGE_ROUNDS"] ?? "") ?? 40
        var outcome = Outcome()
        for _ in 0..<rounds {
            let damages = (0..<Int.random(in: 1...4, using: &generator)).map { _ in Damage.allCases.randomElement(using: &generator)! }
            outcome.add(try check(damages, using: &generator))
        }
        #expect(outcome.refused > 0 && outcome.opened > 0, "seed \(seed): \(outcome)")
        #expect(outcome.detected > 0, "seed \(seed): no damage was ever detected: \(outcome)")
    }

    struct Outcome: CustomStringConvertible {
        var opened = 0
        var refused = 0
        var detected: UInt64 = 0
        var lost = 0

        mutating func add(_ other: Outcome) {
            opened += other.opened
            refused += other.refused
            detected += other.detected
            lost += other.lost
        }

        var description: String { "opened \(opened), refused \(refused), damage detected \(detected), values lost \(lost)" }
    }

    @discardableResult
    func check(_ damages: [Damage], using generator: inout SeededGenerator) throws -> Outcome {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let written = try DiskCorruptionTests.populate(directory.path, count: 120)
        for damage in damages { try Self.apply(damage, to: directory.path, using: &generator) }
        var outcome = Outcome()
        let tier: DiskTier
        do {
            tier = try Self.open(directory.path)
        } catch {
            outcome.refused = 1
            #expect(damages.contains { $0.breaksManifest }, "\(damages): refused although the MANIFEST is intact: \(error)")
            #expect(error.code == .directoryUnusable, "\(damages): \(error)")
            #expect(error.message.contains("destroy"), "\(damages): the error does not say how to reset: \(error)")
            try DiskTier.destroy(directory: directory.path)
            if damages.contains(.strayAtRoot) {
                // destroy leaves files that are not Magpie's, and a directory without a MANIFEST that holds
                // foreign files is refused (a cache pointed at the wrong folder must not take it over).
                #expect(FileManager.default.fileExists(atPath: directory.child("README.txt")))
                let foreign = #expect(throws: MagpieError.self) { _ = try Self.open(directory.path) }
                #expect(foreign?.message.contains("README.txt") == true)
                try FileManager.default.removeItem(atPath: directory.child("README.txt"))
            }
            let fresh = try Self.open(directory.path)
            #expect(fresh.statistics.entries == 0)
            try fresh.set([1], forKey: "fresh")
            #expect(try fresh.value(forKey: "fresh") == [1])
            return outcome
        }
        outcome.opened = 1
        // Round 0 may open from the index snapshots (then only damage that reads meet is found); rounds 1
        // and 2 rescan every file, so after round 1 every damaged byte has been found and rewritten away.
        var served: Set<Int> = []
        var lostToHealing: [Int] = []
        var droppedForDamage: UInt64 = 0
        for round in 0..<3 {
            if round >= 1 {
                // A rescan, not the snapshot of the clean close: the healing must be in the files.
                for file in DiskCorruptionTests.bucketFiles(directory.path) where file.hasSuffix(".index") {
                    try FileManager.default.removeItem(atPath: file)
                }
            }
            let current = round == 0 ? tier : try Self.open(directory.path)
            for i in 0..<120 {
                let got = try current.value(forKey: keyBytes(i))
                if let got {
                    #expect(got == written[i], "\(damages): key \(i) read a value that was never its own")
                    if round == 0 { served.insert(i) }
                } else if written[i] != nil && round == 0 {
                    outcome.lost += 1
                }
                // Healing never loses a value that was intact, but for those older than damage that may have
                // hidden their removal (see Disk/Bucket+Heal.swift): those go, and are counted.
                if round > 0 && served.contains(i) && got == nil { lostToHealing.append(i) }
            }
            let stats = current.statistics
            droppedForDamage += stats.droppedForDamage + stats.regionsEvacuated
            if round == 0 {
                outcome.detected = stats.corruptRecords + stats.truncatedTails + UInt64(stats.missingBucketFiles)
                if damages.contains(.deleteBucket) { #expect(stats.missingBucketFiles >= 1, "\(damages) \(stats)") }
            } else if round == 2 {
                #expect(stats.missingBucketFiles == 0 && stats.corruptRecords == 0, "\(damages): healed damage came back: \(stats)")
                #expect(stats.truncatedTails == 0, "\(damages): \(stats)")
            }
            #expect(stats.bytesOnDisk <= 4 << 20)
            let strays = (try? FileManager.default.contentsOfDirectory(atPath: directory.child("buckets"))) ?? []
            #expect(!strays.contains("notes.txt") && !strays.contains("07.compact") && !strays.contains("0"))
            try current.set([UInt8(round)], forKey: "probe")
            #expect(try current.value(forKey: "probe") == [UInt8(round)])
            try current.close()
        }
        #expect(lostToHealing.isEmpty || droppedForDamage > 0, "\(damages): keys \(lostToHealing) were lost by healing, which dropped nothing")
        return outcome
    }

    @Test("a Cache refuses an unusable directory with a clear error, and Cache.destroy resets it")
    func cacheReset() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        do {
            let cache = try makeCache(directory)
            cache["k"] = [1, 2, 3]
            try cache.close()
        }
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: directory.child("MANIFEST")))
        let error = #expect(throws: MagpieError.self) { _ = try makeCache(directory) }
        #expect(error?.code == .directoryUnusable)
        #expect(error?.message.contains("destroy") == true)
        try Cache.destroy(directory: directory.path)
        let cache = try makeCache(directory)
        #expect(cache["k"] == nil)
        cache["k"] = [4]
        #expect(cache["k"] == [4])
        #expect(throws: MagpieError.self) { try Cache.destroy(directory: directory.path) }  // open: locked
    }
}
