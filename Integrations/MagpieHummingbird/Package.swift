// swift-tools-version: 6.1
import Foundation
import PackageDescription

// Hummingbird's key-value persistence (`PersistDriver`) backed by a Magpie `Cache`, and the HTTP response
// cache's middleware (MagpieHTTPCache's rules, over Hummingbird's requests and responses). A package of its
// own, so that Magpie's users who do not use Hummingbird never resolve it.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "MagpieHummingbird",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "MagpieHummingbird", targets: ["MagpieHummingbird"]),
        // `ResponseCacheMiddleware`: whole responses cached by HTTP's rules (Integrations/MagpieHTTPCache).
        .library(name: "MagpieHummingbirdResponseCache", targets: ["MagpieHummingbirdResponseCache"]),
        // The driver's calls from 1, 16 and 256 tasks beside `MemoryPersistDriver` (`make bench-persist`).
        .executable(name: "magpie-persist-bench", targets: ["MagpiePersistBench"]),
    ],
    dependencies: [
        .package(path: "../.."),
        .package(path: "../MagpieHTTPCache"),
        // No default traits: the driver needs neither swift-configuration nor full Foundation support.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
    ],
    targets: [
        .target(
            name: "MagpieHummingbird",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        .target(
            name: "MagpieHummingbirdResponseCache",
            dependencies: [
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "Magpie", package: magpie),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        .executableTarget(
            name: "MagpiePersistBench",
            dependencies: [
                "MagpieHummingbird",
                .product(name: "Magpie", package: magpie),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        .testTarget(
            name: "MagpieHummingbirdTests",
            dependencies: [
                "MagpieHummingbird",
                .product(name: "Magpie", package: magpie),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        // The conformance table (MagpieHTTPCacheConformance) through HummingbirdTesting's router client.
        .testTarget(
            name: "MagpieHummingbirdResponseCacheTests",
            dependencies: [
                "MagpieHummingbirdResponseCache",
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "MagpieHTTPCacheConformance", package: "MagpieHTTPCache"),
                .product(name: "Magpie", package: magpie),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
