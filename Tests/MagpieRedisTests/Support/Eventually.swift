import Testing

struct ConditionTimedOut: Error, CustomStringConvertible {
    let description: String
}

/// Polls `condition` every 5 ms until it holds; throws (failing the test) after `timeout`.
func eventually(
    timeout: Duration, _ condition: () async throws -> Bool,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    if try await condition() { return }
    Issue.record("condition not met within \(timeout)", sourceLocation: sourceLocation)
    throw ConditionTimedOut(description: "condition not met within \(timeout)")
}
