// swift-tools-version: 6.1
import Foundation
import PackageDescription

// Whole HTTP responses cached by HTTP's rules (RFC 9111, RFC 5861), written once over swift-http-types
// (`HTTPRequest`, `HTTPResponse`, `HTTPFields`) and free of any web framework: each framework's
// middleware (MagpieHummingbird's, MagpieVapor's) is a thin adapter over `HTTPResponseCache`. A package of
// its own, so that Magpie's users who serve no HTTP never resolve swift-http-types.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "MagpieHTTPCache",
    products: [
        .library(name: "MagpieHTTPCache", targets: ["MagpieHTTPCache"]),
        // The RFC 9111 / RFC 5861 cases as data and expectations, for each middleware's test target to run
        // through its own framework's testing library (real requests): the table is written once.
        .library(name: "MagpieHTTPCacheConformance", targets: ["MagpieHTTPCacheConformance"]),
    ],
    dependencies: [
        .package(path: "../.."),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
    ],
    targets: [
        .target(
            name: "MagpieHTTPCache",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        .target(
            name: "MagpieHTTPCacheConformance",
            dependencies: [
                "MagpieHTTPCache",
                .product(name: "Magpie", package: magpie),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        .testTarget(
            name: "MagpieHTTPCacheTests",
            dependencies: [
                "MagpieHTTPCache",
                "MagpieHTTPCacheConformance",
                .product(name: "Magpie", package: magpie),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
