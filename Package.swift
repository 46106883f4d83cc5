// swift-tools-version: 6.2
import PackageDescription

// Linux only: the library calls Glibc directly (pthread mutexes of Linux kinds, openat/renameat, mmap
// with a SIGBUS guard) and CI builds and tests on Linux alone, so no other platform is declared.
let package = Package(
    name: "Magpie",
    products: [
        .library(name: "Magpie", targets: ["Magpie"]),
        // The Redis / Valkey client (RESP3 on SwiftNIO): a separate product, so that users of the local
        // tiers alone never build SwiftNIO.
        .library(name: "MagpieRedis", targets: ["MagpieRedis"]),
        .executable(name: "magpie-bench", targets: ["MagpieBench"]),
        .executable(name: "magpie-fuzz", targets: ["MagpieFuzz"]),
        .executable(name: "magpie-opcount", targets: ["MagpieOpCount"]),
        // Test-only: the child processes the crash and signal tests start (Tests/MagpieTestChild).
        .executable(name: "magpie-test-child", targets: ["MagpieTestChild"]),
    ],
    // TLS for MagpieRedis (swift-nio-ssl, which compiles BoringSSL: 406 C files, about 3 minutes of a
    // debug build on 2 cores). On by default; a service that never reaches Redis over TLS can depend on
    // Magpie with `traits: []` and build none of it (a TLS setting is then refused, never connected in
    // plain text). CI's Thread Sanitizer run builds without it (Makefile, `tsan`).
    traits: [
        .trait(name: "TLS", description: "TLS connections to Redis / Valkey through swift-nio-ssl"),
        .default(enabledTraits: ["TLS"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.1.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.4.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.81.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.29.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CXXHash",
            path: "CModules/CXXHash",
            pkgConfig: "libxxhash",
            providers: [.apt(["libxxhash-dev"])]
        ),
        .systemLibrary(
            name: "CZstd",
            path: "CModules/CZstd",
            pkgConfig: "libzstd",
            providers: [.apt(["libzstd-dev"])]
        ),
        // The disk peers of `magpie-bench disk` (RocksDB, LMDB, SQLite): linked by the MagpieBench target
        // alone, never by the Magpie library.
        .systemLibrary(
            name: "CRocksDB",
            path: "CModules/CRocksDB",
            pkgConfig: "rocksdb",
            providers: [.apt(["librocksdb-dev"])]
        ),
        .systemLibrary(
            name: "CLMDB",
            path: "CModules/CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"])]
        ),
        .systemLibrary(
            name: "CSQLite",
            path: "CModules/CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .target(
            name: "CMagpieGuard",
            path: "CModules/CMagpieGuard"
        ),
        .systemLibrary(
            name: "CFuzzerDriver",
            path: "CModules/CFuzzerDriver"
        ),
        .target(
            name: "Magpie",
            dependencies: [
                "CXXHash", "CZstd", "CMagpieGuard",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Magpie",
            // Test seams (fault injection in FileIO, the key-hash counter) exist in debug builds only,
            // which is what `swift test` and the Thread Sanitizer run build; release builds (`make
            // bench`, the fuzzer, users) have none. `make test` checks the release binary for them.
            swiftSettings: [.define("MAGPIE_TESTING", .when(configuration: .debug))]
        ),
        .target(
            name: "MagpieRedis",
            dependencies: [
                "Magpie",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["TLS"])),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            path: "Sources/MagpieRedis"
        ),
        // futex(2) wait and wake for `magpie-bench fleet`'s cross-process key lock (Swift cannot call the
        // variadic syscall(2)): the benchmark's alone, never the library's.
        .target(
            name: "CFleetFutex",
            path: "Benchmarks/CFleetFutex"
        ),
        .executableTarget(
            name: "MagpieBench",
            dependencies: [
                "Magpie", "MagpieRedis", "MagpieTestSupport", "CRocksDB", "CLMDB", "CSQLite", "CZstd", "CXXHash", "CFleetFutex",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Benchmarks/MagpieBench"
        ),
        // A synchronous driver for counting instructions per operation with callgrind (Benchmarks/opcount.sh).
        .executableTarget(
            name: "MagpieOpCount",
            dependencies: ["Magpie"],
            path: "Benchmarks/MagpieOpCount"
        ),
        // The fuzz targets (record decoding, bucket recovery) over the library's package-level format
        // types: run by the libFuzzer executable and, over the committed corpus, by the tests.
        .target(
            name: "MagpieFuzzTargets",
            dependencies: ["Magpie"],
            path: "Fuzz/MagpieFuzzTargets"
        ),
        .executableTarget(
            name: "MagpieFuzz",
            dependencies: ["MagpieFuzzTargets", "CFuzzerDriver"],
            path: "Fuzz/MagpieFuzz"
        ),
        // Tests. Four targets, each runnable alone (`swift test --filter '^MagpieTests\.'` and so on; see
        // TESTING.md): the fast unit suites, the slow stress / model / crash suites, the Redis client and the
        // fleet tier against real servers, and the tests of the command-line tools. Helpers they share live in MagpieTestSupport; the child processes the crash
        // and signal tests start are the magpie-test-child executable.
        .target(
            name: "MagpieTestSupport",
            dependencies: ["Magpie"],
            path: "Tests/MagpieTestSupport"
        ),
        .executableTarget(
            name: "MagpieTestChild",
            dependencies: [
                "Magpie", "MagpieRedis", "MagpieTestSupport", .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tests/MagpieTestChild"
        ),
        .testTarget(
            name: "MagpieTests",
            dependencies: [
                "Magpie", "MagpieFuzzTargets", "MagpieTestSupport",
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            path: "Tests/MagpieTests"
        ),
        .testTarget(
            name: "MagpieStressTests",
            dependencies: ["Magpie", "MagpieTestSupport", "MagpieTestChild"],
            path: "Tests/MagpieStressTests"
        ),
        // The Redis client against real redis-server processes the tests start themselves (and a fake
        // server for what a real one never sends).
        .testTarget(
            name: "MagpieRedisTests",
            dependencies: [
                "Magpie", "MagpieRedis", "MagpieTestSupport",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["TLS"])),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            path: "Tests/MagpieRedisTests"
        ),
        .testTarget(
            name: "MagpieCLITests",
            dependencies: ["Magpie", "MagpieTestSupport", "MagpieBench"],
            path: "Tests/MagpieCLITests"
        ),
    ],
    swiftLanguageModes: [.v6]
)

