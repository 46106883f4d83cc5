import Foundation
import Glibc
import MagpieTestSupport
import Testing

@testable import Magpie

// A hostile local user who can write where the cache directory lives plants symbolic links at every name
// the disk tier opens, before it opens the directory and while it has it open. Whatever the tier does
// (refuse, heal, throw), a file outside the directory stays byte for byte as it was and nothing is
// created outside it.

/// A cache directory beside an "outside" directory holding a victim file, and the dangling target a
/// dangling link points at.
private struct Stage {
    let base = TemporaryDirectory("magpie-hostile")
    var cache: String { base.child("cache") }
    var outside: String { base.child("outside") }
    var victim: String { outside + "/victim" }
    var dangling: String { outside + "/created-by-the-cache" }
    static let precious = Array("precious bytes that belong to someone else\n".utf8)

    init() {
        mkdir(base.child("outside"), 0o700)
        _ = FileManager.default.createFile(atPath: base.child("outside") + "/victim", contents: Data(Self.precious))
    }

    func configuration(checkEvery interval: Duration? = .zero) -> DiskTier.Configuration {
        var configuration = DiskTier.Configuration(directory: cache, budget: 96 << 10, bucketCount: 2, hashSeed: 7)
        configuration.directoryCheckInterval = interval
        return configuration
    }

    /// Replaces whatever is at `name` (relative to the cache directory) by a link to the victim or to
    /// the dangling target.
    func plant(_ name: String, dangling: Bool) {
        let path = cache + "/" + name
        if (try? FileManager.default.attributesOfItem(atPath: path)[.type] as? FileAttributeType) == .typeDirectory {
            rename(path, path + "-moved-away")
        } else {
            unlink(path)
        }
        let target = dangling ? self.dangling : (name == "buckets" || name.isEmpty ? outside : victim)
        #expect(symlink(target, path) == 0, "could not plant \(name)")
    }

    /// Stores enough incompressible values to make both buckets compact several times, flushes, closes
    /// and reopens: every path the tier uses. Errors are allowed (a refusal, a replaced directory), traps
    /// and outside writes are not.
    func exercise(_ tier: DiskTier?) {
        if let tier {
            var generator = SystemRandomNumberGenerator()
            for key in 0..<160 {
                let value = (0..<1500).map { _ in UInt8.random(in: 0...255, using: &generator) }
                _ = try? tier.set(value, forKey: "key-\(key)")
                if key % 40 == 0 { _ = try? tier.removeValue(forKey: "key-\(key / 2)") }
            }
            _ = try? tier.value(forKey: "key-3")
            _ = try? tier.flush()
            _ = try? tier.close()
        }
        if let again = try? DiskTier(configuration()) {
            _ = try? again.value(forKey: "key-159")
            _ = try? again.close()
        }
    }

    func expectOutsideUntouched(_ comment: Comment) {
        #expect(FileManager.default.contents(atPath: victim).map(Array.init) == Self.precious, comment)
        #expect(access(dangling, F_OK) != 0, comment)
        #expect(Set((try? FileManager.default.contentsOfDirectory(atPath: outside)) ?? []) == ["victim"], comment)
    }
}

/// Every name inside the cache directory the tier creates, opens or renames.
private let plantedNames = [
    "MANIFEST", "MANIFEST.tmp", "LOCK", "buckets", "buckets/00", "buckets/01", "buckets/00.index",
    "buckets/00.index.tmp", "buckets/01.compact", "buckets/00.compact",
]

@Suite("Disk tier: a hostile directory")
struct HostileDirectoryTests {
    @Test(
        "a link planted before open, at every path the tier uses, never lets it write outside its directory",
        arguments: plantedNames, [false, true])
    func plantedBeforeOpen(name: String, dangling: Bool) throws {
        let stage = Stage()
        defer { stage.base.cleanup() }
        // A populated, cleanly closed directory (so MANIFEST, buckets and index snapshots exist).
        stage.exercise(try DiskTier(stage.configuration()))
        stage.plant(name, dangling: dangling)
        stage.exercise(try? DiskTier(stage.configuration()))
        stage.expectOutsideUntouched("\(name), dangling: \(dangling)")
    }

