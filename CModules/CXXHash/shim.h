// The system's xxHash (Debian: libxxhash-dev). Only XXH3-64 is used, through Hashing/KeyHash.swift.
// The library is linked, not inlined: no xxHash code is compiled into Magpie.
#ifndef MAGPIE_CXXHASH_SHIM_H
#define MAGPIE_CXXHASH_SHIM_H
#include <xxhash.h>

// On x86-64, Debian's libxxhash also exports `XXH3_64bits_withSeed_dispatch`, which picks the widest
// vector unit at run time (AVX2 where present: 2.5 x faster over a 4 KiB record on our machine than the
// SSE2 code the plain entry point is built with). Same function, same results. It is declared weak, so a
// libxxhash built without it still links and loads: the pointer is then null and the plain entry runs.
#if defined(__x86_64__)
XXH_PUBLIC_API XXH64_hash_t XXH3_64bits_withSeed_dispatch(const void *input, size_t length, XXH64_hash_t seed)
    __attribute__((weak));
#endif

/// XXH3-64 with a seed, through the run-time dispatcher when the library has one. For long inputs
/// (records); short keys are hashed through the plain entry, which is a few ns faster for them.
static inline XXH64_hash_t magpie_xxh3_64_long(const void *input, size_t length, XXH64_hash_t seed) {
#if defined(__x86_64__)
    if (XXH3_64bits_withSeed_dispatch != 0) return XXH3_64bits_withSeed_dispatch(input, length, seed);
#endif
    return XXH3_64bits_withSeed(input, length, seed);
}
#endif
