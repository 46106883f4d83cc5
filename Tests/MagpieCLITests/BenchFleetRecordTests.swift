import Foundation
import MagpieTestSupport
import Synchronization
import Testing

@testable import MagpieBench

/// The fleet benchmark's record of each key's writes, which its stale-read detector judges reads by.
@Suite("magpie-bench fleet: a key's record of writes")
struct BenchFleetRecordTests {
    @Test("a reader gets a key's record as one write left it, or nothing while a write is midway")
    func wholeOrNothing() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let table = try FleetShared(path: directory.path + "/shared", keys: 2, probes: 0, workers: 1, create: true)
        table.recordWrite(1, version: 1, removal: false, now: 1_000)
        var called = false
        var midway: FleetShared.Truth? = nil
        table.recordWrite(1, version: 2, removal: true, now: 5_000) {
            // The new version is stored, its instant not yet: read field by field, this paired version 2
            // with version 1's instant.
            called = true
            midway = table.truth(1, attempts: 4)
        }
        #expect(called)
        #expect(midway == nil)
        let truth = try #require(table.truth(1))
        #expect(truth.latest == 2 && truth.latestAt == 5_000 && truth.removal)
        #expect(truth.previous == 1 && truth.previousAt == 1_000)
        #expect(table.latestVersion(1) == 2)
        let untouched = try #require(table.truth(0))
        #expect(untouched.latest == 0 && untouched.latestAt == 0)
    }

    @Test("a reader racing a writer on another thread never sees one write's version with another's instant")
    func racingReaderSeesWholeRecords() throws {
        let directory = TemporaryDirectory()
        defer { directory.cleanup() }
        let table = try FleetShared(path: directory.path + "/shared", keys: 1, probes: 0, workers: 1, create: true)
        let done = Flag()
        let writer = Thread {
            // Version v returns at 10 v: a whole record has latestAt == 10 latest, previousAt == 10 previous.
            for version in Int64(1)...200_000 { table.recordWrite(0, version: version, removal: false, now: 10 * version) }
            done.value.store(true, ordering: .releasing)
        }
        writer.start()
        var whole = 0
        var torn: [String] = []
        var unread = 0
        while !done.value.load(ordering: .acquiring) {
            guard let truth = table.truth(0) else {
                unread += 1
                continue
            }
            if truth.latestAt == 10 * truth.latest && truth.previousAt == 10 * truth.previous && truth.previous <= truth.latest {
                whole += 1
            } else if torn.count < 5 {
                torn.append("latest \(truth.latest) at \(truth.latestAt), previous \(truth.previous) at \(truth.previousAt)")
            }
        }
        #expect(torn == [])
        #expect(whole > 100, "the reader read \(whole) whole records, \(unread) times nothing: the race proved little")
    }
}

private final class Flag: Sendable {
    let value = Atomic<Bool>(false)
}
