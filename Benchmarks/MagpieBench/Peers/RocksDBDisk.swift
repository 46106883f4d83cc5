import CRocksDB
import Foundation

/// RocksDB through its C API, configured as a disk cache is usually configured with it:
///
/// - no write-ahead log (a cache may lose its last writes in a crash; RocksDB flushes the memtable on a
///   clean close, so nothing is lost then);
/// - FIFO compaction with `max_table_files_size` = the byte budget: when the SST files pass it, the
///   oldest file is deleted whole (RocksDB's own eviction, oldest-written first, no read of old data);
/// - LZ4 block compression (RocksDB's default choice for hot data; zstd costs more to read);
/// - Bloom filters of 10 bits per key: FIFO keeps every file in L0, so a get without them would search
///   each file in turn (the usual setting; a miss in the eviction-heavy workload costs one probe each);
/// - a small (8 MiB) LRU block cache, because this measures the disk tier alone and the page cache
///   already holds the files;
/// - a memtable of budget / 16 (at most 64 MiB, RocksDB's default), so that the memtable and the file
///   being flushed stay a small part of the budget; the L0 stall triggers raised, as FIFO keeps every
///   file in L0 (with the defaults, 20 / 36 files would throttle and then stop writes).
///
/// Bytes on disk may pass the budget by what FIFO has not deleted yet: about one memtable flush plus
/// the MANIFEST, OPTIONS and LOG files (the adapter's `slackBytes`).
final class RocksDBDisk: DiskSystem {
    let directory: String
    let budget: Int
    // Invariant: every handle below is non-nil from `init` until `close()`, which destroys each once
    // and sets `db` to nil; every call checks `db` first.
    private var db: OpaquePointer?
    private let options: OpaquePointer
    private let tableOptions: OpaquePointer
    private let blockCache: OpaquePointer
    private let fifo: OpaquePointer
    private let writeOptions: OpaquePointer
    private let readOptions: OpaquePointer
    var name: String { "rocksdb" }

    static let blockCacheBytes = 8 << 20

    /// The memtable size for a budget: budget / 16, between 256 KiB and 64 MiB.
    static func memtableBytes(budget: Int) -> Int { min(max(budget / 16, 256 << 10), 64 << 20) }

    /// What may sit on disk above the budget: two memtables' worth of SST not yet deleted by FIFO, and
    /// 1 MiB for MANIFEST, OPTIONS and LOG.
    var slackBytes: Int { 2 * Self.memtableBytes(budget: budget) + (1 << 20) }

    var configuration: String {
        "RocksDB \(Self.version) C API: WAL off, FIFO compaction max_table_files_size=\(budget), LZ4 blocks, Bloom 10 bits/key, "
            + "block cache 8 MiB LRU (disk tier alone), write_buffer_size=\(Self.memtableBytes(budget: budget)), "
            + "L0 triggers 1000/2000, info log WARN, get via rocksdb_get_pinned"
    }

    static var version: String {
        // The package's version: librocksdb-dev's pkg-config file, read once.
        let text = (try? String(contentsOfFile: "/usr/lib/x86_64-linux-gnu/pkgconfig/rocksdb.pc", encoding: .utf8)) ?? ""
        return text.split(separator: "\n").first { $0.hasPrefix("Version:") }.map {
            $0.dropFirst("Version:".count).trimmingCharacters(in: .whitespaces)
        } ?? "?"
    }

