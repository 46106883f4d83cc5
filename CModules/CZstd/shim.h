// The system's zstd (Debian: libzstd-dev), used only by Compression/Zstd.swift.
#ifndef MAGPIE_CZSTD_SHIM_H
#define MAGPIE_CZSTD_SHIM_H
#include <zstd.h>

// ZSTD_CONTENTSIZE_UNKNOWN / _ERROR are macros of unsigned long long casts that Swift cannot import.
static inline unsigned long long magpie_zstd_contentsize_unknown(void) { return ZSTD_CONTENTSIZE_UNKNOWN; }
static inline unsigned long long magpie_zstd_contentsize_error(void) { return ZSTD_CONTENTSIZE_ERROR; }
#endif
