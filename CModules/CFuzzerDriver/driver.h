// libFuzzer's driver entry point (compiler-rt, FuzzerInterface.h, LLVM 11 and later). It is defined by
// the fuzzer runtime that `-sanitize=fuzzer` links; nothing here links it otherwise, and only the
// `make fuzz` build (-DFUZZING) calls it. SwiftPM names an executable's entry point after its module,
// so the harness starts the driver from its own `main` rather than using the runtime's.
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
