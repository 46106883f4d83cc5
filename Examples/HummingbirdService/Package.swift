// swift-tools-version: 6.1
import Foundation
import PackageDescription

// A small JSON API on Hummingbird 2 that reads through Magpie from a deliberately slow origin: the
// example `make example` starts and `make bench-service` loads with wrk. A package of its own, so that
// Magpie's users never resolve Hummingbird.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "MagpieExample",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "magpie-example", targets: ["MagpieExample"])
    ],
    dependencies: [
        .package(path: "../.."),
        .package(path: "../../Integrations/MagpieHummingbird"),
        .package(path: "../../Integrations/MagpieHTTPCache"),
        .package(path: "../Catalog"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.5.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
    ],
    targets: [
        .executableTarget(
            name: "MagpieExample",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "MagpieRedis", package: magpie),
                .product(name: "MagpieHummingbird", package: "MagpieHummingbird"),
                .product(name: "MagpieHummingbirdResponseCache", package: "MagpieHummingbird"),
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "ExampleCatalog", package: "Catalog"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
