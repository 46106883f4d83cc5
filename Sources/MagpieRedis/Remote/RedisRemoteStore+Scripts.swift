import Magpie
import NIOCore
import NIOPosix

// The server-side scripts of the remote tier, each on one key or on keys of one hash tag (so a cluster
// routes it like any command on that key, and change tracking reports the writes it makes).
//
// Sent as EVALSHA with the script's SHA-1 (below, checked against the server's own `SCRIPT LOAD` by the
// tests); a server that does not know it yet (restarted, a new cluster node, a flushed script cache)
// answers NOSCRIPT, and the script then goes once as EVAL, which also caches it there.

enum RedisRemoteScript {
    /// Fenced store: `KEYS[1]` the key; `ARGV[1]` the versioned value ("MV" + 8-byte big-endian version
    /// + …); `ARGV[2]` its lifetime in ms ("0": none); `ARGV[3]` the deadline, ms since 1970 by the
    /// server's clock ("0": none). Returns 1 when stored, 0 when the key holds this version or a newer
    /// one, -1 when the deadline has passed.
    ///
    /// The versions are compared as numbers (the top 48 bits, exact in Lua's doubles, then the low
    /// 16), never as strings: Lua compares strings with `strcoll`, which depends on the server's locale.
    /// A value without the "MV" fence (absent, or written by something else) is older than any version.
    static let fencedStore = """
        local fence = ARGV[1]
        if ARGV[3] ~= '0' then
          local t = redis.call('TIME')
          if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[3]) then return -1 end
        end
        local current = redis.call('GET', KEYS[1])
        if current and #current >= 10 and string.sub(current, 1, 2) == 'MV' then
          local a1, a2, a3, a4, a5, a6, a7, a8 = string.byte(current, 3, 10)
          local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(fence, 3, 10)
          local wallA = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
          local wallB = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
          if wallA > wallB or (wallA == wallB and a7 * 256 + a8 >= b7 * 256 + b8) then return 0 end
        end
        if ARGV[2] == '0' then redis.call('SET', KEYS[1], fence) else redis.call('SET', KEYS[1], fence, 'PX', ARGV[2]) end
        return 1
        """
    static let fencedStoreSHA = "ff62f5523ea2f50c6260de5512b7b6f91c49ba4a"

    /// Compare and delete: `KEYS[1]` the key, `ARGV[1]` the value it must hold. Returns 1 when removed.
    static let removeIfEqual = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
    static let removeIfEqualSHA = "d02e481a9c91ceec59c5822a58a49d5d5d7ac80b"

    /// Heartbeat with the fleet's delivery watermark, on one master (every key with the same hash tag):
    /// `KEYS[1]` the heartbeat key (reported on every feed), `KEYS[2]` the watermarks (a sorted set:
    /// each instance scored with the instant, by the server's clock, before which all its writes reached
    /// the store), `KEYS[3]` when each instance was last heard of (server clock, ms), `KEYS[4]` when
    /// this script last ran. `ARGV[1]` the instance, `ARGV[2]` its watermark ("-": not known yet),
    /// `ARGV[3]` the heartbeat's lifetime (ms), `ARGV[4]` how long a silent instance is waited for (ms),
    /// `ARGV[5]` a gap between two runs that means the server (or every instance) was stopped (ms):
    /// everyone is then heard of anew, so that nobody is dropped for a silence the server imposed,
    /// `ARGV[6]` the bookkeeping's lifetime (ms). Returns the least watermark of the instances still
    /// waited for ("-": none) and the server's clock (ms), both as strings.
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
        redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
        local low = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
        return {low[2] or '-', tostring(now)}
        """
    static let heartbeatSHA = "b3328aaadfb5f65fd688e7f71ed3725526f75aab"
}

extension RedisRemoteStore {
    /// Runs a script on one key: EVALSHA, then EVAL when the server does not know it.
    func evaluate(_ script: String, sha: String, key: [UInt8], _ arguments: [RedisArgument]) async throws -> RESPValue {
        let evalsha = RedisCommand("EVALSHA", [.string(sha), 1, .bytes(key)] + arguments, keyIndices: [2])
        do {
            return try await sender.send(evalsha)
        } catch let error as RedisError where error.serverError?.kind == .noScript {
            return try await sender.send(RedisCommand("EVAL", [.string(script), 1, .bytes(key)] + arguments, keyIndices: [2]))
        }
    }

    public func storeIfNewer(_ value: [UInt8], forKey key: [UInt8], expiresAt: Int64, notAfter: Int64) async throws(MagpieError)
        -> Bool
    {
        guard value.count >= 10, value[0] == 0x4D, value[1] == 0x56 else {
            throw MagpieError(.invalidConfiguration, "a versioned value must start with \"MV\" and its 8-byte version")
        }
        var lifetime: Int64 = 0
        if expiresAt != 0 {
            lifetime = expiresAt - now()
            guard lifetime > 0 else { return false }  // expired already: nothing newer to store
        }
        do {
            let reply = try await evaluate(
                RedisRemoteScript.fencedStore, sha: RedisRemoteScript.fencedStoreSHA, key: prefix + key,
                [.bytes(value), .integer(lifetime), .integer(max(0, notAfter))])
            guard case .integer(let outcome) = reply else { throw RedisError(.unexpectedReply, "the fenced store answered \(reply)") }
            return outcome == 1
        } catch {
            throw Self.unavailable(error)
        }
    }

    public func remove(_ key: [UInt8], ifValue value: [UInt8]) async throws(MagpieError) -> Bool {
        do {
            let reply = try await evaluate(
                RedisRemoteScript.removeIfEqual, sha: RedisRemoteScript.removeIfEqualSHA, key: prefix + key, [.bytes(value)])
            guard case .integer(let removed) = reply else { throw RedisError(.unexpectedReply, "the compare-and-delete answered \(reply)") }
            return removed == 1
        } catch {
            throw Self.unavailable(error)
        }
    }

    public var callerMayWait: Bool { MultiThreadedEventLoopGroup.currentEventLoop == nil }
}
