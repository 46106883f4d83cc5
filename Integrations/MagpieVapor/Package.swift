// swift-tools-version: 6.1
import Foundation
import PackageDescription

// Vapor 4's `Cache` and sessions (`app.caches.use(.magpie(cache))`, `app.sessions.use(.magpie(cache))`)
// kept in a Magpie `Cache`, and whole HTTP responses cached by HTTP's rules (`MagpieResponseCacheMiddleware`,
// over MagpieHTTPCache). A package of its own, so that Magpie's users who do not use Vapor never resolve it.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "MagpieVapor",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "MagpieVapor", targets: ["MagpieVapor"])
    ],
    dependencies: [
        .package(path: "../.."),
        .package(path: "../MagpieHTTPCache"),
        .package(url: "https://github.com/vapor/vapor", from: "4.122.3"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
    ],
    targets: [
        .target(
            name: "MagpieVapor",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Vapor", package: "vapor"),
            ]
        ),
        .testTarget(
            name: "MagpieVaporTests",
            dependencies: [
                "MagpieVapor",
                .product(name: "Magpie", package: magpie),
                // Sessions shared by two instances through a real redis-server (SessionFleetTests).
                .product(name: "MagpieRedis", package: magpie),
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "MagpieHTTPCacheConformance", package: "MagpieHTTPCache"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Vapor", package: "vapor"),
                .product(name: "XCTVapor", package: "vapor"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