    init(directory: String, budget: Int) throws {
        self.directory = directory
        self.budget = budget
        options = rocksdb_options_create()
        rocksdb_options_set_create_if_missing(options, 1)
        rocksdb_options_set_compaction_style(options, Int32(rocksdb_fifo_compaction))
        fifo = rocksdb_fifo_compaction_options_create()
        rocksdb_fifo_compaction_options_set_max_table_files_size(fifo, UInt64(budget))
        rocksdb_options_set_fifo_compaction_options(options, fifo)
        rocksdb_options_set_compression(options, Int32(rocksdb_lz4_compression))
        rocksdb_options_set_write_buffer_size(options, Self.memtableBytes(budget: budget))
        rocksdb_options_set_level0_slowdown_writes_trigger(options, 1000)
        rocksdb_options_set_level0_stop_writes_trigger(options, 2000)
        rocksdb_options_set_max_background_jobs(options, 2)
        rocksdb_options_set_info_log_level(options, 2)  // WARN
        rocksdb_options_set_keep_log_file_num(options, 1)
        tableOptions = rocksdb_block_based_options_create()
        blockCache = rocksdb_cache_create_lru(Self.blockCacheBytes)
        rocksdb_block_based_options_set_block_cache(tableOptions, blockCache)
        // The table options own the filter policy from here on (destroyed with them).
        rocksdb_block_based_options_set_filter_policy(tableOptions, rocksdb_filterpolicy_create_bloom(10))
        rocksdb_options_set_block_based_table_factory(options, tableOptions)
        writeOptions = rocksdb_writeoptions_create()
        rocksdb_writeoptions_disable_WAL(writeOptions, 1)
        readOptions = rocksdb_readoptions_create()
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var error: UnsafeMutablePointer<CChar>?
        db = rocksdb_open(options, directory, &error)
        if let error {
            let message = String(cString: error)
            rocksdb_free(error)
            destroyOptions()
            throw PeerError(system: "rocksdb", message: message)
        }
    }

    private func destroyOptions() {
        rocksdb_readoptions_destroy(readOptions)
        rocksdb_writeoptions_destroy(writeOptions)
        rocksdb_options_destroy(options)
        rocksdb_block_based_options_destroy(tableOptions)
        rocksdb_cache_destroy(blockCache)
        rocksdb_fifo_compaction_options_destroy(fifo)
    }

    func set(_ value: [UInt8], key: String) -> Bool {
        guard let db else { return false }
        var error: UnsafeMutablePointer<CChar>?
        var key = key
        // The key's and the value's bytes are only borrowed for the call: rocksdb_put copies them into
        // the memtable before it returns.
        key.withUTF8 { k in
            value.withUnsafeBufferPointer { v in
                k.withMemoryRebound(to: CChar.self) { k in
                    v.withMemoryRebound(to: CChar.self) { v in
                        rocksdb_put(db, writeOptions, k.baseAddress, k.count, v.baseAddress, v.count, &error)
                    }
                }
            }
        }
        if let error {
            rocksdb_free(error)
            return false
        }
        return true
    }

    func get(_ key: String) -> [UInt8]? {
        guard let db else { return nil }
        var error: UnsafeMutablePointer<CChar>?
        var key = key
        let slice = key.withUTF8 { k in
            k.withMemoryRebound(to: CChar.self) { k in
                rocksdb_get_pinned(db, readOptions, k.baseAddress, k.count, &error)
            }
        }
        if let error {
            rocksdb_free(error)
            return nil
        }
        guard let slice else { return nil }  // not found
        // The pinned slice's bytes stay valid until rocksdb_pinnableslice_destroy: copied out before it.
        defer { rocksdb_pinnableslice_destroy(slice) }
        var length = 0
        guard let bytes = rocksdb_pinnableslice_value(slice, &length) else { return nil }
        return [UInt8](UnsafeRawBufferPointer(start: bytes, count: length))
    }

    func close() {
        guard let db else { return }
        rocksdb_close(db)  // flushes the memtable (no WAL) before it returns
        self.db = nil
        destroyOptions()
    }

    deinit { close() }

    func extra() -> [String: JSONValue] {
        ["configuration": .string(configuration), "slack_bytes": .int(slackBytes)]
    }
}

/// A peer that failed to open or to run.
struct PeerError: Error, CustomStringConvertible {
    var system: String
    var message: String
    var description: String { "\(system): \(message)" }
}
