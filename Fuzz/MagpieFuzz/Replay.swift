// Without the fuzzer runtime (a plain `swift build`), the harness is a replayer: it runs every file
// given (or every file of every directory given) through the same targets and reports violations.
// `make fuzz` builds the libFuzzer binary instead (-DFUZZING, -sanitize=fuzzer,address).
#if !FUZZING
import MagpieFuzzTargets

#if canImport(Glibc)
import Glibc
#endif

@main
enum Replay {
    static func main() {
        let paths = CommandLine.arguments.dropFirst()
        if paths.first == "--write-seeds", paths.count == 2 {
            writeSeeds(to: paths.last!)
            return
        }
        if paths.isEmpty {
            Harness.report("usage: magpie-fuzz FILE|DIR...  replays inputs (build with `make fuzz` to fuzz)\n")
            Harness.report("       magpie-fuzz --write-seeds DIR  writes the seed corpus\n")
            exit(2)
        }
        var inputs = 0
        var violations = 0
        for path in paths {
            for file in files(at: path) {
                guard let bytes = FuzzTargets.readFile(file) else {
                    Harness.report("magpie-fuzz: cannot read \(file)\n")
                    exit(2)
                }
                inputs += 1
                if let violation = bytes.withUnsafeBytes({ Harness.run($0) }) {
                    violations += 1
                    print("\(file): \(violation)")
                }
            }
        }
        print("magpie-fuzz: \(inputs) inputs, \(violations) violations")
        exit(violations == 0 ? 0 : 1)
    }

    static func writeSeeds(to directory: String) {
        mkdir(directory, 0o755)
        for (number, seed) in FuzzTargets.seeds().enumerated() {
            let path = directory + "/seed-\(number < 10 ? "0" : "")\(number)"
            guard let file = fopen(path, "wb") else {
                Harness.report("magpie-fuzz: cannot write \(path)\n")
                exit(2)
            }
            _ = seed.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
            fclose(file)
        }
    }

    static func files(at path: String) -> [String] {
        guard let directory = opendir(path) else { return [path] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if !name.hasPrefix(".") { names.append(path + "/" + name) }
        }
        return names.sorted()
    }
}
#endif
