// The target is header-only (`static inline` wrappers); SwiftPM needs a source file to build it, and
// this one compiles the header on its own.
#include "fleet_futex.h"
