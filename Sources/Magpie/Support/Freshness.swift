/// What the loader API keeps beside a value in both tiers (memory entry extras, the disk record's
/// freshness block and negative flag): when the value stops being fresh, when it was loaded, and
/// whether the entry records an absence rather than a value.
///
/// An entry without freshness (`freshUntil == 0`) is fresh until its expiry: what every entry stored
/// without ``EntryOptions/freshFor`` is.
package struct Freshness: Sendable, Hashable {
    /// Until this instant (ms since 1970, exclusive) the value is fresh; after it, stale until the
    /// entry's expiry. 0: fresh until the expiry.
    package var freshUntil: Int64 = 0
    /// When the value was loaded (ms since 1970): a stale value's age is measured from it. 0 when
    /// `freshUntil` is 0.
    package var loadedAt: Int64 = 0
    /// The loader found no value: every read but the loader API's treats the key as absent.
    package var negative = false

    package static let none = Freshness()

    /// Whether a value with this freshness is fresh at `now` (ms since 1970): before fresh-until, or
    /// always when it has none.
    @inline(__always)
    package func isFresh(at now: Int64) -> Bool { freshUntil == 0 || now < freshUntil }

    package init(freshUntil: Int64 = 0, loadedAt: Int64 = 0, negative: Bool = false) {
        self.freshUntil = freshUntil
        self.loadedAt = loadedAt
        self.negative = negative
    }
}
