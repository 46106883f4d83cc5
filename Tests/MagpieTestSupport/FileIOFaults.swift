import Magpie

#if DEBUG  // the fault table exists in debug builds of Magpie only (MAGPIE_TESTING)

/// Installs (or, with nil, removes) injected I/O failures for the files under one directory. Each test
/// uses its own temporary directory, so tests running in parallel never see each other's faults.
package enum FileIOFaults {
    package static func set(under directory: String, _ inject: (@Sendable (_ call: String, _ path: String) -> Int32?)?) {
        FileIO.injectedFailures.withLock { table in
            table[directory + "/"] = inject
            FileIO.hasInjections.store(!table.isEmpty, ordering: .relaxed)
        }
    }
}
#endif
