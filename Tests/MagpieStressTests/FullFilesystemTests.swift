import Foundation
import Magpie
import MagpieTestSupport
import Testing

/// A small tmpfs, where the machine allows mounting one (root with CAP_SYS_ADMIN, as on the project's
/// machines); the test using it is reported as skipped elsewhere.
enum TinyFilesystem {
    static func run(_ tool: String, _ arguments: [String]) -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return false }
        process.waitUntilExit()
        return process.terminationStatus == 0
    }

    static func mount(_ path: String, size: String) -> Bool {
        run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size)", "tmpfs", path])
    }

    static func unmount(_ path: String) { _ = run("/bin/umount", [path]) }

    static let available: Bool = {
        let directory = TemporaryDirectory("magpie-probe")
        defer { directory.cleanup() }
        guard mount(directory.path, size: "64k") else { return false }
        unmount(directory.path)
        return true
    }()
}

@Suite("DiskTier: a really full file system")
struct FullFilesystemTests {
    @Test("ENOSPC from a full tmpfs is a noSpace error, and the tier stays consistent and usable",
          .enabled(if: TinyFilesystem.available, "mounting a tmpfs is not allowed here"), arguments: [0, 64 << 10])
    func fullFilesystem(writeBuffer: Int) throws {
        let directory = TemporaryDirectory("magpie-full")
        defer { directory.cleanup() }
        #expect(TinyFilesystem.mount(directory.path, size: "256k"))
        defer { TinyFilesystem.unmount(directory.path) }
        let cache = directory.child("cache")
        // A budget four times the file system: the disk fills before the budget does.
        var configuration = DiskTier.Configuration(directory: cache, budget: 1 << 20, bucketCount: 2, compressionLevel: nil)
        configuration.writeBufferSize = writeBuffer
        let tier = try DiskTier(configuration)
        var stored: [Int: [UInt8]] = [:]
        var noSpace: MagpieError? = nil
        for i in 0..<400 {
            let value = selfDescribingValue(key: i, version: 1, length: 3000)
            do {
                try tier.set(value, forKey: keyBytes(i))
                stored[i] = value
            } catch {
                noSpace = error
                break
            }
        }
        #expect(noSpace?.code == .noSpace, "expected ENOSPC, got \(String(describing: noSpace))")
        #expect(stored.count > 10)
        print("full filesystem: \(stored.count) values stored before \(noSpace?.code.description ?? "no error")")
        // Everything stored before the failure reads back, but for the stores still in the write buffer
        // when writing it failed: those are misses, and counted. The failed key is absent.
        // First the memtables still queued are written or fail (the sealer thread may not have reached them
        // yet: it runs as batch work, after the storing thread's slice), so that no store is lost after
        // the reads below have counted it as present.
        do { try tier.flush() } catch { #expect(error.code == .noSpace, "flush: \(error)") }
        var lost = 0
        for (key, value) in stored {
            let got = try tier.value(forKey: keyBytes(key))
            #expect(got == nil || got == value, "key \(key) read bytes that were never its value")
            if got == nil { lost += 1 }
        }
        #expect(UInt64(lost) == tier.statistics.lostBufferedStores)
        #expect(writeBuffer == 0 ? lost == 0 : lost > 0, "write buffer \(writeBuffer): \(lost) stores lost")
        #expect(try tier.value(forKey: keyBytes(stored.count)) == nil)
        // Freeing room makes writes work again.
        try tier.removeAll()
        try tier.set([1, 2, 3], forKey: "after")
        #expect(try tier.value(forKey: "after") == [1, 2, 3])
        try tier.close()
        let reopened = try DiskTier(.init(directory: cache, budget: 1 << 20, bucketCount: 2))
        #expect(try reopened.value(forKey: "after") == [1, 2, 3])
        #expect(reopened.statistics.corruptRecords == 0)
        try reopened.close()
    }
}
