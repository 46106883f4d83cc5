import Magpie
import NIOCore
import NIOPosix

// The server-side scripts of the remote tier, each on keys of one slot (so a cluster routes it like any
// command on its first key).
//
// Every write of the store goes through `change`, which makes the write and publishes its change message
// in one step on the server: nothing can come between them, and a write that did not happen publishes
// nothing. The message goes to the namespace's channel (`<namespace>h~c`; in a cluster, PUBLISH reaches
// every node's subscribers over the cluster bus, in order from each node), numbered in its partition
// (the key's hash slot): a counter in `<namespace>h~s` (one hash: a field per slot, the total "t" and
// the epoch "e") or, in a cluster, one counter per slot (`<namespace>h~s{tag}`, the tag putting it in the
// key's slot).
//
// Sent as EVALSHA with the script's SHA-1 (below, checked against the server's own `SCRIPT LOAD` by the
// tests); a server that does not know it yet (restarted, a new cluster node, a flushed script cache)
// answers NOSCRIPT, and the script then goes once as EVAL, which also caches it there.
//
// A full Redis. Over `maxmemory` with nothing it may evict (a small `maxmemory`, a `volatile-*` policy
// with no volatile keys left, or `noeviction`), Redis refuses every write that may use memory with `OOM`,
// and a script's first such write fails the script. Refused, the bookkeeping would stop with the values:
// the heartbeat (confirmations freeze, every local copy lapses after the staleness bound), the tokens
// (every record judged outdated), the tombstones (a failed write's older value stays, owed, replayed
// into the same refusal). So on Redis 7 and later (the shebang line; Redis 6 cannot compile it, and gets
// the scripts as they were: `serverAllowsOOMFlag`) the writes that free memory or keep a few bytes run
// flagged `allow-oom`: the heartbeat, a removal and a tombstone (which replaces a value), a lease's
// release, and a token's creation or replacement (8 bytes). A value's write is what `maxmemory` is for:
// it stays refused, and the cache then stores the key's tombstone instead (RemoteTier.write).

