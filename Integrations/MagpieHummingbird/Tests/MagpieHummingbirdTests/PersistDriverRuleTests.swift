import Foundation
import Hummingbird
import Magpie
import MagpieHummingbird
import Testing

/// The drivers every rule runs against: Hummingbird's own `MemoryPersistDriver` (the reference: where a
/// rule fails only for it, the test is wrong) and Magpie's driver over a memory-only cache and over a
/// two-tier cache.
enum DriverKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case hummingbirdMemory
    case magpieMemory
    case magpieMemoryAndDisk

    var testDescription: String { rawValue }
}

/// A driver under test and what to clean up after it.
struct DriverUnderTest: Sendable {
    let driver: any PersistDriver
    let cache: Cache?
    let directory: String?

    init(_ kind: DriverKind) throws {
        switch kind {
        case .hummingbirdMemory:
            driver = MemoryPersistDriver()
            cache = nil
            directory = nil
        case .magpieMemory:
            let cache = try Cache(Cache.Configuration(memoryBudget: 8 << 20))
            driver = MagpiePersistDriver(cache: cache, tiers: .memoryOnly)
            self.cache = cache
            directory = nil
        case .magpieMemoryAndDisk:
            let directory = try temporaryDirectory()
            let cache = try Cache(Cache.Configuration(directory: directory, memoryBudget: 8 << 20, diskBudget: 64 << 20))
            driver = MagpiePersistDriver(cache: cache)
            self.cache = cache
            self.directory = directory
        }
    }

    func finish() {
        try? cache?.close()
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// Runs `body` on a new driver of `kind`, then cleans up after it.
func onDriver(_ kind: DriverKind, _ body: (any PersistDriver) async throws -> Void) async throws {
    let subject = try DriverUnderTest(kind)
    defer { subject.finish() }
    try await body(subject.driver)
}

func temporaryDirectory() throws -> String {
    var template = Array((FileManager.default.temporaryDirectory.path + "/magpie-persist-XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw CocoaError(.fileWriteUnknown) }
    return String(cString: made)
}

struct Profile: Codable, Sendable, Equatable {
    var name: String
    var visits: Int
}

/// Each rule of Hummingbird's `PersistDriver` protocol, the same test for every driver.
@Suite struct PersistDriverRuleTests {
    @Test(arguments: DriverKind.allCases)
    func setThenGet(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "greeting", value: "hello", expires: nil)
            try await persist.set(key: "profile", value: Profile(name: "ada", visits: 3), expires: nil)
            #expect(try await persist.get(key: "greeting", as: String.self) == "hello")
            #expect(try await persist.get(key: "profile", as: Profile.self) == Profile(name: "ada", visits: 3))
            #expect(try await persist.get(key: "absent", as: String.self) == nil)
        }
    }

    @Test(arguments: DriverKind.allCases)
    func setOverwrites(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "k", value: "first", expires: nil)
            try await persist.set(key: "k", value: "second", expires: nil)
            #expect(try await persist.get(key: "k", as: String.self) == "second")
        }
    }

