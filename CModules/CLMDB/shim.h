// The system's LMDB (Debian: liblmdb-dev), used only by the benchmark's disk peer
// (Benchmarks/MagpieBench/Peers/LMDBDisk.swift). The Magpie library never links it.
#ifndef MAGPIE_CLMDB_SHIM_H
#define MAGPIE_CLMDB_SHIM_H
#include <lmdb.h>
#endif