// CI's sanitizer runs build a subset of this package, named by MAGPIE_CI_SUBSET (set by the Makefile's
// `asan`, `fuzz-build` and `tsan` rules, never by users): each builds only what its suites use.
//   core   the library, its fuzz targets and the MagpieTests target: the Address Sanitizer and fuzz
//          runs, whose suites use neither SwiftNIO nor the benchmarks (the full graph under their flags,
//          BoringSSL's 406 C files among them, took 440 s on 2 cores, against 144 s for this subset)
//   tsan   everything but the benchmarks and their tests (MagpieBench, MagpieOpCount, MagpieCLITests, the
//          disk peers' C libraries, the fleet's futex wrappers): CI's Thread Sanitizer run, whose suites use none of them
switch Context.environment["MAGPIE_CI_SUBSET"] {
case "core":
    let kept: Set<String> = [
        "CXXHash", "CZstd", "CMagpieGuard", "CFuzzerDriver", "Magpie", "MagpieFuzzTargets", "MagpieFuzz",
        "MagpieTestSupport", "MagpieTests",
    ]
    package.targets.removeAll { !kept.contains($0.name) }
    package.products.removeAll { !["Magpie", "magpie-fuzz"].contains($0.name) }
    package.dependencies.removeAll { dependency in
        guard case .sourceControl(_, let location, _) = dependency.kind else { return false }
        return !["swift-log", "swift-metrics", "swift-service-lifecycle"].contains { location.hasSuffix($0) }
    }
case "tsan":
    let dropped: Set<String> = [
        "MagpieBench", "MagpieOpCount", "MagpieCLITests", "CRocksDB", "CLMDB", "CSQLite", "CFleetFutex",
    ]
    package.targets.removeAll { dropped.contains($0.name) }
    package.products.removeAll { ["magpie-bench", "magpie-opcount"].contains($0.name) }
    package.dependencies.removeAll { dependency in
        guard case .sourceControl(_, let location, _) = dependency.kind else { return false }
        return location.hasSuffix("hdrhistogram-swift")
    }
case nil, "":
    break
case let subset?:
    fatalError("MAGPIE_CI_SUBSET=\(subset): the subsets are core and tsan")
}