    @Test("links planted in an empty directory before the first open (MANIFEST.tmp, LOCK, buckets)", arguments: [false, true])
    func plantedBeforeFirstOpen(dangling: Bool) throws {
        for name in ["MANIFEST.tmp", "LOCK", "MANIFEST", "buckets"] {
            let stage = Stage()
            defer { stage.base.cleanup() }
            mkdir(stage.cache, 0o700)
            stage.plant(name, dangling: dangling)
            stage.exercise(try? DiskTier(stage.configuration()))
            stage.expectOutsideUntouched("\(name), dangling: \(dangling)")
        }
    }

    @Test(
        "a link planted while the tier is open, at every path it uses, never lets it write outside",
        arguments: plantedNames + [""], [false, true])
    func plantedWhileOpen(name: String, dangling: Bool) throws {
        let stage = Stage()
        defer { stage.base.cleanup() }
        stage.exercise(try DiskTier(stage.configuration()))
        let tier = try DiskTier(stage.configuration(checkEvery: nil))
        // Every bucket file open first: after a clean close the open opens none (SIZES), and a bucket
        // opens its file at its load; a link planted before that load is the case above.
        _ = tier.statistics
        if name.isEmpty {
            // The cache directory itself: moved away, a link to the outside directory in its place.
            rename(stage.cache, stage.cache + "-moved-away")
            #expect(symlink(stage.outside, stage.cache) == 0)
        } else {
            stage.plant(name, dangling: dangling)
        }
        stage.exercise(tier)
        stage.expectOutsideUntouched("\(name.isEmpty ? "the directory" : name), dangling: \(dangling)")
    }

    @Test("a link planted at a bucket file before open is replaced by a fresh bucket file and counted")
    func bucketLinkHealed() throws {
        let stage = Stage()
        defer { stage.base.cleanup() }
        try DiskTier(stage.configuration()).close()
        stage.plant("buckets/00", dangling: false)
        let tier = try DiskTier(stage.configuration())
        #expect(tier.statistics.missingBucketFiles == 1)
        try tier.set(Array("v".utf8), forKey: "k")
        #expect(try tier.value(forKey: "k") == Array("v".utf8))
        try tier.close()
        var info = stat()
        #expect(lstat(stage.cache + "/buckets/00", &info) == 0 && info.st_mode & S_IFMT == S_IFREG)
        stage.expectOutsideUntouched("buckets/00")
    }

    @Test("a link in place of the cache directory, LOCK or MANIFEST is refused with directoryUnsafe")
    func linksRefused() throws {
        for name in ["", "LOCK", "MANIFEST", "buckets"] {
            let stage = Stage()
            defer { stage.base.cleanup() }
            if name.isEmpty {
                #expect(symlink(stage.outside, stage.cache) == 0)
            } else {
                try DiskTier(stage.configuration()).close()
                stage.plant(name, dangling: false)
            }
            let error = #expect(throws: MagpieError.self) { try DiskTier(stage.configuration()) }
            #expect(error?.code == .directoryUnsafe, "\(name): \(String(describing: error))")
            stage.expectOutsideUntouched("\(name)")
        }
    }

    @Test("a link in place of the directory is refused even when the path ends in a slash; '.' and '..' endings too")
    func trailingSlash() throws {
        let stage = Stage()
        defer { stage.base.cleanup() }
        #expect(symlink(stage.outside, stage.cache) == 0)
        for path in [stage.cache + "/", stage.cache + "//"] {
            var configuration = stage.configuration()
            configuration.directory = path
            let error = #expect(throws: MagpieError.self) { try DiskTier(configuration) }
            #expect(error?.code == .directoryUnsafe, "\(path): \(String(describing: error))")
        }
        for path in [stage.cache + "/.", stage.cache + "/..", stage.cache + "/./"] {
            var configuration = stage.configuration()
            configuration.directory = path
            let error = #expect(throws: MagpieError.self) { try DiskTier(configuration) }
            #expect(error?.code == .invalidConfiguration, "\(path): \(String(describing: error))")
        }
        stage.expectOutsideUntouched("a link at the directory, opened with a trailing slash")
        // A real directory given with a trailing slash opens as usual.
        var configuration = stage.configuration()
        configuration.directory = stage.base.child("real") + "/"
        try DiskTier(configuration).close()
    }

