import Testing

@testable import Magpie

// A fetched value is kept locally only when nothing that could make it stale came while it was fetched
// (Coherence.keepable): the cases a fetch meets, on one slot of the change counters.

@Suite("Keeping a fetched value: which changes during the fetch forbid it")
struct CoherenceKeepTests {
    let hash: UInt64 = 0x1234_5678_9ABC_0042
    /// Another key's hash in the same slot (the slots are the low 12 bits).
    var sameSlot: UInt64 { hash ^ (1 << 40) }
    /// A key's hash in another slot.
    var otherSlot: UInt64 { hash ^ 1 }

    @Test("nothing changed: kept, whatever the fetched value's version")
    func quiet() {
        let coherence = Coherence(bound: .seconds(5))
        let count = coherence.counter(hash)
        #expect(coherence.keepable(hash, since: count, version: 0))
        #expect(coherence.keepable(hash, since: count, version: 7))
        coherence.bump(otherSlot)
        coherence.bump(otherSlot, version: 99)
        #expect(coherence.keepable(hash, since: count, version: 0))
    }

    @Test("a message of the fetched write or an older one: kept; of a newer write: not; a value without a version: not")
    func versionedMessages() {
        let coherence = Coherence(bound: .seconds(5))
        let count = coherence.counter(hash)
        coherence.bump(hash, version: 100)
        #expect(coherence.keepable(hash, since: count, version: 100))
        #expect(coherence.keepable(hash, since: count, version: 101))
        #expect(!coherence.keepable(hash, since: count, version: 99))
        #expect(!coherence.keepable(hash, since: count, version: 0))
        // A later, newer message (the key changed again while the reply travelled): no longer kept.
        coherence.bump(hash, version: 150)
        #expect(!coherence.keepable(hash, since: count, version: 100))
        // An older message arriving late lowers nothing.
        coherence.bump(hash, version: 120)
        #expect(coherence.keepable(hash, since: count, version: 150))
        // A fetch that starts after the messages is not judged by them.
        let later = coherence.counter(hash)
        #expect(coherence.keepable(hash, since: later, version: 1))
    }

    @Test("another key of the slot changed to a newer version: not kept (never wrongly kept)")
    func sameSlotNewer() {
        let coherence = Coherence(bound: .seconds(5))
        let count = coherence.counter(hash)
        coherence.bump(sameSlot, version: 500)
        #expect(!coherence.keepable(hash, since: count, version: 400))
        #expect(coherence.keepable(hash, since: count, version: 500))
    }

    @Test("a change without a version, or this cache's write at its start or end, forbids keeping whatever the versions")
    func unversioned() {
        let coherence = Coherence(bound: .seconds(5))
        var count = coherence.counter(hash)
        coherence.bump(hash)
        #expect(!coherence.keepable(hash, since: count, version: .max))

        count = coherence.counter(hash)
        coherence.beginWrite(hash, now: 1)
        #expect(!coherence.keepable(hash, since: coherence.counter(hash), version: .max))  // under way
        coherence.endWrite(hash, began: 1)
        #expect(!coherence.keepable(hash, since: count, version: .max))  // overlapped it
        #expect(coherence.keepable(hash, since: coherence.counter(hash), version: 0))

        count = coherence.counter(hash)
        coherence.bump(hash, version: 10)
        coherence.bump(sameSlot)
        #expect(!coherence.keepable(hash, since: count, version: 10))
    }
}