    @Test(arguments: DriverKind.allCases)
    func createThrowsOnADuplicate(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.create(key: "k", value: "first", expires: nil)
            await #expect(throws: PersistError.duplicate) {
                try await persist.create(key: "k", value: "second", expires: nil)
            }
            #expect(try await persist.get(key: "k", as: String.self) == "first")
            // A key set (not created) is a duplicate too.
            try await persist.set(key: "s", value: "set", expires: .seconds(60))
            await #expect(throws: PersistError.duplicate) {
                try await persist.create(key: "s", value: "created", expires: nil)
            }
            // After a removal, create succeeds again.
            try await persist.remove(key: "k")
            try await persist.create(key: "k", value: "third", expires: nil)
            #expect(try await persist.get(key: "k", as: String.self) == "third")
        }
    }

    @Test(arguments: DriverKind.allCases)
    func concurrentCreatesSucceedOnce(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            for round in 0..<20 {
                let key = "race-\(round)"
                let winners = try await withThrowingTaskGroup(of: Int?.self) { group in
                    for contender in 0..<32 {
                        group.addTask {
                            do {
                                try await persist.create(key: key, value: contender, expires: nil)
                                return contender
                            } catch let error as PersistError where error == .duplicate {
                                return nil
                            }
                        }
                    }
                    var winners: [Int] = []
                    for try await winner in group { if let winner { winners.append(winner) } }
                    return winners
                }
                #expect(winners.count == 1)
                #expect(try await persist.get(key: key, as: Int.self) == winners.first)
            }
        }
    }

    @Test(arguments: DriverKind.allCases)
    func expiredValuesAreGone(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            // Lifetimes of a second: a loaded machine must not expire them before the first reads.
            try await persist.set(key: "short", value: "a", expires: .seconds(1))
            try await persist.set(key: "zero", value: "b", expires: .zero)
            try await persist.set(key: "long", value: "c", expires: .seconds(60))
            try await persist.create(key: "created", value: "d", expires: .seconds(1))
            #expect(try await persist.get(key: "short", as: String.self) == "a")
            #expect(try await persist.get(key: "created", as: String.self) == "d")
            try await Task.sleep(for: .milliseconds(1_300))
            #expect(try await persist.get(key: "short", as: String.self) == nil)
            #expect(try await persist.get(key: "zero", as: String.self) == nil)
            #expect(try await persist.get(key: "created", as: String.self) == nil)
            #expect(try await persist.getWithTTL(key: "short", as: String.self) == nil)
            #expect(try await persist.get(key: "long", as: String.self) == "c")
        }
    }

    @Test(arguments: DriverKind.allCases)
    func setWithoutExpiryKeepsTheExistingOne(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "k", value: "first", expires: .seconds(1))
            try await persist.set(key: "k", value: "second", expires: nil)
            let kept = try #require(try await persist.getWithTTL(key: "k", as: String.self))
            #expect(kept.object == "second")
            let ttl = try #require(kept.ttl)
            #expect(ttl > .zero && ttl <= .seconds(1))
            try await Task.sleep(for: .milliseconds(1_300))
            #expect(try await persist.get(key: "k", as: String.self) == nil)

            // A key created without an expiry keeps none.
            try await persist.create(key: "forever", value: "x", expires: nil)
            try await persist.set(key: "forever", value: "y", expires: nil)
            let forever = try #require(try await persist.getWithTTL(key: "forever", as: String.self))
            #expect(forever.object == "y" && forever.ttl == nil)
        }
    }

    @Test(arguments: DriverKind.allCases)
    func setWithAnExpiryReplacesTheOldOne(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "longer", value: "a", expires: .milliseconds(100))
            try await persist.set(key: "longer", value: "b", expires: .seconds(60))
            try await persist.set(key: "shorter", value: "c", expires: nil)
            try await persist.set(key: "shorter", value: "d", expires: .milliseconds(100))
            try await Task.sleep(for: .milliseconds(300))
            #expect(try await persist.get(key: "longer", as: String.self) == "b")
            #expect(try await persist.get(key: "shorter", as: String.self) == nil)
        }
    }

    @Test(arguments: DriverKind.allCases)
    func ttlReportsTheTimeLeft(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "timed", value: "a", expires: .seconds(10))
            try await persist.set(key: "untimed", value: "b", expires: nil)
            let timed = try #require(try await persist.getWithTTL(key: "timed", as: String.self))
            let ttl = try #require(timed.ttl)
            #expect(timed.object == "a")
            #expect(ttl > .seconds(9) && ttl <= .seconds(10))
            let untimed = try #require(try await persist.getWithTTL(key: "untimed", as: String.self))
            #expect(untimed.object == "b" && untimed.ttl == nil)
            #expect(try await persist.getWithTTL(key: "absent", as: String.self) == nil)
        }
    }

    @Test(arguments: DriverKind.allCases)
    func removeForgetsAndToleratesAbsence(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "k", value: "v", expires: nil)
            try await persist.remove(key: "k")
            #expect(try await persist.get(key: "k", as: String.self) == nil)
            try await persist.remove(key: "never-there")
        }
    }

    @Test(arguments: DriverKind.allCases)
    func theWrongTypeIsAnInvalidConversion(_ kind: DriverKind) async throws {
        try await onDriver(kind) { persist in
            try await persist.set(key: "text", value: "not a number", expires: nil)
            await #expect(throws: PersistError.invalidConversion) {
                _ = try await persist.get(key: "text", as: Int.self)
            }
            await #expect(throws: PersistError.invalidConversion) {
                _ = try await persist.getWithTTL(key: "text", as: Profile.self)
            }
            #expect(try await persist.get(key: "text", as: String.self) == "not a number")
        }
    }
}

