// Copies out of a memory-mapped file that survive the file shrinking underneath them.
//
// A read through a mapping of a file page that no longer exists (the file was truncated behind the
// cache's back) or that the kernel cannot read (an I/O error) raises SIGBUS, which by default kills the
// process. `magpie_guarded_copy` turns that signal into a return value: it records a jump point in a
// thread-local, copies, and a SIGBUS raised while that point is set jumps back to it. SIGBUS raised
// anywhere else goes to the handler that was installed before ours (or the default action).
#ifndef MAGPIE_GUARD_H
#define MAGPIE_GUARD_H
#include <stddef.h>
#include <stdint.h>

/// Installs the process-wide SIGBUS handler, once. Returns 0 when it is installed, -1 when sigaction
/// failed (then guarded copies must not be used: the caller reads with pread instead).
int magpie_guard_install(void);

/// Copies `count` bytes from `source` (inside a mapping) to `destination`. Returns 0 on success, -1 if a
/// SIGBUS interrupted the copy (then `destination` holds an unspecified prefix). Requires a successful
/// `magpie_guard_install` first; not async-signal-safe, not reentrant on one thread.
int magpie_guarded_copy(void *destination, const void *source, size_t count);

/// Asks the CPU to start loading `count` bytes at `start` into its caches, one request per 64-byte line,
/// and returns at once. A hint only: a prefetch never faults (a line of an unmapped or truncated page is
/// simply not loaded). The caller keeps `start + count` from wrapping (FileMapping.prefetch passes a
/// range inside one mapping); the arithmetic is on integers, so no pointer is formed past it.
static inline void magpie_prefetch(const void *start, size_t count) {
    uintptr_t line = (uintptr_t)start & ~(uintptr_t)63;
    uintptr_t end = (uintptr_t)start + count;
    for (; line < end; line += 64) {
        __builtin_prefetch((const void *)line, 0, 3);
    }
}

/// Tells the CPU this thread is spinning on a lock another thread holds (x86 `pause`, arm64 `yield`).
static inline void magpie_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/// A relaxed atomic load and store of a word: the disk tier's read hints (Disk/BucketReadHints.swift), written
/// under a bucket's lock and read without it, only ever as prefetch addresses.
static inline uintptr_t magpie_load_relaxed(const uintptr_t *word) {
    return __atomic_load_n(word, __ATOMIC_RELAXED);
}

static inline void magpie_store_relaxed(uintptr_t *word, uintptr_t value) {
    __atomic_store_n(word, value, __ATOMIC_RELAXED);
}

#endif
