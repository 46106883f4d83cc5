// The tier behind memory, as the composer asks it: the disk tier, or `NoStorage`, a tier that holds
// nothing. The composer never asks whether a disk exists: it asks the tier behind memory, and an empty
// one answers "absent", "nothing removed" and "never waits".
//
// Every read and store takes the `ReadWait` discipline of the local tiers (LocalTiers.swift): the blocking
// form may wait for a lock or the disk; the `IfImmediate` form answers `.wouldBlock`, having changed
// nothing, where it would have to. The blocking read returns its entry unwrapped: wrapping it in an
// `ImmediateRead` copied it on every disk hit (callgrind).

protocol StorageTier: AnyObject, Sendable {
    /// Whether its work may wait (a bucket's lock, the disk): the async API then runs it on an I/O thread,
    /// and the local tiers keep a key's two tiers in step under its stripe.
    var mayWait: Bool { get }
    func entry(_ key: HashedKey) throws(MagpieError) -> DiskEntry?
    func entryIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<DiskEntry?>
    func contains(_ key: HashedKey) throws(MagpieError) -> Bool
    func containsIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<Bool>
    func store(_ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata)
        throws(MagpieError)
    func storeIfImmediate(_ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata)
        throws(MagpieError) -> ImmediateRead<Void>
    /// Removes `key` (durably); whether it held it.
    func remove(_ key: HashedKey) throws(MagpieError) -> Bool
    func removeAll() throws(MagpieError)
    /// Removes `group`'s entries (durably); how many.
    func removeAll(inGroup group: String) throws(MagpieError) -> Int
    func removeExpired() throws(MagpieError) -> Int
    func flush() throws(MagpieError)
    func close() throws(MagpieError)
    /// Writes its write buffers to the kernel (``DiskTier/writeBuffers()``); whether it buffers at all.
    var buffersWrites: Bool { get }
    func writeBuffers() throws(MagpieError)
    /// The longest value it keeps; nil when it keeps none (the memory tier's bound then holds).
    var largestValue: Int? { get }
    /// Whether its indexes have all loaded since the open (its statistics wait for them until then).
    var indexesLoaded: Bool { get }
    /// Its counters; nil for a tier that holds nothing.
    var tierStatistics: DiskTierStatistics? { get }
    /// The tiers an entry that asks for `tiers` is kept in: as asked, or memory only where this tier holds
    /// nothing.
    func placing(_ tiers: Tiers) -> Tiers
    /// The configuration it was opened with (as found on disk); nil for a tier that holds nothing.
    var diskConfiguration: DiskTier.Configuration? { get }
    /// The key hash its directory's seed gives (placement stable across restarts); nil where it has none.
    var directoryHasher: KeyHash? { get }
    /// Where the remote tier keeps the removals it owes across restarts; nil where nothing survives one.
    var owedJournal: OwedJournal? { get }
}

extension DiskTier: StorageTier {
    var mayWait: Bool { true }
    var diskConfiguration: DiskTier.Configuration? { configuration }
    var directoryHasher: KeyHash? { hasher }
    var buffersWrites: Bool { configuration.writeBufferSize > 0 }
    var largestValue: Int? { largestStorableValue }
    var indexesLoaded: Bool { loader.isFinished }
    var tierStatistics: DiskTierStatistics? { statistics }
    func placing(_ tiers: Tiers) -> Tiers { tiers }
    var owedJournal: OwedJournal? { OwedJournal(self) }
}

/// The tier behind memory of a memory-only cache: holds nothing, never waits.
final class NoStorage: StorageTier {
    var mayWait: Bool { false }
    var diskConfiguration: DiskTier.Configuration? { nil }
    var directoryHasher: KeyHash? { nil }
    func entry(_ key: HashedKey) throws(MagpieError) -> DiskEntry? { nil }
    func entryIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<DiskEntry?> { .done(nil) }
    func contains(_ key: HashedKey) throws(MagpieError) -> Bool { false }
    func containsIfImmediate(_ key: HashedKey) throws(MagpieError) -> ImmediateRead<Bool> { .done(false) }
    func store(_ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata) {}
    func storeIfImmediate(_ value: UnsafeRawBufferPointer, for key: HashedKey, expiry: Expiry, group: String?, placement: EntryMetadata)
        -> ImmediateRead<Void>
    { .done(()) }
    func remove(_ key: HashedKey) -> Bool { false }
    func removeAll() {}
    func removeAll(inGroup group: String) -> Int { 0 }
    func removeExpired() -> Int { 0 }
    func flush() {}
    func close() {}
    var buffersWrites: Bool { false }
    func writeBuffers() {}
    var largestValue: Int? { nil }
    var indexesLoaded: Bool { true }
    var tierStatistics: DiskTierStatistics? { nil }
    func placing(_ tiers: Tiers) -> Tiers { .memoryOnly }
    var owedJournal: OwedJournal? { nil }
}
