// The subscripts: the dictionary-like face of the cache, which cannot throw.

extension Cache {
    /// The value for `key`; nil on a miss or a failed read. Assigning stores the value with
    /// ``Configuration/defaultOptions``; assigning nil removes the key. A subscript cannot throw: a
    /// failed read or store is logged and counted in ``CacheStatistics/subscriptFailures`` (a failed
    /// store leaves the key as a failed `set` does). Use ``value(forKey:)-(String)`` and
    /// ``set(_:forKey:options:)-(_,String,_)`` to see errors.
    public subscript(key: String) -> [UInt8]? {
        get { subscriptRead { () throws(MagpieError) in try value(forKey: key) } ?? nil }
        set {
            subscriptWrite { () throws(MagpieError) in
                if let newValue { try set(newValue, forKey: key) } else { try removeValue(forKey: key) }
            }
        }
    }

    /// ``subscript(_:)-(String)`` for a key of arbitrary bytes.
    public subscript<Key: Sequence<UInt8>>(key: Key) -> [UInt8]? {
        get { subscriptRead { () throws(MagpieError) in try value(forKey: key) } ?? nil }
        set {
            subscriptWrite { () throws(MagpieError) in
                if let newValue { try set(newValue, forKey: key) } else { try removeValue(forKey: key) }
            }
        }
    }

    /// A subscript's (or a typed subscript's) read: its value, or nil after logging and counting the error.
    func subscriptRead<R>(_ read: () throws(MagpieError) -> R) -> R? {
        do {
            return try read()
        } catch {
            runtime.count(.subscriptFailures)
            runtime.logs.subscriptRead.record(error: "\(error)")
            return nil
        }
    }

    /// A subscript's (or a typed subscript's) store or removal; a failure is logged and counted.
    func subscriptWrite(_ write: () throws(MagpieError) -> Void) {
        do {
            try write()
        } catch {
            runtime.count(.subscriptFailures)
            runtime.logs.subscriptWrite.record(error: "\(error)")
        }
    }
}
