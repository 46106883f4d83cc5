import CLMDB
import Foundation

/// LMDB configured as a cache would use it: map size = the byte budget, `MDB_WRITEMAP | MDB_NOSYNC`
/// (writes go through the shared mapping, commits do not fsync: a crash may lose recent writes, as a
/// cache allows), one write transaction per store, and one reused read transaction
/// (`mdb_txn_reset` / `mdb_txn_renew`) for gets.
///
/// LMDB has no eviction, so the adapter does it, oldest-stored first, the way LMDB caches do: a second
/// database `order` maps a store sequence number (`MDB_INTEGERKEY`) to the key, and each value is
/// stored behind its 8-byte sequence number so that replacing a key drops its old `order` entry. When
/// the pages in use (`mdb_stat`) pass 9/10 of the map, or a store fails with `MDB_MAP_FULL`, the
/// adapter deletes the oldest entries until about 1/20 of the map is freed (in one transaction), then
/// stores. The headroom is needed: a deletion in a full map fails too. That work is inside the store's
/// measured time, and is also counted apart (`eviction_seconds`, `evicted_entries`).
///
/// Bytes on disk: with `MDB_WRITEMAP` LMDB sizes `data.mdb` to the map at open, so the file is the
/// budget from the start; `lock.mdb` (8 KiB) is the slack.
final class LMDBDisk: DiskSystem {
    let directory: String
    let budget: Int
    // Invariants: `env` is non-nil from `init` until `close()`; `values` and `order` are valid handles
    // of that environment; `reader` is nil or a reset read transaction of it (renewed for each get,
    // reset after). No write transaction outlives the call that began it.
    private var env: OpaquePointer?
    private var values: MDB_dbi = 0
    private var order: MDB_dbi = 0
    private var reader: OpaquePointer?
    private var sequence: UInt64 = 0
    private(set) var evictedEntries = 0
    private(set) var evictionNanoseconds: UInt64 = 0
    private(set) var evictionRounds = 0
    var name: String { "lmdb" }

    static let flags = UInt32(MDB_WRITEMAP) | UInt32(MDB_NOSYNC) | UInt32(MDB_NOMETASYNC)

    var slackBytes: Int { 64 << 10 }

    var configuration: String {
        "\(String(cString: mdb_version(nil, nil, nil))): mapsize=\(budget), MDB_WRITEMAP|MDB_NOSYNC|MDB_NOMETASYNC, "
            + "a write txn per set, a reused read txn for gets; no eviction in LMDB: the bench deletes oldest-stored "
            + "entries (a sequence-number index), 1/20 of the map at a time, when pages in use pass 9/10 of the map; timed within the set"
    }

    init(directory: String, budget: Int) throws {
        self.directory = directory
        self.budget = budget
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var env: OpaquePointer?
        try check(mdb_env_create(&env), "mdb_env_create")
        self.env = env
        try check(mdb_env_set_mapsize(env, budget), "mdb_env_set_mapsize")
        try check(mdb_env_set_maxdbs(env, 2), "mdb_env_set_maxdbs")
        try check(mdb_env_open(env, directory, Self.flags, 0o600), "mdb_env_open")
        var txn: OpaquePointer?
        try check(mdb_txn_begin(env, nil, 0, &txn), "mdb_txn_begin")
        do {
            try check(mdb_dbi_open(txn, "values", UInt32(MDB_CREATE), &values), "mdb_dbi_open values")
            try check(mdb_dbi_open(txn, "order", UInt32(MDB_CREATE | MDB_INTEGERKEY), &order), "mdb_dbi_open order")
            // The next sequence number: one past the last in `order` (after a reopen too).
            var cursor: OpaquePointer?
            try check(mdb_cursor_open(txn, order, &cursor), "mdb_cursor_open")
            var key = MDB_val()
            var data = MDB_val()
            if mdb_cursor_get(cursor, &key, &data, MDB_LAST) == 0, key.mv_size == 8 {
                sequence = key.mv_data.loadUnaligned(as: UInt64.self) + 1
            }
            mdb_cursor_close(cursor)
            try check(mdb_txn_commit(txn), "mdb_txn_commit")
        } catch {
            mdb_txn_abort(txn)
            throw error
        }
    }

    private func check(_ status: Int32, _ what: String) throws {
        if status != 0 {
            throw PeerError(system: "lmdb", message: "\(what): \(String(cString: mdb_strerror(status)))")
        }
    }

    func set(_ value: [UInt8], key: String) -> Bool {
        guard env != nil else { return false }
        // Evict before the map is full: deleting from a full map fails too (a deletion copies the pages
        // it changes, and needs free ones), so LMDB caches keep headroom. 1/10 of the map is kept free.
        if usedBytes() > budget - budget / 10 { _ = evictOldest() }
        for _ in 0..<64 {
            let status = store(value, key: key)
            if status == 0 { return true }
            guard status == MDB_MAP_FULL, evictOldest() else { return false }
        }
        return false
    }

    /// Pages in use by both databases (branch, leaf and overflow pages, from `mdb_stat`), in bytes.
    private func usedBytes() -> Int {
        guard beginRead() else { return 0 }
        defer { mdb_txn_reset(reader) }
        var total = 0
        for dbi in [values, order] {
            var stat = MDB_stat()
            guard mdb_stat(reader, dbi, &stat) == 0 else { continue }
            total += (stat.ms_branch_pages + stat.ms_leaf_pages + stat.ms_overflow_pages) * Int(stat.ms_psize)
        }
        return total
    }