    @Test("destroy(directory:) removes a link planted at buckets, never what it points at")
    func destroyNeverFollows() throws {
        let stage = Stage()
        defer { stage.base.cleanup() }
        try DiskTier(stage.configuration()).close()
        stage.plant("buckets", dangling: false)
        try DiskTier.destroy(directory: stage.cache)
        stage.expectOutsideUntouched("buckets")
        #expect(access(stage.cache + "/buckets", F_OK) != 0)
    }
}

@Suite("Disk tier: whose directory")
struct DirectoryOwnershipTests {
    private func refusal(_ prepare: (String) -> Void, allowsGroup: Bool = false) -> MagpieError? {
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        let cache = base.child("cache")
        mkdir(cache, 0o700)
        prepare(cache)
        var configuration = DiskTier.Configuration(directory: cache, budget: 1 << 20, bucketCount: 2)
        configuration.allowsGroupWritableDirectory = allowsGroup
        do {
            // Every bucket touched too: after a clean close the open opens no bucket file (SIZES), and
            // one that is not ours is refused by its bucket's first operation.
            let tier = try DiskTier(configuration)
            defer { try? tier.close() }
            try tier.removeAll()
            return nil
        } catch {
            return error
        }
    }

    @Test("a directory writable by all users is refused, sticky bit or not; so is such a buckets/")
    func worldWritable() {
        for mode: mode_t in [0o777, 0o1777, 0o703] {
            let error = refusal { chmod($0, mode) }
            #expect(error?.code == .directoryUnsafe, "mode \(String(mode, radix: 8)): \(String(describing: error))")
        }
        let error = refusal { cache in
            mkdir(cache + "/buckets", 0o700)
            chmod(cache + "/buckets", 0o777)
        }
        #expect(error?.code == .directoryUnsafe)
    }

    @Test("a group-writable directory is refused unless the configuration trusts the group")
    func groupWritable() {
        #expect(refusal { chmod($0, 0o770) }?.code == .directoryUnsafe)
        #expect(refusal({ chmod($0, 0o770) }, allowsGroup: true) == nil)
    }

    @Test("a directory owned by another user is refused", .enabled(if: geteuid() == 0, "needs root to chown"))
    func otherOwner() {
        let error = refusal { chown($0, 4242, 4242) }
        #expect(error?.code == .directoryUnsafe)
        #expect(error?.message.contains("uid 4242") == true)
        // A planted bucket file owned by another user (only root can make one) is refused too.
        let file = refusal { cache in
            let tier = try? DiskTier(DiskTier.Configuration(directory: cache, budget: 1 << 20, bucketCount: 2))
            try? tier?.close()
            chown(cache + "/buckets/01", 4242, 4242)
        }
        #expect(file?.code == .directoryUnsafe)
    }

    @Test("new files are 0600 and new directories 0700 by default, whatever the umask; modes are configurable")
    func modes() throws {
        // The tiers are opened under umask 002 by a child process: the umask is process-wide, and set here
        // it made the directories of tests running beside this one group-writable (seen: a crash image's
        // directory refused as directoryUnsafe by DiskDamagedHeaderTests).
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        let outcome = try runTestChild(["umask-child", "--directory", base.path])
        try #require(outcome.exitStatus == 0 && !outcome.timedOut, "umask-child failed (\(outcome))")
        func mode(_ path: String) -> mode_t {
            var info = stat()
            lstat(path, &info)
            return info.st_mode & 0o7777
        }
        let cache = base.child("cache")
        #expect(mode(cache) == 0o700)
        #expect(mode(cache + "/buckets") == 0o700)
        for name in ["MANIFEST", "LOCK", "buckets/00", "buckets/01", "buckets/00.index"] {
            #expect(mode(cache + "/" + name) == 0o600, "\(name)")
        }
        #expect(mode(base.child("shared")) == 0o750)
        #expect(mode(base.child("shared") + "/MANIFEST") == 0o640)
    }
}

