// The system's xxHash (Debian: libxxhash-dev). Only XXH3-64 is used, through Hashing/KeyHash.swift.
// The library is linked, not inlined: no xxHash code is compiled into Magpie.
#ifndef MAGPIE_CXXHASH_SHIM_H
#define MAGPIE_CXXHASH_SHIM_H
#include <xxhash.h>
#endif
