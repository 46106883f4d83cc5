import Foundation

/// Where a report's numbers come from, beyond the machine: the commit of the checkout that was built.
enum Provenance {
    /// `git rev-parse --short HEAD` of the current directory's checkout, with "+changes" when a tracked
    /// file that is built differs from that commit (prose, `*.md` and `docs/`, does not count); nil outside
    /// a git checkout or without git.
    static func commit() -> String? {
        guard let head = git(["rev-parse", "--short", "HEAD"]), !head.isEmpty else { return nil }
        let built = ["--", ".", ":(exclude)*.md", ":(exclude)docs"]
        let changes = git(["status", "--porcelain", "--untracked-files=no"] + built) ?? ""
        return changes.isEmpty ? head : head + "+changes"
    }

    /// Runs git with `arguments`; its standard output, trimmed, or nil when it fails.
    private static func git(_ arguments: [String]) -> String? {
        guard let (status, output) = try? runProcess("/usr/bin/env", ["git"] + arguments, quiet: true), status == 0 else { return nil }
        return String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
