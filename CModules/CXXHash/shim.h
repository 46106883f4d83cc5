// The system's xxHash (Debian: libxxhash-dev). Only XXH3-64 is used, through Hashing/KeyHash.swift.
// The library is linked, not inlined: no xxHash code is compiled into Magpie.
#ifndef MAGPIE_CXXHASH_SHIM_H
#define MAGPIE_CXXHASH_SHIM_H
#include <xxhash.h>

// On x86-64, Debian's libxxhash also exports `XXH3_64bits_withSeed_dispatch`, which picks the widest
// vector unit at run time: AVX2 where present (2.5 x faster over a 4 KiB record than the SSE2 code the
// plain entry point is built with, on an AMD EPYC), AVX-512 where that is present. Same function, same
// results. It is declared weak, so a libxxhash built without it still links and loads: the pointer is
// then null and the plain entry runs.
#if defined(__x86_64__)
#include <cpuid.h>
XXH_PUBLIC_API XXH64_hash_t XXH3_64bits_withSeed_dispatch(const void *input, size_t length, XXH64_hash_t seed)
    __attribute__((weak));
#endif

/// Whether records are hashed through the dispatcher (1) or the plain entry (0). Not on an Intel CPU with
/// usable AVX-512: there the dispatcher runs 512-bit multiplies, and a core that keeps running them (a disk hit
/// every 2 us) runs all its code slower. On our Intel Xeon (family 6, model 207), in 16 same-minute pairs,
/// the plain SSE2 entry made a raw 4 KiB disk hit faster in 13 (median 0.10 us) and a compressed one, whose
/// zstd work hashes nothing, faster in 14 (median 0.38 us), although SSE2 runs several times the
/// instructions (docs/lab-notes/disk.md: no AVX-512 hashing on Intel). Other CPUs keep the dispatcher:
/// AVX2 where there is no AVX-512; AMD's AVX-512 cores were not measured.
/// Cheap (three cpuid instructions and an xgetbv), but meant to be asked once: Hashing/KeyHash.swift keeps
/// the answer.
static inline int magpie_xxh3_dispatch_wanted(void) {
#if defined(__x86_64__)
    if (XXH3_64bits_withSeed_dispatch == 0) return 0;
    unsigned int highest = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &highest, &ebx, &ecx, &edx)) return 1;
    // "GenuineIntel", as cpuid leaf 0 spells it in EBX, EDX, ECX.
    int intel = ebx == 0x756e6547 && edx == 0x49656e69 && ecx == 0x6c65746e;
    if (!intel || highest < 7) return 1;
    unsigned int eax = 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (!((ebx >> 16) & 1)) return 1;  // no AVX512F
    // AVX-512 is usable (and the dispatcher picks it) only where the OS saves its state: OSXSAVE (leaf 1,
    // ECX bit 27), then XCR0 with the SSE and AVX bits (1, 2) and opmask, ZMM_Hi256, Hi16_ZMM (5, 6, 7).
    __cpuid(1, eax, ebx, ecx, edx);
    if (!((ecx >> 27) & 1)) return 1;
    unsigned int xcr0 = 0, xcr0_high = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    return (xcr0 & 0xE6) != 0xE6;
#else
    return 0;
#endif
}

/// XXH3-64 with a seed, through the run-time dispatcher when `dispatch` (`magpie_xxh3_dispatch_wanted`'s
/// answer) says so and the library has one. For long inputs (records); short keys are hashed through the
/// plain entry, which is a few ns faster for them.
static inline XXH64_hash_t magpie_xxh3_64_long(const void *input, size_t length, XXH64_hash_t seed, int dispatch) {
#if defined(__x86_64__)
    if (dispatch && XXH3_64bits_withSeed_dispatch != 0) return XXH3_64bits_withSeed_dispatch(input, length, seed);
#endif
    return XXH3_64bits_withSeed(input, length, seed);
}
#endif