enum RedisRemoteScript {
    /// A write and its change message: `KEYS[1]` the key, `KEYS[2]` its slot's sequence counter.
    /// `ARGV[1]` the kind: "F" a fenced store (a versioned value: "MV" + 8-byte big-endian version + …,
    /// stored only over an absent, unversioned or older one, and only before the deadline), "S" a plain
    /// store, "N" a plain store only where the key has no value, "D" a removal, "E" a removal only while
    /// the key holds `ARGV[2]`. `ARGV[2]` the value;
    /// `ARGV[3]` its lifetime in ms ("0": none); `ARGV[4]` the deadline, ms since 1970 by the server's
    /// clock ("0": none); `ARGV[5]` the channel; `ARGV[6]` the message's head; `ARGV[7]` the slot's field
    /// in the sequence hash ("": `KEYS[2]` is the slot's own counter); `ARGV[8]` "1" to append the value.
    /// Publishes `head .. sequence .. ":" .. value-or-nothing`, with the hash's epoch after the sequence
    /// (`@` and the digits) on a single server. The epoch (field "e": the server's clock in µs when the
    /// hash was made) is set when the hash is made, and so changes when Redis lost it (evicted) and the
    /// numbering restarts: receivers tell a restart from repeats. Returns 1 when it wrote, 0 when it did not
    /// (an older version, a key already absent, another value), -1 when the deadline has passed.
    /// With a third key (a load lease, on a single server: in a cluster it lies in another slot), first
    /// removes it while it holds `ARGV[9]`, whatever the write then does: the load's holder lands its value
    /// and ends its lease in one call, and the write's message wakes the instances waiting for it (the
    /// release publishes nothing of its own).
    ///
    /// Versions are compared as numbers (the top 48 bits, exact in Lua's doubles, then the low 16),
    /// never as strings: Lua compares strings with `strcoll`, which depends on the server's locale. Only
    /// the fence is read (`GETRANGE`), not the value.
    static let change = """
        if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[9] then redis.call('DEL', KEYS[3]) end
        local kind = ARGV[1]
        local value = ARGV[2]
        if kind == 'F' then
          if ARGV[4] ~= '0' then
            local t = redis.call('TIME')
            if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then return -1 end
          end
          local current = redis.call('GETRANGE', KEYS[1], 0, 9)
          if #current == 10 and string.sub(current, 1, 2) == 'MV' then
            local a1, a2, a3, a4, a5, a6, a7, a8 = string.byte(current, 3, 10)
            local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(value, 3, 10)
            local wallA = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
            local wallB = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
            if wallA > wallB or (wallA == wallB and a7 * 256 + a8 >= b7 * 256 + b8) then return 0 end
          end
        end
        if kind == 'F' or kind == 'S' then
          if ARGV[3] == '0' then redis.call('SET', KEYS[1], value) else redis.call('SET', KEYS[1], value, 'PX', ARGV[3]) end
        elseif kind == 'N' then
          local set
          if ARGV[3] == '0' then set = redis.call('SET', KEYS[1], value, 'NX') else set = redis.call('SET', KEYS[1], value, 'PX', ARGV[3], 'NX') end
          if not set then return 0 end
        elseif kind == 'D' then
          if redis.call('DEL', KEYS[1]) == 0 then return 0 end
        else
          if redis.call('GET', KEYS[1]) ~= value then return 0 end
          redis.call('DEL', KEYS[1])
        end
        local sequence
        local epoch = ''
        if ARGV[7] == '' then
          sequence = redis.call('INCR', KEYS[2])
        else
          if redis.call('EXISTS', KEYS[2]) == 0 then
            local t = redis.call('TIME')
            redis.call('HSET', KEYS[2], 'e', t[1] .. string.format('%06d', tonumber(t[2])))
          end
          sequence = redis.call('HINCRBY', KEYS[2], ARGV[7], 1)
          redis.call('HINCRBY', KEYS[2], 't', 1)
          epoch = '@' .. (redis.call('HGET', KEYS[2], 'e') or '')
        end
        local body = ''
        if ARGV[8] == '1' then body = value end
        redis.call('PUBLISH', ARGV[5], ARGV[6] .. sequence .. epoch .. ':' .. body)
        return 1
        """
    static let changeSHA = "75db80ee44396459e589b1b68f61178fd5444016"
    /// ``change`` flagged `allow-oom` (Redis 7 and later): for every kind but a value's store.
    static let changeAllowingOOM = allowOOMLine + change
    static let changeAllowingOOMSHA = "c674e112f3b93cac5fb88cfa5e200dfeb69c4cef"

