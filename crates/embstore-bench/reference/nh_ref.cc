// nh_ref: the authors' reference NeighborHash (C++), timed on embstore-bench's keys and queries.
//
// Part of embstore (MIT). It is compiled by `embstore-bench index --reference DIR` against the
// peer's headers (`-I DIR`); the headers themselves are never copied into the project.
//
// Usage:
//   nh_ref KEYS SLOTS BATCH QUERIES REPS   time REPS repetitions over QUERIES, then exit
//   nh_ref KEYS SLOTS BATCH -              serve: one repetition per query-file path read from
//                                          stdin (one per line), until end of input
// KEYS and QUERIES are raw little-endian u64 arrays; the payload of KEYS[i] is i.
// Output (stdout), one JSON object per line: first {"ready":...} after the build, then one per
// repetition with MOPS and checksums (sum of found payloads + number of misses, as embstore's)
// of `find` (scalar), `amac_find<32>` (batch) and `amac_find_with_index<32>` writing every
// answer, found or MISSING, into an output array that is then folded (batch_out).
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "neighbor_hash/common_policy.h"
#include "neighbor_hash/neighbor_hash.h"

namespace {

constexpr uint64_t kMissing = ~uint64_t{0};  // embstore_index::MISSING
constexpr size_t kHuge = 2UL << 20;

size_t RoundHuge(size_t n) { return (n + kHuge - 1) / kHuge * kHuge; }

// The same memory as embstore's index: 2 MiB-aligned anonymous mmap with MADV_HUGEPAGE.
struct HugePolicy : neighbor::policy::DefaultPolicy<uint64_t, uint64_t> {
  template <size_t alignment = 64>
  static void* Allocate(size_t bytes) {
    size_t len = RoundHuge(bytes);
    // Over-map by 2 MiB and trim, so the table starts on a huge-page boundary.
    void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) abort();
    uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
    if (aligned > start) munmap(raw, aligned - start);
    uintptr_t end = start + len + kHuge;
    if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - aligned - len);
    void* p = reinterpret_cast<void*>(aligned);
    madvise(p, len, MADV_HUGEPAGE);
    return p;
  }
  static void Deallocate(void* ptr, size_t bytes) { munmap(ptr, RoundHuge(bytes)); }
};

using Map = neighbor::NeighborHashMap<uint64_t, uint64_t, HugePolicy>;

std::vector<uint64_t> ReadU64(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) {
    fprintf(stderr, "nh_ref: cannot open %s\n", path.c_str());
    exit(2);
  }
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  std::vector<uint64_t> v(bytes / 8);
  if (fread(v.data(), 8, v.size(), f) != v.size()) {
    fprintf(stderr, "nh_ref: short read of %s\n", path.c_str());
    exit(2);
  }
  fclose(f);
  return v;
}

using Clock = std::chrono::steady_clock;

double Mops(size_t n, Clock::time_point t0) {
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return n / s / 1e6;
}

uint64_t Scalar(const Map& m, const std::vector<uint64_t>& q) {
  uint64_t sum = 0;
  for (uint64_t k : q) {
    auto it = m.find(k);
    sum += it == m.end() ? 1 : uint64_t(it->second);
  }
  return sum;
}

uint64_t Batch(Map& m, const std::vector<uint64_t>& q, size_t batch) {
  uint64_t sum = 0, hits = 0;
  for (size_t i = 0; i < q.size(); i += batch) {
    int64_t n = std::min(batch, q.size() - i);
    m.amac_find<32>(q.data() + i, n, [&](uint64_t, uint64_t v) {
      sum += v;
      hits += 1;
    });
  }
  return sum + (q.size() - hits);
}

uint64_t BatchOut(Map& m, const std::vector<uint64_t>& q, size_t batch, std::vector<uint64_t>& out) {
  uint64_t sum = 0;
  for (size_t i = 0; i < q.size(); i += batch) {
    int64_t n = std::min(batch, q.size() - i);
    uint64_t* o = out.data();
    std::fill(o, o + n, kMissing);
    m.amac_find_with_index<32>(q.data() + i, n,
                               [o](int64_t j, uint64_t, uint64_t v) { o[j] = v; });
    for (int64_t j = 0; j < n; ++j) sum += o[j] == kMissing ? 1 : o[j];
  }
  return sum;
}

void Rep(Map& m, const std::vector<uint64_t>& q, size_t batch, int rep) {
  std::vector<uint64_t> out(batch);
  double mops[3];
  uint64_t sums[3];
  for (int j = 0; j < 3; ++j) {
    int i = (j + rep) % 3;  // rotate the order each repetition, as embstore-bench does
    auto t0 = Clock::now();
    uint64_t s = i == 0 ? Scalar(m, q) : i == 1 ? Batch(m, q, batch) : BatchOut(m, q, batch, out);
    mops[i] = Mops(q.size(), t0);
    sums[i] = s;
  }
  printf(
      "{\"rep\":%d,\"queries\":%zu,\"scalar_mops\":%.4f,\"scalar_checksum\":%llu,"
      "\"batch_mops\":%.4f,\"batch_checksum\":%llu,\"batch_out_mops\":%.4f,"
      "\"batch_out_checksum\":%llu}\n",
      rep, q.size(), mops[0], (unsigned long long)sums[0], mops[1],
      (unsigned long long)sums[1], mops[2], (unsigned long long)sums[2]);
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: nh_ref KEYS SLOTS BATCH QUERIES REPS | nh_ref KEYS SLOTS BATCH -\n");
    return 2;
  }
  std::vector<uint64_t> keys = ReadU64(argv[1]);
  size_t slots = strtoull(argv[2], nullptr, 10);
  size_t batch = std::max<size_t>(1, strtoull(argv[3], nullptr, 10));
  std::string queries = argv[4];

  auto t0 = Clock::now();
  Map m(slots);
  for (size_t i = 0; i < keys.size(); ++i) m.emplace(keys[i], uint64_t(i));
  double build_s = std::chrono::duration<double>(Clock::now() - t0).count();
  printf("{\"ready\":true,\"keys\":%zu,\"size\":%zu,\"bucket_count\":%zu,\"build_s\":%.3f}\n",
         m.size(), slots, m.bucket_count(), build_s);
  fflush(stdout);

  if (queries != "-") {
    int reps = argc > 5 ? atoi(argv[5]) : 1;
    std::vector<uint64_t> q = ReadU64(queries);
    for (int r = 0; r < reps; ++r) Rep(m, q, batch, r);
    return 0;
  }
  std::string line, loaded;
  std::vector<uint64_t> q;
  for (int rep = 0; std::getline(std::cin, line); ++rep) {
    if (line.empty()) break;
    if (line != loaded) {
      q = ReadU64(line);
      loaded = line;
    }
    Rep(m, q, batch, rep);
  }
  return 0;
}
