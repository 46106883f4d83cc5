import Foundation
import Glibc
import MagpieTestSupport
import Testing

@testable import Magpie

@Suite("Disk tier: the journal of owed removals")
struct DiskJournalTests {
    @Test("entries survive a reopen; a torn or damaged tail is dropped, what precedes it kept")
    func survivesReopen() throws {
        let directory = TemporaryDirectory("magpie-journal")
        defer { directory.cleanup() }
        let entries = (0..<20).map { Array("entry \($0)".utf8) }
        do {
            let tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 4))
            for entry in entries { #expect(try OwedJournal(tier).append(entry)) }
            // Not closed: a killed process leaves what it appended.
        }
        let path = directory.path + "/OWED"
        var tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 4))
        #expect(try OwedJournal(tier).payloads() == entries)
        try tier.close()
        // A torn last entry (a crash mid-append): dropped.
        let size = try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
        #expect(truncate(path, off_t(size - 3)) == 0)
        tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 4))
        #expect(try OwedJournal(tier).payloads() == Array(entries.dropLast()))
        try tier.close()
        // A damaged byte in the fifth entry: the first four are kept.
        let handle = try #require(FileHandle(forUpdatingAtPath: path))
        let entryLength = 4 + 7 + 8  // length, "entry n", checksum
        let offset: UInt64 = 8 + 4 * UInt64(entryLength) + 6
        try handle.seek(toOffset: offset)
        handle.write(Data([0xFF]))
        try handle.close()
        tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 4))
        #expect(try OwedJournal(tier).payloads() == Array(entries.prefix(4)))
        // Replaced whole, then removed when empty.
        #expect(try OwedJournal(tier).replace(with: [entries[7]]))
        #expect(try OwedJournal(tier).payloads() == [entries[7]])
        #expect(try OwedJournal(tier).replace(with: []))
        #expect(!FileManager.default.fileExists(atPath: path))
        #expect(try OwedJournal(tier).payloads() == [])
        try tier.close()
    }

    @Test("the journal is held to its limit and counted in the budget; destroy removes it")
    func limitAndBudget() throws {
        let directory = TemporaryDirectory("magpie-journal")
        defer { directory.cleanup() }
        let budget = 256 * 1024
        let tier = try DiskTier(.init(directory: directory.path, budget: budget, bucketCount: 4))
        // Fill the tier, then the journal up to its limit (budget / 64 = 4 KiB here).
        let value = [UInt8](repeating: 7, count: 1000)
        for i in 0..<2_000 { try tier.set(value, forKey: "k\(i)") }
        var appended = 0
        while try OwedJournal(tier).append([UInt8](repeating: 1, count: 100)) { appended += 1 }
        #expect(appended > 0)
        #expect(tier.journalSize <= tier.journalLimit)
        try tier.flush()
        #expect(directoryBytes(directory.path) <= budget)
        // The tier still stores (into room the journal does not hold).
        for i in 0..<500 { try tier.set(value, forKey: "again\(i)") }
        try tier.close()
        #expect(directoryBytes(directory.path) <= budget)
        // Reopened, the journal left behind is charged at once.
        let reopened = try DiskTier(.init(directory: directory.path, budget: budget, bucketCount: 4))
        for i in 0..<500 { try reopened.set(value, forKey: "more\(i)") }
        try reopened.flush()
        #expect(directoryBytes(directory.path) <= budget)
        #expect(try OwedJournal(reopened).payloads().count == appended)
        try reopened.close()
        try DiskTier.destroy(directory: directory.path)
        #expect(!FileManager.default.fileExists(atPath: directory.path + "/OWED"))
    }

    @Test("a link planted as OWED is never followed: what it points at is neither read nor written")
    func plantedLink() throws {
        let directory = TemporaryDirectory("magpie-journal")
        let outside = TemporaryDirectory("magpie-journal-victim")
        defer { directory.cleanup(); outside.cleanup() }
        let victim = outside.child("victim")
        try Data("not yours".utf8).write(to: URL(fileURLWithPath: victim))
        let tier = try DiskTier(.init(directory: directory.path, budget: 1 << 20, bucketCount: 4))
        #expect(symlink(victim, directory.path + "/OWED") == 0)
        #expect(try OwedJournal(tier).payloads() == [])
        #expect(throws: MagpieError.self) { _ = try OwedJournal(tier).append(Array("entry".utf8)) }
        #expect(try OwedJournal(tier).replace(with: [Array("entry".utf8)]))  // replaces the link itself
        #expect(try OwedJournal(tier).payloads() == [Array("entry".utf8)])
        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "not yours")
        try tier.close()
    }
}
