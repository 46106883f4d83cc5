import ArgumentParser
import Foundation
import Magpie
import MagpieTestSupport  // crashValue, isCrashValue: the self-describing values the crash tests check too
import Synchronization

/// State every stress task shares.
final class StressShared: Sendable {
    let operations = Atomic<Int>(0)
    let reads = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
    let violations = Mutex<[String]>([])

    func violate(_ message: String) {
        violations.withLock { if $0.count < 1000 { $0.append(message) } }
    }
}

/// One task's operation sequence and what it knows of its owned keys.
struct StressWorker {
    let task: Int
    let cache: Cache
    let shared: StressShared
    let ownedKeys: Int
    let sharedKeys: Int
    var state: UInt64
    var version = 0
    /// The latest value set for each owned key and its group, nil once removed.
    var latest: [(value: [UInt8], group: Int)?]

    init(task: Int, cache: Cache, shared: StressShared, ownedKeys: Int, sharedKeys: Int, seed: UInt64) {
        self.task = task
        self.cache = cache
        self.shared = shared
        self.ownedKeys = ownedKeys
        self.sharedKeys = sharedKeys
        self.state = seed
        self.latest = Array(repeating: nil, count: ownedKeys)
    }

    mutating func random(_ bound: Int) -> Int {
        state = splitmix64(state)
        return Int(state % UInt64(bound))
    }

    func ownedName(_ key: Int) -> String { "t\(task)-\(key)" }
    func groupName(_ group: Int) -> String { "t\(task)-g\(group)" }

    mutating func makeOptions(group: Int) -> EntryOptions {
        let tiers: Tiers = [.memoryAndDisk, .memoryAndDisk, .memoryOnly, .diskOnly][random(4)]
        switch random(8) {
        case 0: return EntryOptions(memoryExpiry: .after(.milliseconds(20 + random(200))), group: groupName(group), tiers: tiers)
        case 1:
            return EntryOptions(
                memoryExpiry: .after(.milliseconds(5)), diskExpiry: .after(.seconds(30)), group: groupName(group), tiers: tiers)
        default: return EntryOptions(group: groupName(group), tiers: tiers)
        }
    }

    mutating func step() async {
        version += 1
        do {
            if random(4) == 0 {
                try await sharedStep()
            } else {
                try await ownedStep()
            }
        } catch {
            shared.violate("task \(task): unexpected error \(error)")
        }
    }

    /// A shared key: any task's value, but always one written for this key.
    mutating func sharedStep() async throws {
        let key = random(sharedKeys)
        let name = "s\(key)"
        let length = 16 + random(1500)
        switch random(10) {
        case 0..<4:
            try syncSet(cache, crashValue(key: key, version: task << 40 | version, length: length), name, nil)
        case 4..<9:
            let got = random(2) == 0 ? try syncValue(cache, name) : try await cache.async.value(forKey: name)
            shared.reads.add(1, ordering: .relaxed)
            if let got, !isCrashValue(got, ofKey: key) {
                shared.violate("task \(task): shared key \(name) read \(got.count) bytes not written for it: \(got.prefix(24))")
            }
        default:
            try syncRemove(cache, name)
        }
    }

    /// An owned key: nil or exactly the latest value this task set.
    mutating func ownedStep() async throws {
        let key = random(ownedKeys)
        let name = ownedName(key)
        let group = key % 4
        switch random(100) {
        case 0..<30:
            let value = crashValue(key: key, version: version, length: 1 + random(random(8) == 0 ? 6000 : 600))
            let options = makeOptions(group: group)
            if random(2) == 0 { try syncSet(cache, value, name, options) } else {
                try await cache.async.set(value, forKey: name, options: options)
            }
            latest[key] = (value, group)
        case 30..<70:
            let got = random(3) == 0 ? try await cache.async.value(forKey: name) : try syncValue(cache, name)
            check(got, key: key, name: name, what: "read")
        case 70..<78:
            let value = crashValue(key: key, version: version, length: 1 + random(600))
            let got = try await cache.value(forKey: name, options: EntryOptions(group: groupName(group))) { value }
            if got == value {
                latest[key] = (value, group)
            } else {
                check(got, key: key, name: name, what: "loader")
            }
        case 78..<86:
            if random(2) == 0 { try syncRemove(cache, name) } else { _ = try await cache.async.removeValue(forKey: name) }
            latest[key] = nil
        case 86..<90:
            _ = try await cache.async.removeAll(inGroup: groupName(group))
            for k in latest.indices where latest[k]?.group == group { latest[k] = nil }
        case 90..<95:
            let present = random(2) == 0 ? try syncContains(cache, name) : try await cache.async.contains(name)
            if present && latest[key] == nil { shared.violate("task \(task): contains(\(name)) after its removal") }
        case 95..<97:
            _ = try await cache.async.removeExpired()
        case 97:
            if random(200) == 0 {
                try await cache.async.removeAll()
                for k in latest.indices { latest[k] = nil }
            }
        default:
            _ = cache.statistics
        }
    }

    func check(_ got: [UInt8]?, key: Int, name: String, what: String) {
        shared.reads.add(1, ordering: .relaxed)
        guard let got else { return }
        guard let expected = latest[key] else {
            shared.violate("task \(task): \(what) of \(name) returned \(got.prefix(24)) after it was removed")
            return
        }
        if got != expected.value {
            shared.violate("task \(task): \(what) of \(name) returned \(got.prefix(24)), not the latest \(expected.value.prefix(24))")
        }
    }
}

// The synchronous API, called from async code: in an async context the async overloads would be chosen.
private func syncSet(_ cache: Cache, _ value: [UInt8], _ key: String, _ options: EntryOptions?) throws {
    try cache.set(value, forKey: key, options: options)
}

private func syncValue(_ cache: Cache, _ key: String) throws -> [UInt8]? {
    try cache.value(forKey: key)
}

private func syncRemove(_ cache: Cache, _ key: String) throws {
    _ = try cache.removeValue(forKey: key)
}

private func syncContains(_ cache: Cache, _ key: String) throws -> Bool {
    try cache.contains(key)
}

/// Writes a line to standard output at once (progress must show while the run goes on, also in a pipe).
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
