// swift-tools-version: 6.1
import Foundation
import PackageDescription

// A small Vapor service with Magpie in its three places: `app.cache`, the sessions, and whole responses
// (MagpieVapor). A package of its own, so that Magpie's users never resolve Vapor.
//
// Magpie is the package two folders up, by path. SwiftPM names a path dependency after its folder, which
// is whatever the clone was called, so the name is read from this file's own path.
let magpie = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "MagpieVaporExample",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "magpie-vapor-example", targets: ["MagpieVaporExample"])
    ],
    dependencies: [
        .package(path: "../.."),
        .package(path: "../../Integrations/MagpieVapor"),
        .package(path: "../../Integrations/MagpieHTTPCache"),
        .package(path: "../Catalog"),
        .package(url: "https://github.com/vapor/vapor", from: "4.122.3"),
    ],
    targets: [
        .executableTarget(
            name: "MagpieVaporExample",
            dependencies: [
                .product(name: "Magpie", package: magpie),
                .product(name: "MagpieVapor", package: "MagpieVapor"),
                .product(name: "MagpieHTTPCache", package: "MagpieHTTPCache"),
                .product(name: "ExampleCatalog", package: "Catalog"),
                .product(name: "Vapor", package: "vapor"),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
