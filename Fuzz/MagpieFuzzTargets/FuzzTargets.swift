import Glibc
import Magpie

/// Entry points for the libFuzzer harness (`Fuzz/MagpieFuzz`) and the corpus replay test, over the
/// library's package-level format types: not part of the shipped library.
///
/// Each returns a description of a broken invariant, or nil. They never trap on any input: the harness
/// turns a returned violation into a crash so that libFuzzer records the input.
public enum FuzzTargets {
    /// One input of the harness (and of the corpus replay): the first byte picks the target — 2: index
    /// snapshot decoding; else even: record decoding, odd: bucket recovery — the rest is its input.
    public static func run(_ input: UnsafeRawBufferPointer, directory: String) -> String? {
        guard let selector = input.first else { return nil }
        let rest = UnsafeRawBufferPointer(rebasing: input.dropFirst())
        if selector == 2 { return decodeSnapshot(rest) }
        return selector & 1 == 0 ? decodeRecord(rest) : recoverBucket(rest, directory: directory)
    }

    /// Index snapshot decoding, of `data` as it is and with its last 8 bytes made its right checksum (so
    /// that the structural checks, not the checksum, are what is fuzzed). Invariants: decoding never traps;
    /// a decoded snapshot re-encodes to bytes that decode to it again; its regions lie inside the file's
    /// slots without overlapping, and every live index slot points inside the used bytes of one region and
    /// past its header (checked here independently of the decoder's own checks).
    public static func decodeSnapshot(_ data: UnsafeRawBufferPointer) -> String? {
        var bytes = Array(data)
        for pass in 0..<2 {
            if pass == 1 {
                guard bytes.count >= 8 else { return nil }
                let end = bytes.count - 8
                let sum = bytes.withUnsafeBytes { KeyHash.formatChecksum(UnsafeRawBufferPointer(rebasing: $0[0..<end])) }
                withUnsafeBytes(of: sum.littleEndian) { for i in 0..<8 { bytes[end + i] = $0[i] } }
            }
            guard let snapshot = IndexSnapshot.decode(bytes) else { continue }
            guard IndexSnapshot.decode(snapshot.encoded()) == snapshot else { return "a decoded snapshot does not survive re-encoding" }
            let regions = snapshot.regionSpans
            for region in regions {
                guard region.slot >= 0, region.slots >= 1, region.slot + region.slots <= snapshot.slotCount,
                    region.end >= RegionHeader.size, region.end <= region.slots * snapshot.regionSize
                else { return "a region outside the file's slots: \(region)" }
            }
            let sorted = regions.sorted { $0.slot < $1.slot }
            for (a, b) in zip(sorted, sorted.dropFirst()) where a.slot + a.slots > b.slot {
                return "overlapping regions: \(a), \(b)"
            }
            for record in snapshot.liveRecords {
                let inside = regions.contains { region in
                    let start = BucketFileHeader.size + region.slot * snapshot.regionSize
                    return record.offset >= start + RegionHeader.size && record.offset + record.length <= start + region.end
                }
                guard inside, record.length >= RecordHeader.size else { return "a live slot outside every region: \(record)" }
            }
        }
        return nil
    }

    /// Record decoding. `data` is taken as the bytes of one record (it may run past it). Invariants:
    /// decoding never traps; a record that validates re-encodes, from its parsed header and body, to
    /// exactly its own bytes (so the parser and the writer agree on every field).
    public static func decodeRecord(_ data: UnsafeRawBufferPointer) -> String? {
        guard let header = RecordHeader.validate(data) else { return nil }  // decodes, then checks the sum
        let body = { (offset: Int, count: Int) in UnsafeRawBufferPointer(rebasing: data[offset..<(offset + count)]) }
        // The metadata blocks through the one decoder the disk and remote records share.
        let metadata = RecordHeader.metadata(of: data, header)
        let rebuilt = RecordHeader.makeRecord(
            header, key: body(header.keyOffset, header.keyLength), group: body(header.groupOffset, header.groupLength),
            payload: body(header.payloadOffset, header.storedLength), metadata: metadata)
        let original = Array(data.prefix(RecordHeader.size + header.bodyLength))
        guard Array(rebuilt.prefix(original.count)) == original else {
            return "a valid record does not re-encode to its own bytes: \(original.prefix(64))"
        }
        return nil
    }

