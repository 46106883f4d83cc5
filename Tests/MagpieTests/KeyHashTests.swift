import Magpie
import MagpieTestSupport
import Testing

@Suite("KeyHash")
struct KeyHashTests {
    @Test("XXH3-64 reference values from libxxhash")
    func referenceValues() {
        // XXH3_64bits_withSeed("", 0, 0) is 0x2D06800538D394C2 in the xxHash test vectors.
        #expect(KeyHash(seed: 0).hash([UInt8]()) == 0x2D06_8005_38D3_94C2)
        #expect(KeyHash(seed: 0).hash("") == 0x2D06_8005_38D3_94C2)
    }

    @Test("a String key hashes as its UTF-8 bytes, however it is passed")
    func sameBytesSameHash() {
        let hasher = KeyHash(seed: 0x1234)
        for key in ["", "a", "magpie", "ключ/../\u{0}é", String(repeating: "x", count: 1000)] {
            let bytes = Array(key.utf8)
            #expect(hasher.hash(key) == hasher.hash(bytes))
            #expect(hasher.hash(key) == bytes.withUnsafeBytes { hasher.hash($0) })
            #expect(hasher.hash(key) == hasher.hash(bytes[...]))
            // A lazily bridged or non-contiguous sequence takes the copying path and agrees.
            #expect(hasher.hash(key) == hasher.hash(AnySequence(bytes)))
        }
    }

    @Test("the seed changes placement")
    func seedMatters() {
        let key = Array("same key".utf8)
        #expect(KeyHash(seed: 1).hash(key) != KeyHash(seed: 2).hash(key))
        #expect(KeyHash.random().seed != KeyHash.random().seed)
    }
}
