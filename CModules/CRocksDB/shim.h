// The system's RocksDB C API (Debian: librocksdb-dev), used only by the benchmark's disk peer
// (Benchmarks/MagpieBench/Peers/RocksDBDisk.swift). The Magpie library never links it.
#ifndef MAGPIE_CROCKSDB_SHIM_H
#define MAGPIE_CROCKSDB_SHIM_H
#include <rocksdb/c.h>
#endif