    /// Bucket recovery. `data` drives the building of a bucket file (see ``BucketImage``): regions of
    /// records whose fields, key, group and payload come from `data`, most of them sealed with a correct
    /// key hash, checksum and payload hash so that recovery's logic past validation is reached, some
    /// deliberately broken, plus torn and garbage bytes, broken region headers and slots that still hold
    /// an older region's records. The file replaces bucket 0 of a one-bucket tier in `directory` (created on
    /// first use; an odd-length input keeps the previous run's now-stale index snapshot, and the input's
    /// length also picks whether the last close's SIZES stays, goes or is overwritten), which is then
    /// opened, read, written, closed and reopened. Invariants: nothing traps;
    /// every value read for a key is the value of some valid record the image holds for that key; the
    /// tier stays usable (a store can be read back, also after a reopen).
    public static func recoverBucket(_ data: UnsafeRawBufferPointer, directory: String) -> String? {
        let seed: UInt64 = 0x5EED
        var configuration = DiskTier.Configuration(directory: directory, budget: 1 << 20, bucketCount: 1, hashSeed: seed)
        configuration.loadsInBackground = false  // its first use loads the one bucket: no thread per input
        let image = BucketImage(data, seed: seed)
        let bucket = directory + "/buckets/" + DiskTier.bucketName(0, count: 1)
        do {
            if access(bucket, F_OK) != 0 {
                let tier = try DiskTier(configuration)
                try tier.close()
            }
            // An even-length input also drops the index snapshot the last round's close left; an odd one
            // keeps it, stale for the new file, which the open must detect rather than trust.
            if data.count % 2 == 0 { unlink(bucket + ".index") }
            // SIZES (the sizes the last close recorded): kept, stale for the new file (its load must
            // measure it); dropped (the open measures every file); or replaced by the input's first 40
            // bytes sealed with a valid checksum (any header, and any file and snapshot size: the open
            // must refuse what is out of range without trapping, and a load must charge what it finds).
            let sizes = directory + "/buckets/SIZES"
            switch data.count % 3 {
            case 0: unlink(sizes)
            case 1:
                var body = Array(data.prefix(40))
                body += [UInt8](repeating: 0, count: 40 - body.count)
                if data.count % 2 == 0 {  // a header that matches, so that the sizes are what is tried
                    body.replaceSubrange(0..<24, with: sizesHeader(seed: seed))
                }
                let bytes = BucketSizes.sealed(body)
                let fd = open(sizes, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
                if fd >= 0 {
                    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                    Glibc.close(fd)
                }
            default: break
            }
        } catch {
            return nil  // the file system failed us, not the code under test
        }
        let fd = open(bucket, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return nil }
        let written = image.bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        Glibc.close(fd)
        guard written == image.bytes.count else { return nil }
        for round in 0..<2 {
            let tier: DiskTier
            do {
                tier = try DiskTier(configuration)
            } catch {
                return "open failed on round \(round): \(error)"
            }
            for (key, values) in image.values {
                guard let got = try? tier.value(forKey: key) else { continue }
                if !values.contains(got) { return "key \(key) read \(got.prefix(32)), a value no valid record holds" }
            }
            let probe = Array("fuzz-probe-\(round)".utf8)
            do {
                try tier.set(probe, forKey: "fuzz-probe")
                guard try tier.value(forKey: "fuzz-probe") == probe else { return "a store on the recovered tier did not read back" }
                try tier.close()
            } catch {
                return "the recovered tier failed: \(error)"
            }
        }
        return nil
    }

    /// The index snapshot a clean close leaves for a one-bucket tier holding a few values (nothing if the
    /// temporary directory cannot be made).
    static func snapshotSeeds() -> [[UInt8]] {
        var template = Array("/tmp/magpie-fuzz-seed-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { return [] }
        let directory = String(cString: made)
        defer { _ = try? DiskTier.destroy(directory: directory); rmdir(directory) }
        var configuration = DiskTier.Configuration(directory: directory, budget: 256 * 1024, bucketCount: 1, hashSeed: 0x5EED)
        configuration.writeBufferSize = 0
        guard let tier = try? DiskTier(configuration) else { return [] }
        // Noise (zstd would shrink repeated bytes to nothing), from a fixed linear congruential sequence.
        var state: UInt64 = 0x5EED
        func noise(_ count: Int) -> [UInt8] {
            (0..<count).map { _ in
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                return UInt8(truncatingIfNeeded: state >> 56)
            }
        }
        for i in 0..<12 { try? tier.set(noise(300 + 97 * i), forKey: "k\(i)") }
        try? tier.set(noise(40_000), forKey: "jumbo")
        _ = try? tier.removeValue(forKey: "k3")
        guard (try? tier.close()) != nil else { return [] }
        let path = directory + "/buckets/" + DiskTier.bucketName(0, count: 1) + ".index"
        guard let bytes = readFile(path) else { return [] }
        return bytes.isEmpty ? [] : [bytes]
    }

    /// The bytes of the file at `path`, or nil if it cannot be opened or read whole (a seed, a corpus
    /// entry or a reproducer).
    public static func readFile(_ path: String) -> [UInt8]? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, file) }
            if count == 0 { break }
            bytes += chunk.prefix(count)
        }
        return ferror(file) == 0 ? bytes : nil
    }

    /// The 24-byte header of a one-bucket SIZES for `seed` (Magpie's OnDiskFormat.swift).
    static func sizesHeader(seed: UInt64) -> [UInt8] {
        var header = [UInt8](repeating: 0, count: 24)
        header.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(0x5A50_474D).littleEndian, toByteOffset: 0, as: UInt32.self)  // "MGPZ"
            raw.storeBytes(of: UInt32(1).littleEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt32(1).littleEndian, toByteOffset: 8, as: UInt32.self)
            raw.storeBytes(of: seed.littleEndian, toByteOffset: 16, as: UInt64.self)
        }
        return header
    }

    /// A seed corpus: inputs in the harness's format (first byte: 0 record decoding, 1 bucket recovery).
    /// Records of every kind and flag, and bucket images that exercise newest-wins, tombstones, group
    /// tombstones, expiry, compression, torn tails, garbage and broken checksums.
    public static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        let hasher = KeyHash(seed: 0x5EED)
        let json = Array(#"{"id":1,"name":"magpie","tags":["a","b","a","b"],"text":"aaaaaaaaaaaaaaaaaaaa"}"#.utf8)
        func record(_ kind: RecordKind, key: [UInt8], group: [UInt8], value: [UInt8], zstd: Bool, flags: RecordFlags) -> [UInt8] {
            var payload = value
            var codec = Codec.raw
            if zstd, let compressor = try? ZstdCompressor(level: 1), let compressed = try? compressor.compress(value) {
                payload = compressed
                codec = .zstd
            }
            let header = RecordHeader(
                kind: kind, codec: codec, keyLength: key.count, groupLength: group.count, storedLength: payload.count,
                originalLength: value.count, expiry: 1_700_000_000_000, sequence: 7, keyHash: hasher.hash(key), flags: flags)
            return key.withUnsafeBytes { k in
                group.withUnsafeBytes { g in
                    payload.withUnsafeBytes { p in
                        RecordHeader.makeRecord(
                            header, key: k, group: g, payload: p, memoryPolicy: -60_000, freshUntil: 1_700_000_010_000,
                            loadedAt: 1_700_000_000_000)
                    }
                }
            }
        }
        let key = Array("user:42".utf8)
        seeds.append([0] + record(.value, key: key, group: [], value: json, zstd: false, flags: []))
        seeds.append([0] + record(.value, key: key, group: Array("g".utf8), value: json, zstd: true, flags: []))
        seeds.append([0] + record(.value, key: key, group: [], value: json, zstd: false, flags: [.memoryPolicy]))
        seeds.append(
            [0] + record(.value, key: key, group: Array("g".utf8), value: json, zstd: true, flags: [.memoryPolicy, .diskOnly, .freshness]))
        seeds.append([0] + record(.value, key: key, group: Array("g".utf8), value: [], zstd: false, flags: .all))
        seeds.append([0] + record(.value, key: [], group: [], value: [], zstd: false, flags: []))
        seeds.append([0] + record(.tombstone, key: key, group: [], value: [], zstd: false, flags: []))
        seeds.append([0] + record(.groupTombstone, key: [], group: Array("g".utf8), value: [], zstd: false, flags: []))
        // Bucket images: instructions (control, key length, group length, payload length high and low,
        // expiry, then the bytes), see BucketImage.
        func instruction(_ control: UInt8, key: [UInt8], group: [UInt8] = [], payload: [UInt8] = [], expiry: UInt8 = 0) -> [UInt8] {
            let length = payload.count
            return [control, UInt8(key.count), UInt8(group.count), UInt8(length >> 8), UInt8(length & 0xff), expiry] + key + group
                + payload
        }
        let a: [UInt8] = [0, 0]  // "aa"
        let b: [UInt8] = [1]  // "b"
        let g: [UInt8] = [0]  // "g"
        seeds.append([1] + instruction(0, key: a, payload: json) + instruction(0, key: a, payload: Array(json.reversed())))
        seeds.append([1] + instruction(0, key: a, payload: json) + instruction(0x40, key: a) + instruction(0, key: b, payload: json))
        seeds.append(
            [1] + instruction(0, key: a, group: g, payload: json) + instruction(0x10, key: b, group: g, payload: json)
                + instruction(0x60, key: [], group: g) + instruction(0, key: b, payload: [1, 2, 3]))
        seeds.append([1] + instruction(0x90, key: a, payload: json, expiry: 200) + instruction(0, key: b, payload: json, expiry: 5))
        seeds.append([1] + instruction(0, key: a, payload: json) + instruction(4, key: a, payload: [9]) + instruction(8, key: b, payload: [8]))
        seeds.append([1] + instruction(0, key: a, payload: json) + [2, 17] + Array(repeating: 0xAB, count: 17) + instruction(0, key: b, payload: json))
        seeds.append([1] + instruction(0, key: a, payload: json) + instruction(3, key: b, payload: json) + [40])
        // Index snapshots, as a clean close writes them: a few regions (one of them a jumbo region) and
        // their entries, one of them removed.
        seeds += snapshotSeeds().map { [2] + $0 }
        return seeds
    }
}