@Suite("Disk tier: a directory removed or replaced while open")
struct DirectoryReplacedTests {
    private func open(_ directory: String, checkEvery interval: Duration? = .zero) throws -> DiskTier {
        var configuration = DiskTier.Configuration(directory: directory, budget: 1 << 20, bucketCount: 4, hashSeed: 3)
        configuration.directoryCheckInterval = interval
        return try DiskTier(configuration)
    }

    @Test(
        "removing, replacing or renaming the directory, buckets/ or a bucket file makes every call throw directoryReplaced",
        arguments: ["remove", "replace", "rename", "remove buckets", "replace a bucket file", "remove a bucket file"])
    func detected(change: String) throws {
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        let cache = base.child("cache")
        let tier = try open(cache)
        try tier.set(Array("before".utf8), forKey: "k")
        switch change {
        case "remove": try FileManager.default.removeItem(atPath: cache)
        case "replace":
            try FileManager.default.removeItem(atPath: cache)
            mkdir(cache, 0o700)
        case "rename": rename(cache, cache + "-elsewhere")
        case "remove buckets": try FileManager.default.removeItem(atPath: cache + "/buckets")
        case "replace a bucket file":
            unlink(cache + "/buckets/02")
            _ = FileManager.default.createFile(atPath: cache + "/buckets/02", contents: Data())
        default: unlink(cache + "/buckets/03")
        }
        let stored = #expect(throws: MagpieError.self) { try tier.set(Array("after".utf8), forKey: "k2") }
        #expect(stored?.code == .directoryReplaced, "\(change): \(String(describing: stored))")
        #expect((#expect(throws: MagpieError.self) { try tier.value(forKey: "k") })?.code == .directoryReplaced)
        #expect((#expect(throws: MagpieError.self) { try tier.flush() })?.code == .directoryReplaced)
        #expect((#expect(throws: MagpieError.self) { try tier.removeValue(forKey: "k") })?.code == .directoryReplaced)
        _ = try? tier.close()
        #expect(access(cache + "-elsewhere/buckets/00.index", F_OK) != 0)  // nothing written after detection
    }

    @Test("with writes not checking, flush and writeBuffers still detect a removed directory")
    func flushDetects() throws {
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        let tier = try open(base.child("cache"), checkEvery: nil)
        try tier.set(Array("v".utf8), forKey: "k")
        try FileManager.default.removeItem(atPath: base.child("cache"))
        try tier.set(Array("v".utf8), forKey: "k2")  // not checked: accepted into the open files
        #expect((#expect(throws: MagpieError.self) { try tier.writeBuffers() })?.code == .directoryReplaced)
        #expect((#expect(throws: MagpieError.self) { try tier.set([1], forKey: "k3") })?.code == .directoryReplaced)
        #expect(tier.statistics.entries >= 0)
        _ = try? tier.close()
    }

    @Test("an untouched directory passes the check, and a compaction's rename is not mistaken for a replacement")
    func noFalseAlarm() throws {
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        var configuration = DiskTier.Configuration(directory: base.child("cache"), budget: 64 << 10, bucketCount: 2)
        configuration.directoryCheckInterval = .zero
        let tier = try DiskTier(configuration)
        for key in 0..<300 { try tier.set(selfDescribingValue(key: key, version: 0, length: 900), forKey: keyBytes(key)) }
        #expect(tier.statistics.regionsReclaimed > 0)
        try tier.flush()
        try tier.close()
    }

    @Test("a Cache whose directory was removed stops accepting stores: set throws directoryReplaced")
    func cacheDetects() throws {
        let base = TemporaryDirectory()
        defer { base.cleanup() }
        var configuration = Cache.Configuration(directory: base.child("cache"), memoryBudget: 1 << 20, diskBudget: 1 << 20)
        configuration.metrics = nil
        let cache = try Cache(configuration)
        try cache.set(Array("v".utf8), forKey: "k")
        try FileManager.default.removeItem(atPath: base.child("cache"))
        #expect((#expect(throws: MagpieError.self) { try cache.flush() })?.code == .directoryReplaced)
        let error = #expect(throws: MagpieError.self) { try cache.set(Array("w".utf8), forKey: "k2") }
        #expect(error?.code == .directoryReplaced)
        _ = try? cache.close()
    }
}
