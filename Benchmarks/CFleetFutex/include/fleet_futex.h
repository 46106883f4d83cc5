// futex(2) for the fleet benchmark's cross-process key lock (Benchmarks/MagpieBench/Fleet/FleetKeyLock.swift):
// Swift cannot call the variadic syscall(2), so the two operations the lock needs are wrapped here.
//
// Both use the shared (not FUTEX_PRIVATE_FLAG) operations: the lock word lives in a MAP_SHARED file
// mapping that every worker process maps at an address of its own, and a private futex is keyed by the
// caller's address space and virtual address, so a wake from one process would never reach a waiter in
// another. A shared futex is keyed by the mapped file's page and offset.
#ifndef FLEET_FUTEX_H
#define FLEET_FUTEX_H
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/// FUTEX_WAIT on the 32-bit, 4-byte aligned word at `word`: sleeps while it holds `expected`, at most
/// `timeout_ns` (relative, CLOCK_MONOTONIC; a negative value waits without a limit). Returns 0 when
/// woken (possibly spuriously: the caller re-reads the word), otherwise the errno: EAGAIN (the word no
/// longer held `expected` on entry), ETIMEDOUT, EINTR (a signal).
static inline int fleet_futex_wait(void *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec timeout;
    struct timespec *limit = NULL;
    if (timeout_ns >= 0) {
        timeout.tv_sec = (time_t)(timeout_ns / 1000000000);
        timeout.tv_nsec = (long)(timeout_ns % 1000000000);
        limit = &timeout;
    }
    long result = syscall(SYS_futex, word, FUTEX_WAIT, expected, limit, NULL, 0);
    return result == 0 ? 0 : errno;
}

/// FUTEX_WAKE: wakes at most `count` threads (in any process) waiting on `word`. Returns how many it
/// woke, or -errno.
static inline int fleet_futex_wake(void *word, int32_t count) {
    long result = syscall(SYS_futex, word, FUTEX_WAKE, count, NULL, NULL, 0);
    return result >= 0 ? (int)result : -errno;
}

#endif
