/// A product as the origin returns it: a record a service would fetch from a database or another service,
/// about 400 bytes as JSON. The services render it as JSON on every response they build, as services do
/// with the values they cache; only the HTTP response cache keeps the rendered bytes.
public struct Product: Codable, Sendable, Equatable {
    public var id: Int
    public var name: String
    public var price: Double
    public var currency: String
    public var stock: Int
    public var category: String
    public var description: String
    public var tags: [String]

    /// The product `id`, the same for the same id.
    public init(_ id: Int) {
        self.id = id
        name = "Product \(id)"
        price = Double((id &* 7919) % 100_000) / 100
        currency = "EUR"
        stock = (id &* 31) % 500
        category = "category-\(id % 40)"
        description = """
            Product \(id) is a well-made thing that a service would fetch from a slow database or another \
            service: the kind of record that is read far more often than it changes.
            """
        tags = ["t\(id % 7)", "t\(id % 11)", "t\(id % 13)"]
    }
}