/// A bucket file built from fuzzer bytes: its header, then regions of 4 KiB slots. The data is consumed
/// as a sequence of instructions:
///   control byte: bits 0-1 what to emit (0, 1: a record; 2: garbage bytes; 3: a torn record),
///     bit 2: leave the checksum (or, with bit 4, the payload hash) wrong, bit 3: open a new region first
///     (with bit 2 also: give that region a broken header; with bit 7 also: open it in the slot of the
///     oldest region, whose records stay behind the new ones), bit 4: a valid zstd payload,
///     bits 5-6: kind (value, value, tombstone, group tombstone), bit 7: set the memory-policy flag;
///   then key length (mod 24), group length (mod 6), payload length (two bytes, mod 600), expiry byte
///   (0: none, else a past or future instant), and the key, group and payload bytes themselves.
/// Keys are drawn from a small alphabet so that records of one key meet. A record that does not fit
/// its region opens the next one.
public struct BucketImage {
    static let regionSize = 4096
    var bytes: [UInt8]
    /// For every key, the values that valid records hold (what a read may return).
    var values: [[UInt8]: [[UInt8]]] = [:]

    init(_ data: UnsafeRawBufferPointer, seed: UInt64) {
        let hasher = KeyHash(seed: seed)
        let regionSize = Self.regionSize
        bytes = BucketFileHeader(bucketIndex: 0, bucketCount: 1, seed: seed, regionSize: regionSize).encoded()
        var input = data[...]
        func take(_ count: Int) -> [UInt8] {
            let part = Array(input.prefix(count))
            input = input.dropFirst(part.count)
            return part
        }
        func byte() -> UInt8 { take(1).first ?? 0 }
        var sequence: UInt64 = 1
        var regionSequence: UInt64 = 1
        var regionSlots: [Int] = []  // slots of the regions opened, oldest first
        var cursor = 0  // where the next bytes go in the file; 0: no region open yet
        var regionEnd = 0
        func openRegion(broken: Bool, reuseOldest: Bool, firstSequence: UInt64) {
            var slot = (bytes.count - BucketFileHeader.size) / regionSize
            if reuseOldest, let oldest = regionSlots.first {
                slot = oldest
                regionSlots.removeFirst()
            } else {
                bytes += [UInt8](repeating: 0, count: regionSize)
            }
            regionSlots.append(slot)
            var header = RegionHeader(bucketIndex: 0, slots: 1, sequence: regionSequence, firstRecordSequence: firstSequence)
                .encoded(hasher: hasher)
            if broken { header[20] ^= 0x5a }
            let start = BucketFileHeader.size + slot * regionSize
            bytes.replaceSubrange(start..<(start + RegionHeader.size), with: header)
            regionSequence += 1
            cursor = start + RegionHeader.size
            regionEnd = start + regionSize
        }
        // (A record's own sequence number is the region's first when it opens one.)
        func emit(_ part: [UInt8], sequence: UInt64) {
            if cursor == 0 || cursor + part.count > regionEnd { openRegion(broken: false, reuseOldest: false, firstSequence: sequence) }
            let count = min(part.count, regionEnd - cursor)
            bytes.replaceSubrange(cursor..<(cursor + count), with: part.prefix(count))
            cursor += count
        }
        let kinds: [RecordKind] = [.value, .value, .tombstone, .groupTombstone]
        while !input.isEmpty && bytes.count < 1 << 19 {
            let control: UInt8 = byte()
            if control & 8 != 0 {
                openRegion(broken: control & 4 != 0 && control & 3 == 2, reuseOldest: control & 128 != 0, firstSequence: sequence)
            }
            if control & 3 == 2 {
                let garbageLength: Int = Int(byte())
                emit(take(garbageLength), sequence: sequence)  // garbage, possibly misaligned
                continue
            }
            let kind: RecordKind = kinds[Int(control >> 5) & 3]
            let keyLength: Int = Int(byte()) % 24
            let groupLength: Int = Int(byte()) % 6
            let high: Int = Int(byte())
            let low: Int = Int(byte())
            let expiryByte: UInt8 = byte()
            var key: [UInt8] = []
            for raw: UInt8 in take(keyLength) { key.append(UInt8(0x61) + raw % 4) }  // "a"..."d"
            var group: [UInt8] = []
            for raw: UInt8 in take(groupLength) { group.append(UInt8(0x67) + raw % 2) }  // "g", "h"
            if kind == .groupTombstone { key = [] }
            if kind == .groupTombstone && group.isEmpty { group = [0x67] }
            if kind == .tombstone { group = [] }
            let payloadLength: Int = kind == .value ? (high * 256 + low) % 600 : 0
            let value: [UInt8] = take(payloadLength)
            var expiry: Int64 = 0
            if kind == .value && expiryByte != 0 { expiry = expiryByte < 128 ? 1 : Int64.max - 1 }
            var codec = Codec.raw
            var payload = value
            if kind == .value && control & 16 != 0, !value.isEmpty,
                let compressor = try? ZstdCompressor(level: 1),
                let compressed = try? compressor.compress(value)
            {
                codec = .zstd
                payload = compressed
            }
            let flags: RecordFlags = kind == .value && control & 128 != 0 ? [.memoryPolicy, .freshness] : []
            let header = RecordHeader(
                kind: kind, codec: codec, keyLength: key.count, groupLength: group.count, storedLength: payload.count,
                originalLength: kind == .value ? value.count : 0, expiry: expiry, sequence: sequence, keyHash: hasher.hash(key), flags: flags)
            var record = key.withUnsafeBytes { k in
                group.withUnsafeBytes { g in
                    payload.withUnsafeBytes { p in
                        RecordHeader.makeRecord(
                            header, key: k, group: g, payload: p, memoryPolicy: -5000, freshUntil: 1_700_000_005_000,
                            loadedAt: 1_700_000_000_000)
                    }
                }
            }
            sequence += 1
            let broken = control & 4 != 0
            // The last body byte: in the payload (its hash breaks), or in key, group or metadata (the checksum).
            if broken { record[RecordHeader.size + header.bodyLength - 1] ^= 0x5a }
            if broken && header.bodyLength == 0 { record[60] ^= 0x5a }  // the checksum itself
            // A valid value record: its bytes may be returned for its key. A torn one counts too, even one
            // written broken: the cut may fall in its padding or before the broken byte, and the bytes that
            // follow it (garbage, the next record) may by chance be exactly the original ones cut off, and
            // then it is whole and valid again (a fuzzer found both inputs: Fuzz/corpus/regression-torn-*).
            // Its value is still the only one it can yield: any other bytes fail the checksum and hash.
            let intact = !broken && kind == .value
            if control & 3 == 3 {
                let tornLength: Int = Int(byte()) % max(1, record.count)
                if kind == .value { values[key, default: []].append(value) }
                emit(Array(record.prefix(tornLength)), sequence: sequence - 1)  // a torn record
                continue
            }
            if intact { values[key, default: []].append(value) }
            emit(record, sequence: sequence - 1)
        }
    }
}
