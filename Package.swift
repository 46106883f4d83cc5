// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "Magpie",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Magpie", targets: ["Magpie"]),
        .executable(name: "magpie-bench", targets: ["MagpieBench"]),
        .executable(name: "magpie-fuzz", targets: ["MagpieFuzz"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.1.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.4.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CXXHash",
            path: "CModules/CXXHash",
            pkgConfig: "libxxhash",
            providers: [.apt(["libxxhash-dev"]), .brew(["xxhash"])]
        ),
        .systemLibrary(
            name: "CZstd",
            path: "CModules/CZstd",
            pkgConfig: "libzstd",
            providers: [.apt(["libzstd-dev"]), .brew(["zstd"])]
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
            ],
            path: "Sources/Magpie"
        ),
        .executableTarget(
            name: "MagpieBench",
            dependencies: [
                "Magpie",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            path: "Benchmarks/MagpieBench"
        ),
        .executableTarget(
            name: "MagpieFuzz",
            dependencies: ["Magpie", "CFuzzerDriver"],
            path: "Fuzz/MagpieFuzz"
        ),
        .testTarget(
            name: "MagpieTests",
            dependencies: [
                "Magpie",
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            path: "Tests/MagpieTests"
        ),
    ],
    swiftLanguageModes: [.v6]
)