/// What Magpie's driver adds to the protocol, and where it differs from `MemoryPersistDriver` (by design).
@Suite struct MagpiePersistDriverTests {
    @Test func valuesAndExpiriesSurviveAReopen() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = Cache.Configuration(directory: directory, memoryBudget: 8 << 20, diskBudget: 64 << 20)
        do {
            let persist = MagpiePersistDriver(cache: try Cache(configuration), shutsDownCache: true)
            try await persist.create(key: "session", value: Profile(name: "ada", visits: 1), expires: .seconds(60))
            try await persist.set(key: "forever", value: "kept", expires: nil)
            try await persist.shutdown()
            #expect(throws: MagpieError.self) { _ = try persist.cache.value(forKey: "anything") }  // closed
        }
        let reopened = MagpiePersistDriver(cache: try Cache(configuration))
        defer { try? reopened.cache.close() }
        let session = try #require(try await reopened.getWithTTL(key: "session", as: Profile.self))
        #expect(session.object == Profile(name: "ada", visits: 1))
        let ttl = try #require(session.ttl)
        #expect(ttl > .seconds(55) && ttl <= .seconds(60))
        #expect(try await reopened.get(key: "forever", as: String.self) == "kept")
        await #expect(throws: PersistError.duplicate) {
            try await reopened.create(key: "session", value: Profile(name: "eve", visits: 0), expires: nil)
        }
    }

    @Test func anExpiredKeyCanBeCreatedAgain() async throws {
        // As with Redis's SET NX. (MemoryPersistDriver refuses until its tidy pass removes the old value.)
        let cache = try Cache(Cache.Configuration(memoryBudget: 8 << 20))
        defer { try? cache.close() }
        let persist = MagpiePersistDriver(cache: cache)
        try await persist.create(key: "k", value: "old", expires: .milliseconds(50))
        try await Task.sleep(for: .milliseconds(200))
        try await persist.create(key: "k", value: "new", expires: nil)
        #expect(try await persist.get(key: "k", as: String.self) == "new")
    }

    @Test func keysLiveUnderThePrefixAndForeignBytesAreRefused() async throws {
        let cache = try Cache(Cache.Configuration(memoryBudget: 8 << 20))
        defer { try? cache.close() }
        let persist = MagpiePersistDriver(cache: cache, keyPrefix: "sessions/")
        try await persist.set(key: "k", value: "v", expires: nil)
        let stored = try #require(try cache.value(forKey: "sessions/k"))
        #expect(Array(stored.prefix(4)) == [0x4D, 0x50, 0x44, 0x01])
        #expect(try cache.value(forKey: "k") == nil)
        // Bytes another writer put under the driver's key are not a value of the driver's: never decoded
        // as one, and a create does not treat them as absent.
        try cache.set(Array("\"v\"".utf8), forKey: "sessions/foreign")
        await #expect(throws: PersistError.invalidConversion) {
            _ = try await persist.get(key: "foreign", as: String.self)
        }
        await #expect(throws: PersistError.invalidConversion) {
            try await persist.create(key: "foreign", value: "mine", expires: nil)
        }
        // A set replaces them whole.
        try await persist.set(key: "foreign", value: "mine", expires: nil)
        #expect(try await persist.get(key: "foreign", as: String.self) == "mine")
    }

    @Test func runsAsAServiceWithoutClosingACacheItDoesNotOwn() async throws {
        let cache = try Cache(Cache.Configuration(memoryBudget: 8 << 20))
        defer { try? cache.close() }
        let persist = MagpiePersistDriver(cache: cache)
        try await persist.set(key: "k", value: "v", expires: nil)
        let running = Task { try await persist.run() }
        running.cancel()  // a cancelled run shuts down like a graceful one
        try await running.value
        #expect(try await persist.get(key: "k", as: String.self) == "v")  // the cache is still open
    }
}
