// swift-tools-version: 6.1
import Foundation
import PackageDescription

// What the two example services (HummingbirdService, VaporService) share, so that their rows in `make
// bench-service` serve the same products from the same origin by the same strategies: the slow origin,
// the product it returns, and the framework-free part of each caching strategy. Only Magpie, no framework.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "ExampleCatalog",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "ExampleCatalog", targets: ["ExampleCatalog"])
    ],
    dependencies: [
        .package(path: "../..")
    ],
    targets: [
        .target(name: "ExampleCatalog", dependencies: [.product(name: "Magpie", package: magpie)])
    ],
    swiftLanguageModes: [.v6]
)
