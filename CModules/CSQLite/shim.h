// The system's SQLite (Debian: libsqlite3-dev), used only by the benchmark's disk peer
// (Benchmarks/MagpieBench/Peers/SQLiteDisk.swift). The Magpie library never links it.
#ifndef MAGPIE_CSQLITE_SHIM_H
#define MAGPIE_CSQLITE_SHIM_H
#include <sqlite3.h>
#endif