    /// Heartbeat with the fleet's delivery watermark, on one master (every key with the same hash tag):
    /// `KEYS[1]` the sequence counters (a single server's hash, whose total it reads), `KEYS[2]` the
    /// watermarks (a sorted set: each instance scored with the instant, by the server's clock, before which
    /// all its writes reached the store), `KEYS[3]` when each instance was last heard of (server clock,
    /// ms), `KEYS[4]` when this script last ran. `ARGV[1]` the instance, `ARGV[2]` its watermark ("-":
    /// not known yet), `ARGV[3]` unused, `ARGV[4]` how long a silent instance is waited for (ms), `ARGV[5]`
    /// a gap between two runs that means the server (or every instance) was stopped (ms): everyone is then
    /// heard of anew, so that nobody is dropped for a silence the server imposed, `ARGV[6]` the
    /// bookkeeping's lifetime (ms), `ARGV[7]` the channel, `ARGV[8]` the heartbeat's message, `ARGV[9]`
    /// "1" to append the total of the sequence counters and their epoch (`:`, the number, `:`, the epoch
    /// or nothing) to it. Publishes the
    /// heartbeat; returns the least watermark of the instances still waited for ("-": none) and the
    /// server's clock (ms), both as strings.
    static let heartbeat = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local last = tonumber(redis.call('GET', KEYS[4]) or '0')
        if last > 0 and now - last > tonumber(ARGV[5]) then
          local members = redis.call('ZRANGE', KEYS[3], 0, -1)
          for i = 1, #members do redis.call('ZADD', KEYS[3], now, members[i]) end
        end
        redis.call('SET', KEYS[4], now, 'PX', ARGV[6])
        redis.call('ZADD', KEYS[3], now, ARGV[1])
        if ARGV[2] ~= '-' then redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1]) end
        local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]))
        for i = 1, #gone do
          redis.call('ZREM', KEYS[3], gone[i])
          redis.call('ZREM', KEYS[2], gone[i])
        end
        redis.call('PEXPIRE', KEYS[2], ARGV[6])
        redis.call('PEXPIRE', KEYS[3], ARGV[6])
        local message = ARGV[8]
        if ARGV[9] == '1' then
          message = message .. ':' .. (redis.call('HGET', KEYS[1], 't') or '0') .. ':' .. (redis.call('HGET', KEYS[1], 'e') or '')
        end
        redis.call('PUBLISH', ARGV[7], message)
        local low = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
        return {low[2] or '-', tostring(now)}
        """
    static let heartbeatSHA = "0b3320d34dc26968e315d0b4f1ad6cf529a6ccfc"
    /// ``heartbeat`` flagged `allow-oom` (Redis 7 and later).
    static let heartbeatAllowingOOM = allowOOMLine + heartbeat
    static let heartbeatAllowingOOMSHA = "70087f212a20ead6464b54c3774c449db2cff6ab"

    /// The value, or the lease (a single server: the two keys lie in different slots): `KEYS[1]` the key,
    /// `KEYS[2]` its load lease; `ARGV[1]` the lease's token, `ARGV[2]` its lifetime (ms, > 0). Returns the
    /// key's value and 0 when it holds one that is not a tombstone (the fence, then "MT"); else nothing
    /// and 1 when it took the lease (none was held), 0 when another holds it. Reads and one `SET NX`: no
    /// message (a lease taken changes nothing a cache holds).
    static let valueOrLease = """
        local v = redis.call('GET', KEYS[1])
        if v and not (#v == 12 and string.sub(v, 1, 2) == 'MV' and string.sub(v, 11, 12) == 'MT') then return {v, 0} end
        if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {false, 1} end
        return {false, 0}
        """
    static let valueOrLeaseSHA = "9b1c0c79fe35cfae93e93bf850b9962e44ee328f"

    /// The shebang line that lets a script run, and write, while the server is over `maxmemory`
    /// (Redis 7 and later; an earlier server cannot compile it).
    static let allowOOMLine = "#!lua flags=allow-oom\n"
}

extension RedisRemoteStore {
    /// Runs a script: EVALSHA, then EVAL when the server does not know it. With `flagged` (the script's
    /// `allow-oom` form: a script that frees memory or keeps a few bytes) on a server that takes the flag,
    /// that form; if the server cannot compile it after all (a connection to an older server than the
    /// newest one), the script as it is, once.
    func evaluate(
        _ script: String, sha: String, flagged: (script: String, sha: String)? = nil, keys: [[UInt8]], _ arguments: [RedisArgument]
    ) async throws -> RESPValue {
        if let flagged, let first = keys.first, serverAllowsOOMFlag(forKey: first) {
            do {
                return try await run(flagged.script, sha: flagged.sha, keys: keys, arguments)
            } catch let error as RedisError where Self.cannotCompileFlag(error) {
                return try await run(script, sha: sha, keys: keys, arguments)
            }
        }
        return try await run(script, sha: sha, keys: keys, arguments)
    }

    private func run(_ script: String, sha: String, keys: [[UInt8]], _ arguments: [RedisArgument]) async throws -> RESPValue {
        do {
            return try await sender.send(Self.scriptCommand(sha, byHash: true, keys: keys, arguments))
        } catch let error as RedisError where error.serverError?.kind == .noScript {
            return try await sender.send(Self.scriptCommand(script, byHash: false, keys: keys, arguments))
        }
    }

    /// EVALSHA `source` (a script's SHA-1, `byHash`) or EVAL `source` (its text) on `keys`.
    static func scriptCommand(_ source: String, byHash: Bool, keys: [[UInt8]], _ arguments: [RedisArgument]) -> RedisCommand {
        RedisCommand(
            byHash ? "EVALSHA" : "EVAL", [.string(source), .integer(Int64(keys.count))] + keys.map { .bytes($0) } + arguments,
            keyIndices: Array(2..<(2 + keys.count)))
    }

    /// Whether the server that holds `key` (a full key) takes scripts flagged `allow-oom`: Redis (or
    /// Valkey) 7 and later, by the `HELLO` of its newest connection. Unknown (no connection yet): no.
    func serverAllowsOOMFlag(forKey key: [UInt8]) -> Bool {
        let major: Int?
        if let cluster {
            major = cluster.serverMajorVersion(owning: RedisHashSlot.slot(of: key))
        } else {
            major = single?.serverMajorVersion
        }
        return (major ?? 0) >= 7
    }

    /// Whether `error` says the server cannot compile a shebang line (Redis 6: a syntax error at `#`).
    static func cannotCompileFlag(_ error: RedisError) -> Bool {
        guard let server = error.serverError, server.kind == .generic else { return false }
        return server.message.contains("compiling script") || server.message.contains("shebang")
    }

    /// The kinds of ``RedisRemoteScript/change``.
    enum ChangeKind: String {
        case fenced = "F"
        case plain = "S"
        case created = "N"
        case removal = "D"
        case removalIfEqual = "E"
    }

    /// Makes a write of the logical key `key` and publishes its change message: whether it wrote (false:
    /// an older version, a key already absent or already holding a value, another value, or a deadline
    /// passed).
    func change(
        _ kind: ChangeKind, _ key: [UInt8], value: [UInt8] = [], lifetime: Int64 = 0, deadline: Int64 = 0, version: UInt64 = 0,
        pushing: Bool = false
    ) async throws -> Bool {
        try await change(changeCall(kind, key, value: value, lifetime: lifetime, deadline: deadline, version: version, pushing: pushing))
    }

    /// Runs one call of the change script: whether it wrote.
    func change(_ call: ChangeCall) async throws -> Bool {
        let plain = Self.changeScript(flagged: false)
        let reply = try await evaluate(
            plain.script, sha: plain.sha, flagged: call.flagged ? Self.changeScript(flagged: true) : nil, keys: call.keys, call.arguments)
        return try Self.changed(reply)
    }

    /// The change script, as it is or flagged `allow-oom`.
    static func changeScript(flagged: Bool) -> (script: String, sha: String) {
        flagged
            ? (RedisRemoteScript.changeAllowingOOM, RedisRemoteScript.changeAllowingOOMSHA)
            : (RedisRemoteScript.change, RedisRemoteScript.changeSHA)
    }

    /// Whether the change script wrote (its reply 1; 0 and -1: it did not).
    static func changed(_ reply: RESPValue) throws -> Bool {
        guard case .integer(let outcome) = reply else { throw RedisError(.unexpectedReply, "a change script answered \(reply)") }
        return outcome == 1
    }

    /// Whether a change of this kind runs even when the server is out of memory (on Redis 7 and later):
    /// every kind but a value's store. A removal frees memory; a tombstone (the fence and "MT", the
    /// cache's layout: RemoteRecord.swift) replaces a value; a plain store or a creation writes a token
    /// (8 bytes; the cache's only plain writes through this script). Taken even when full, they keep the
    /// fence, the tokens and the owed removals working; a value stays refused, and the cache writes its
    /// tombstone instead.
    static func mayWriteWhenFull(_ kind: ChangeKind, value: [UInt8]) -> Bool {
        guard kind == .fenced else { return true }
        return RemoteLeaseRead.isTombstone(value)
    }

    /// The sequence counter of `partition`: a single server's hash, or in a cluster the slot's own key.
    func sequenceKey(_ partition: Int) -> [UInt8] {
        guard cluster != nil else { return prefix + Self.sequenceStem }
        return prefix + Self.sequenceStem + Array("{".utf8) + RedisHashSlot.tag(for: UInt16(partition)) + Array("}".utf8)
    }

    static let sequenceStem = Array("h~s".utf8)
    static let channelStem = Array("h~c".utf8)

    public func storeIfNewer(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool)
        async throws(MagpieError) -> Bool
    {
        guard let call = try fencedCall(value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: pushing, now: now()) else {
            return false  // expired already: nothing newer to store
        }
        do {
            return try await change(call)
        } catch {
            throw failure(error)
        }
    }

    public func storeIfNewer(
        _ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64, pushing: Bool, releasing lease: [UInt8], token: [UInt8]
    ) async throws(MagpieError) -> Bool {
        // In a cluster the lease lies in another slot than the record (no script may touch both); a write
        // that expired already sends nothing: the release goes apart.
        guard cluster == nil, var call = try fencedCall(value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: pushing, now: now())
        else {
            return try await storeIfNewerThenRelease(
                value, forKey: key, expiresAt: expiresAt, notAfter: notAfter, pushing: pushing, releasing: lease, token: token)
        }
        call.keys.append(prefix + lease)
        call.arguments.append(.bytes(token))
        do {
            return try await change(call)
        } catch {
            throw failure(error)
        }
    }

    public func valueOrLease(forKey key: [UInt8], lease: [UInt8], token: [UInt8], expiresAt: Int64) async throws(MagpieError)
        -> RemoteLeaseRead
    {
        // In a cluster the lease lies in another slot than the record: separate calls.
        let lifetime = expiresAt - now()
        guard cluster == nil, lifetime > 0 else {
            return try await valueThenLease(forKey: key, lease: lease, token: token, expiresAt: expiresAt)
        }
        do {
            let script = (RedisRemoteScript.valueOrLease, RedisRemoteScript.valueOrLeaseSHA)
            let reply = try await evaluate(script.0, sha: script.1, keys: [prefix + key, prefix + lease], [.bytes(token), .integer(lifetime)])
            guard case .array(let parts) = reply, parts.count == 2, case .integer(let taken) = parts[1] else {
                throw RedisError(.unexpectedReply, "the value-or-lease script answered \(reply)")
            }
            // Lua's false is a null in RESP2 and a boolean in RESP3.
            let value = parts[0] == .boolean(false) ? nil : try Self.bytes(parts[0])
            return RemoteLeaseRead(value: value, leased: taken == 1)
        } catch {
            throw failure(error)
        }
    }

    public func remove(_ key: [UInt8], ifValue value: [UInt8]) async throws(MagpieError) -> Bool {
        do {
            return try await change(.removalIfEqual, key, value: value)
        } catch {
            throw failure(error)
        }
    }

    public var callerMayWait: Bool { MultiThreadedEventLoopGroup.currentEventLoop == nil }
}

/// The version in a versioned value's fence ("MV" + 8 bytes big endian).
enum RemoteChangeFence {
    static func version(_ bytes: [UInt8]) -> UInt64? {
        guard bytes.count >= 10, bytes[0] == 0x4D, bytes[1] == 0x56 else { return nil }
        return bytes[2..<10].reduce(0) { $0 << 8 | UInt64($1) }
    }
}

/// A change message as the scripts publish it:
///
///     "MC"  kind (1 byte: "W" a versioned write, "P" a plain one)  origin (8)  version (u64 BE)
///     partition (u16 LE)  key length (u16 LE)  key  sequence (decimal)  ["@" epoch (decimal)]  ":"
///     value (pushed; else none)
///
/// and a heartbeat: `"MCH" instance ":" number [":" total ":" epoch]` (the epoch may be empty: no
/// sequence hash). The epoch is the sequence hash's (RedisRemoteScript.change), on a single server only.
enum ChangeMessageFormat {
    enum Kind: UInt8 {
        case versioned = 0x57  // "W"
        case plain = 0x50  // "P"
        case heartbeat = 0x48  // "H"
    }

    static let headLength = 23

    /// The head the script completes with the sequence number and the value.
    static func head(kind: Kind, origin: [UInt8], version: UInt64, partition: Int, key: [UInt8]) -> [UInt8] {
        var bytes = [UInt8]()
        bytes.reserveCapacity(headLength + key.count)
        bytes += [0x4D, 0x43, kind.rawValue]
        bytes += origin
        withUnsafeBytes(of: version.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: UInt16(truncatingIfNeeded: partition).littleEndian) { bytes += $0 }
        withUnsafeBytes(of: UInt16(truncatingIfNeeded: key.count).littleEndian) { bytes += $0 }
        bytes += key
        return bytes
    }

    /// A published message, read back: a change, or a heartbeat (instance, number, total, epoch), or nil
    /// for anything else. An epoch of nil: none given.
    enum Parsed {
        case change(
            origin: ArraySlice<UInt8>, version: UInt64, partition: Int, key: [UInt8], sequence: UInt64, epoch: UInt64?, value: [UInt8]?)
        case heartbeat(instance: Substring, number: UInt64, total: UInt64?, epoch: UInt64?)
    }

    static func parse(_ bytes: [UInt8]) -> Parsed? {
        guard bytes.count >= 3, bytes[0] == 0x4D, bytes[1] == 0x43 else { return nil }
        if bytes[2] == Kind.heartbeat.rawValue {
            let fields = String(decoding: bytes[3...], as: UTF8.self).split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count >= 2, let number = UInt64(fields[1]) else { return nil }
            return .heartbeat(
                instance: fields[0], number: number, total: fields.count > 2 ? UInt64(fields[2]) : nil,
                epoch: fields.count > 3 ? UInt64(fields[3]) : nil)
        }
        guard bytes.count >= headLength, bytes[2] == Kind.versioned.rawValue || bytes[2] == Kind.plain.rawValue else { return nil }
        let version = bytes[11..<19].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let partition = Int(bytes[19]) | Int(bytes[20]) << 8
        let keyLength = Int(bytes[21]) | Int(bytes[22]) << 8
        let keyEnd = headLength + keyLength
        guard keyEnd < bytes.count, let colon = bytes[keyEnd...].firstIndex(of: 0x3A), colon > keyEnd else { return nil }
        let at = bytes[keyEnd..<colon].firstIndex(of: 0x40)  // "@"
        guard let sequence = decimal(bytes[keyEnd..<(at ?? colon)]) else { return nil }
        var epoch: UInt64? = nil
        if let at, at + 1 < colon {
            guard let number = decimal(bytes[(at + 1)..<colon]) else { return nil }
            epoch = number
        }
        let value = colon + 1 < bytes.count ? Array(bytes[(colon + 1)...]) : nil
        return .change(
            origin: bytes[3..<11], version: version, partition: partition, key: Array(bytes[headLength..<keyEnd]), sequence: sequence,
            epoch: epoch, value: value)
    }

    /// The number `digits` spell in decimal; nil for anything else, or past `UInt64.max`.
    private static func decimal(_ digits: ArraySlice<UInt8>) -> UInt64? {
        var number: UInt64 = 0
        for digit in digits {
            guard digit >= 0x30, digit <= 0x39 else { return nil }
            let (times, overflow) = number.multipliedReportingOverflow(by: 10)
            guard !overflow else { return nil }
            let (sum, carried) = times.addingReportingOverflow(UInt64(digit - 0x30))
            guard !carried else { return nil }
            number = sum
        }
        return number
    }
}
