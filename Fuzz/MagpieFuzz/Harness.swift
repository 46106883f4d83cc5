// The libFuzzer harness: one input, three targets. The first byte picks the target (2: index snapshot
// decoding; else even: record decoding, odd: bucket recovery); the rest is that target's input. A broken invariant aborts, so that
// libFuzzer saves the input as a crash reproducer.
import MagpieFuzzTargets

#if canImport(Glibc)
import Glibc
#endif

enum Harness {
    /// Where bucket recovery builds its one-bucket tier: per process (libFuzzer's `-jobs` runs several),
    /// under /dev/shm when it exists so that the file system is not what is measured.
    static let directory: String = {
        if let chosen = getenv("MAGPIE_FUZZ_DIR") { return String(cString: chosen) + "/\(getpid())" }
        let base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"
        return base + "/magpie-fuzz-\(getpid())"
    }()

    /// Writes to standard error (fd 2) without touching the C `stderr` global.
    static func report(_ message: String) {
        Array(message.utf8).withUnsafeBytes { raw in _ = write(2, raw.baseAddress, raw.count) }
    }

    static func run(_ input: UnsafeRawBufferPointer) -> String? {
        FuzzTargets.run(input, directory: directory)
    }
}

#if FUZZING
import CFuzzerDriver

/// One libFuzzer execution.
func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : size)
    if let violation = Harness.run(input) {
        Harness.report("magpie-fuzz: invariant broken: \(violation)\n")
        abort()
    }
    return 0
}

@main
enum Fuzz {
    static func main() {
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOneInput(data, size) })
    }
}
#endif
