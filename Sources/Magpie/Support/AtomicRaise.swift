import Synchronization

extension Atomic where Value == Int64 {
    /// Raises the value to `target` unless it is there or above already (a compare-and-exchange loop:
    /// concurrent raises keep the largest).
    func raise(to target: Value) {
        var current = load(ordering: .relaxed)
        while current < target {
            let (exchanged, original) = compareExchange(expected: current, desired: target, ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }
}
