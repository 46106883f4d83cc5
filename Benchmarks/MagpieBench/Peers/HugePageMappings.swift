import Foundation

/// Bytes of this process's file mappings under `directory` that the kernel maps by 2 MiB pages
/// (`FilePmdMapped` in /proc/self/smaps), and their resident bytes (`Rss`): how much of a system's files
/// its random reads reach without a 4 KiB page walk. Zeros where /proc is not readable. (Read through a
/// file handle: `String(contentsOfFile:)` stops after the first read of a /proc file, which reports size 0.)
func hugePageMappings(under directory: String) -> (pmdMapped: Int, resident: Int) {
    guard let smaps = FileHandle(forReadingAtPath: "/proc/self/smaps").map({ String(decoding: $0.readDataToEndOfFile(), as: UTF8.self) }) else { return (0, 0) }
    let prefix = URL(fileURLWithPath: directory).resolvingSymlinksInPath().path + "/"
    var inside = false
    var pmd = 0
    var rss = 0
    for line in smaps.split(separator: "\n", omittingEmptySubsequences: true) {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        guard let first = fields.first else { continue }
        if first.contains("-") && !first.hasSuffix(":") {
            // A mapping's first line: range, permissions, offset, device, inode, path.
            inside = fields.count >= 6 && fields[5...].joined(separator: " ").hasPrefix(prefix)
        } else if inside, fields.count >= 2, let kB = Int(fields[1]) {
            if first == "FilePmdMapped:" { pmd += kB << 10 } else if first == "Rss:" { rss += kB << 10 }
        }
    }
    return (pmd, rss)
}
