/// Compressible bytes, a function of `seed`: one JSON-like line repeated (zstd shrinks them a
/// hundredfold or more). Built by doubling, so that tens of MiB take milliseconds in a debug build.
package func textBytes(_ count: Int, seed: UInt64) -> [UInt8] {
    let line = Array(#"{"id":\#(seed),"name":"a cached value","tags":["x","y","z"],"score":0.75}\#n"#.utf8)
    var bytes = line
    bytes.reserveCapacity(max(count, line.count))
    while bytes.count < count { bytes.append(contentsOf: bytes) }
    return Array(bytes.prefix(max(count, 0)))
}