    /// Renews (or begins) the reused read transaction; the caller resets it.
    private func beginRead() -> Bool {
        if let reader { return mdb_txn_renew(reader) == 0 }
        return mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &reader) == 0
    }

    /// One write transaction: drops the key's previous `order` entry, stores sequence ‖ value, and the
    /// new `order` entry. Returns LMDB's status (the transaction is aborted on any failure).
    private func store(_ value: [UInt8], key: String) -> Int32 {
        var txn: OpaquePointer?
        var status = mdb_txn_begin(env, nil, 0, &txn)
        guard status == 0 else { return status }
        let number = sequence
        var key = key
        status = key.withUTF8 { k -> Int32 in
            // `k` is borrowed for the transaction's puts, which copy it into the map.
            var name = MDB_val(mv_size: k.count, mv_data: UnsafeMutableRawPointer(mutating: k.baseAddress))
            var old = MDB_val()
            if mdb_get(txn, values, &name, &old) == 0, old.mv_size >= 8 {
                var oldNumber = old.mv_data.loadUnaligned(as: UInt64.self)
                withUnsafeMutableBytes(of: &oldNumber) { number in
                    var oldKey = MDB_val(mv_size: 8, mv_data: number.baseAddress)
                    _ = mdb_del(txn, order, &oldKey, nil)
                }
            }
            // MDB_RESERVE: LMDB hands back room in the map for the record; we copy into it directly.
            var data = MDB_val(mv_size: 8 + value.count, mv_data: nil)
            let status = mdb_put(txn, values, &name, &data, UInt32(MDB_RESERVE))
            guard status == 0, let room = data.mv_data else { return status }
            room.storeBytes(of: number, as: UInt64.self)
            value.withUnsafeBytes { bytes in
                if let base = bytes.baseAddress { (room + 8).copyMemory(from: base, byteCount: bytes.count) }
            }
            var numberValue = number
            return withUnsafeMutableBytes(of: &numberValue) { number in
                var orderKey = MDB_val(mv_size: 8, mv_data: number.baseAddress)
                return mdb_put(txn, order, &orderKey, &name, 0)
            }
        }
        guard status == 0 else {
            mdb_txn_abort(txn)
            return status
        }
        status = mdb_txn_commit(txn)
        if status == 0 { sequence += 1 }
        return status
    }

    /// Deletes the oldest-stored entries until about 1/20 of the map is freed (or nothing is left), in
    /// one write transaction. False if nothing could be deleted.
    private func evictOldest() -> Bool {
        let start = nowNanoseconds()
        defer {
            evictionNanoseconds += nowNanoseconds() - start
            evictionRounds += 1
        }
        var txn: OpaquePointer?
        guard mdb_txn_begin(env, nil, 0, &txn) == 0 else { return false }
        var cursor: OpaquePointer?
        guard mdb_cursor_open(txn, order, &cursor) == 0 else {
            mdb_txn_abort(txn)
            return false
        }
        var freed = 0
        var deleted = 0
        var number = MDB_val()
        var name = MDB_val()
        while freed < budget / 20, mdb_cursor_get(cursor, &number, &name, MDB_FIRST) == 0 {
            var stored = MDB_val()
            if mdb_get(txn, values, &name, &stored) == 0 { freed += stored.mv_size + name.mv_size }
            if mdb_del(txn, values, &name, nil) != 0 && stored.mv_size > 0 { break }
            guard mdb_cursor_del(cursor, 0) == 0 else { break }
            deleted += 1
        }
        mdb_cursor_close(cursor)
        guard deleted > 0, mdb_txn_commit(txn) == 0 else {
            if deleted == 0 { mdb_txn_abort(txn) }
            return false
        }
        evictedEntries += deleted
        return true
    }

    func get(_ key: String) -> [UInt8]? {
        guard env != nil, beginRead() else { return nil }
        // The value's bytes live in the map and are valid only while the read transaction is: copied
        // out before the reset.
        defer { mdb_txn_reset(reader) }
        var key = key
        return key.withUTF8 { k -> [UInt8]? in
            var name = MDB_val(mv_size: k.count, mv_data: UnsafeMutableRawPointer(mutating: k.baseAddress))
            var data = MDB_val()
            guard mdb_get(reader, values, &name, &data) == 0, data.mv_size >= 8, let base = data.mv_data else { return nil }
            return [UInt8](UnsafeRawBufferPointer(start: base + 8, count: data.mv_size - 8))
        }
    }

    func close() {
        guard let env else { return }
        if let reader { mdb_txn_abort(reader) }
        reader = nil
        mdb_env_close(env)
        self.env = nil
    }

    deinit { close() }

    func extra() -> [String: JSONValue] {
        [
            "configuration": .string(configuration), "slack_bytes": .int(slackBytes),
            "evicted_entries": .int(evictedEntries), "eviction_rounds": .int(evictionRounds),
            "eviction_seconds": .double(Double(evictionNanoseconds) / 1e9),
        ]
    }
}
