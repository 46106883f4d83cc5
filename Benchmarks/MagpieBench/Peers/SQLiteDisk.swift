import CSQLite
import Foundation

/// SQLite set up the way python's `diskcache` sets it up (its defaults: `journal_mode=WAL`,
/// `synchronous=NORMAL`, `auto_vacuum=FULL`, `cache_size=8192` pages, `mmap_size=64 MiB`), with one
/// table of key, value, store time, access time and size, an index on the store time, and diskcache's
/// default eviction (`least-recently-stored`): after each store, while the database's volume
/// (`page_count × page_size`, diskcache's `volume()`) is above the size limit, delete the 10 oldest rows
/// (its `cull_limit`). With `auto_vacuum=FULL` the freed pages leave the file at each commit.
///
/// One difference, stated: diskcache writes values of 32 KiB and more to files of their own; here every
/// value is in the table, as the single table asks.
///
/// Bytes on disk: the database file is held to the limit; the WAL file (checkpointed every 1,000 pages,
/// reused rather than truncated, `journal_size_limit` 4 MiB) and `-shm` come on top: the slack.
final class SQLiteDisk: DiskSystem {
    let directory: String
    let budget: Int
    // Invariants: `db` and every statement are non-nil from `init` until `close()`, which finalizes
    // each statement once, then closes the database; a statement is reset after each use.
    private var db: OpaquePointer?
    private var insert: OpaquePointer?
    private var select: OpaquePointer?
    private var pageCount: OpaquePointer?
    private var cull: OpaquePointer?
    private var pageSize = 4096
    private(set) var culledRows = 0
    private(set) var cullNanoseconds: UInt64 = 0
    var name: String { "sqlite" }

    /// The WAL's bound (journal_size_limit) plus the -shm file and the last autocheckpoint's pages.
    var slackBytes: Int { (4 << 20) + (1 << 20) + (64 << 10) }

    var configuration: String {
        "SQLite \(String(cString: sqlite3_libversion())) as python diskcache: journal_mode=WAL, synchronous=NORMAL, "
            + "auto_vacuum=FULL, cache_size=8192, mmap_size=64 MiB, journal_size_limit=4 MiB; table (key, store_time, "
            + "access_time, size, value) + index on store_time; after each set, while page_count×page_size > \(budget), "
            + "delete the 10 oldest-stored rows (diskcache's least-recently-stored cull); all values in the table"
    }

    init(directory: String, budget: Int) throws {
        self.directory = directory
        self.budget = budget
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var db: OpaquePointer?
        let status = sqlite3_open_v2(directory + "/cache.db", &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil)
        self.db = db
        guard status == SQLITE_OK else { throw error("open") }
        // auto_vacuum must be set before the first table exists (a no-op on an existing database).
        try execute(
            """
            PRAGMA auto_vacuum = FULL; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
            PRAGMA cache_size = 8192; PRAGMA mmap_size = 67108864; PRAGMA journal_size_limit = 4194304;
            CREATE TABLE IF NOT EXISTS cache (rowid INTEGER PRIMARY KEY, key BLOB UNIQUE NOT NULL,
              store_time REAL NOT NULL, access_time REAL NOT NULL, size INTEGER NOT NULL, value BLOB);
            CREATE INDEX IF NOT EXISTS cache_store_time ON cache (store_time);
            """)
        insert = try prepare(
            "INSERT OR REPLACE INTO cache (key, store_time, access_time, size, value) VALUES (?1, ?2, ?2, ?3, ?4)")
        select = try prepare("SELECT value FROM cache WHERE key = ?1")
        pageCount = try prepare("PRAGMA page_count")
        cull = try prepare("DELETE FROM cache WHERE rowid IN (SELECT rowid FROM cache ORDER BY store_time LIMIT 10)")
        let size = try prepare("PRAGMA page_size")
        if sqlite3_step(size) == SQLITE_ROW { pageSize = Int(sqlite3_column_int64(size, 0)) }
        sqlite3_finalize(size)
    }

    private func error(_ what: String) -> PeerError {
        PeerError(system: "sqlite", message: "\(what): \(db.map { String(cString: sqlite3_errmsg($0)) } ?? "no database")")
    }

    private func execute(_ sql: String) throws {
        guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else { throw error(sql) }
    }

    private func prepare(_ sql: String) throws -> OpaquePointer? {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK else {
            throw error(sql)
        }
        return statement
    }

    /// The database's volume as diskcache computes it: page_count × page_size.
    private func volume() -> Int {
        defer { sqlite3_reset(pageCount) }
        return sqlite3_step(pageCount) == SQLITE_ROW ? Int(sqlite3_column_int64(pageCount, 0)) * pageSize : 0
    }

    func set(_ value: [UInt8], key: String) -> Bool {
        guard db != nil else { return false }
        var key = key
        // SQLITE_STATIC (a nil destructor): the bound bytes are borrowed only until the step below,
        // inside these closures, and the bindings are cleared before the buffers go away.
        let status = key.withUTF8 { k in
            value.withUnsafeBytes { v -> Int32 in
                sqlite3_bind_blob(insert, 1, k.baseAddress, Int32(k.count), nil)
                sqlite3_bind_double(insert, 2, Date().timeIntervalSince1970)
                sqlite3_bind_int64(insert, 3, Int64(v.count))
                // An empty value is an empty blob, not NULL (which a nil pointer would bind).
                if let base = v.baseAddress, v.count > 0 {
                    sqlite3_bind_blob(insert, 4, base, Int32(v.count), nil)
                } else {
                    sqlite3_bind_zeroblob(insert, 4, 0)
                }
                defer {
                    sqlite3_reset(insert)
                    sqlite3_clear_bindings(insert)
                }
                return sqlite3_step(insert)
            }
        }
        guard status == SQLITE_DONE else { return false }
        // diskcache culls after the store, inside the set call: its time is the store's.
        if volume() > budget {
            let start = nowNanoseconds()
            repeat {
                let step = sqlite3_step(cull)
                sqlite3_reset(cull)
                guard step == SQLITE_DONE, sqlite3_changes(db) > 0 else { break }
                culledRows += Int(sqlite3_changes(db))
            } while volume() > budget
            cullNanoseconds += nowNanoseconds() - start
        }
        return true
    }

    func get(_ key: String) -> [UInt8]? {
        guard db != nil else { return nil }
        var key = key
        return key.withUTF8 { k -> [UInt8]? in
            sqlite3_bind_blob(select, 1, k.baseAddress, Int32(k.count), nil)
            defer {
                sqlite3_reset(select)
                sqlite3_clear_bindings(select)
            }
            guard sqlite3_step(select) == SQLITE_ROW else { return nil }
            // The column's bytes are valid until the statement is reset: copied out first.
            let count = Int(sqlite3_column_bytes(select, 0))
            guard count > 0, let bytes = sqlite3_column_blob(select, 0) else { return [] }
            return [UInt8](UnsafeRawBufferPointer(start: bytes, count: count))
        }
    }

    func close() {
        guard let db else { return }
        for statement in [insert, select, pageCount, cull] { sqlite3_finalize(statement) }
        (insert, select, pageCount, cull) = (nil, nil, nil, nil)
        sqlite3_close_v2(db)
        self.db = nil
    }

    deinit { close() }

    func extra() -> [String: JSONValue] {
        [
            "configuration": .string(configuration), "slack_bytes": .int(slackBytes),
            "evicted_entries": .int(culledRows), "eviction_seconds": .double(Double(cullNanoseconds) / 1e9),
        ]
    }
}
