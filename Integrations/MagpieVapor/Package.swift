// swift-tools-version: 6.1
import Foundation
import PackageDescription

// Vapor 4's `Cache` and sessions (`app.caches.use(.magpie(cache))`, `app.sessions.use(.magpie(cache))`)
// kept in a Magpie `Cache`. A package of its own, so that Magpie's users who do not use Vapor never
// resolve it.
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
        .package(url: "https://github.com/vapor/vapor", from: "4.122.3"),
    ],
    targets: [
        .target(
            name: "MagpieVapor",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "Vapor", package: "vapor"),
            ]
        ),
        .testTarget(
            name: "MagpieVaporTests",
            dependencies: [
                "MagpieVapor",
                .product(name: "Magpie", package: magpie),
                .product(name: "Vapor", package: "vapor"),
                .product(name: "XCTVapor", package: "vapor"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
