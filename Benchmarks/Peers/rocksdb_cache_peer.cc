// RocksDB's block cache (Debian's librocksdb-dev) on `magpie-bench memory`'s workload, run by
// magpie-bench itself as the `rocksdb-hcc` / `rocksdb-lru` systems so that the ratios come from one run.
// Grown from the project's first peer program (rocks_cache_bench.cc, not kept): its key and rank generation,
// which Benchmarks/MagpieBench/Scenarios/Workload.swift repeats (so both programs see the same keys in the
// same order), plus the scenario's parameters and timed passes.
//
// Build (what `make peers` does):
//   g++ -O2 -std=c++17 rocksdb_cache_peer.cc -o rocksdb-cache-peer -lrocksdb -lpthread
// Usage:
//   rocksdb-cache-peer KIND THREADS OPS HOT KEYS ALPHA CAPACITY VALUE_SIZE PASSES WARMUP SEED THREAD_SEED_BASE
//     KIND      hcc (HyperClockCache) or lru (sharded LRUCache)
//     HOT       0: Zipf(ALPHA) over KEYS ranks; n > 0: every thread reads ranks 0..n-1 uniformly
//     CAPACITY  bytes; every entry is charged 16 + VALUE_SIZE, metadata not charged
// Each operation: Lookup; a hit reads the value's first byte and releases the handle (RocksDB copies
// nothing); a miss inserts a new VALUE_SIZE-byte value (cache-aside). A one-thread warm-up of WARMUP
// operations, then PASSES timed passes over the same per-thread sequences. Output, one line per pass:
//   pass <i> seconds <s> hits <h> operations <n>
// then: usage <bytes>
#include <rocksdb/cache.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace rocksdb;

static inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static void deleteValue(const Slice&, void* value) { free(value); }

int main(int argc, char** argv) {
  if (argc != 13) {
    fprintf(stderr,
            "usage: %s hcc|lru THREADS OPS HOT KEYS ALPHA CAPACITY VALUE_SIZE PASSES WARMUP SEED THREAD_SEED_BASE\n",
            argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const int threads = atoi(argv[2]);
  const size_t ops = strtoull(argv[3], nullptr, 10);
  const size_t hot = strtoull(argv[4], nullptr, 10);
  const size_t keys = strtoull(argv[5], nullptr, 10);
  const double alpha = atof(argv[6]);
  const size_t capacity = strtoull(argv[7], nullptr, 10);
  const size_t valueSize = strtoull(argv[8], nullptr, 10);
  const int passes = atoi(argv[9]);
  const size_t warmup = strtoull(argv[10], nullptr, 10);
  const uint64_t seed = strtoull(argv[11], nullptr, 10);
  const uint64_t threadSeedBase = strtoull(argv[12], nullptr, 10);
  if (threads < 1 || keys < 1 || passes < 1 || valueSize < 1 || (kind != "hcc" && kind != "lru")) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }

  std::shared_ptr<Cache> cache;
  const size_t charge = 16 + valueSize;
  if (kind == "lru") {
    LRUCacheOptions options(capacity, -1, false, 0.0);
    options.metadata_charge_policy = kDontChargeCacheMetadata;
    cache = NewLRUCache(options);
  } else {
    HyperClockCacheOptions options(capacity, charge);
    options.metadata_charge_policy = kDontChargeCacheMetadata;
    cache = options.MakeSharedCache();
  }

  std::vector<double> cdf;
  if (hot == 0) {
    cdf.resize(keys);
    double sum = 0;
    for (size_t i = 0; i < keys; i++) {
      sum += 1.0 / std::pow((double)(i + 1), alpha);
      cdf[i] = sum;
    }
    for (auto& c : cdf) c /= sum;
  }
  auto generate = [&](uint64_t state, size_t count) {
    std::vector<uint32_t> ranks(count);
    for (size_t i = 0; i < count; i++) {
      state = splitmix(state);
      if (hot) {
        ranks[i] = (uint32_t)(state % hot);
        continue;
      }
      double u = (state >> 11) * (1.0 / 9007199254740992.0);
      size_t rank = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
      ranks[i] = (uint32_t)std::min(rank, keys - 1);
    }
    return ranks;
  };
  auto makeKey = [](uint32_t rank, char* key) {  // 16 bytes: splitmix(rank) ‖ rank, little-endian
    uint64_t a = splitmix(rank), b = rank;
    memcpy(key, &a, 8);
    memcpy(key + 8, &b, 8);
  };
  auto run = [&](const std::vector<uint32_t>& sequence, std::atomic<uint64_t>* hits) {
    char key[16];
    uint64_t found = 0, sink = 0;
    for (uint32_t rank : sequence) {
      makeKey(rank, key);
      Slice slice(key, 16);
      Cache::Handle* handle = cache->Lookup(slice);
      if (handle) {
        found++;
        sink += ((const char*)cache->Value(handle))[0];
        cache->Release(handle);
      } else {
        char* value = (char*)malloc(valueSize);
        memset(value, (int)(rank & 0xff), valueSize);
        Status status = cache->Insert(slice, value, charge, &deleteValue);
        if (!status.ok()) free(value);
      }
    }
    hits->fetch_add(found);
    if (sink == 42) fprintf(stderr, " ");
  };

  {
    std::atomic<uint64_t> ignored{0};
    run(generate(seed, warmup), &ignored);
  }
  std::vector<std::vector<uint32_t>> sequences;
  for (int t = 0; t < threads; t++) sequences.push_back(generate(threadSeedBase + t, ops));
  for (int pass = 0; pass < passes; pass++) {
    std::atomic<uint64_t> hits{0};
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; t++) workers.emplace_back(run, std::cref(sequences[t]), &hits);
    for (auto& worker : workers) worker.join();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    printf("pass %d seconds %.9f hits %llu operations %llu\n", pass, seconds, (unsigned long long)hits.load(),
           (unsigned long long)(ops * threads));
  }
  printf("usage %zu\n", cache->GetUsage());
  return 0;
}
