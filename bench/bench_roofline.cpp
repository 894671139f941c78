// The machine's rooflines, measured (issue 62): what a decode step (memory-bound) and a prefill (compute-bound) could
// reach at best on these cores, so each engine's tokens/s can be stated as a share of it.
//   - read_gb_s: memory read bandwidth, every thread summing its own part of a 1 GiB buffer (larger than any cache):
//     the median of --repeat passes of the fastest of twelve ways to read (1 or 4 streams a thread, software
//     prefetch 0, 1 or 4 KB ahead, 4 KB or 2 MB pages: the engine's large tensors are on 2 MB pages, and llama.cpp's
//     weights are a file mapping the page cache may hold in huge pages);
//   - fp32_avx512_gflop_s / fp32_avx2_gflop_s: peak FMA throughput, 12 independent accumulators a thread (enough to
//     cover the FMA latency on every x86 core we run on), nothing from memory;
//   - bf16_dot_gflop_s: the same with AVX512-BF16's vdpbf16ps (2 products a lane), where the CPU has it;
//   - int8_dot_gop_s: the same with AVX512-VNNI's vpdpbusd (4 products a lane), where the CPU has it (llama.cpp's
//     q8_0 dot products use it).
// JSON on stdout. --threads (default: all cores) as the engines under test use them.
//
//     build/bench_roofline [--threads N] [--repeat 7]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs f(thread) on `threads` threads at once; the wall time of the slowest.
double timed_on_threads(int threads, const std::function<void(int)>& f) {
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back(f, t);
  for (auto& th : pool) th.join();
  return seconds_since(start);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int kAccumulators = 12;
constexpr long kIterations = 20'000'000;

// Each function keeps kAccumulators independent chains busy and returns a value the compiler cannot drop.
__attribute__((target("avx512f"))) float fma_avx512() {
  __m512 a[kAccumulators];
  for (auto& x : a) x = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  __m512 s = a[0];
  for (int j = 1; j < kAccumulators; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2() {
  __m256 a[kAccumulators];
  for (auto& x : a) x = _mm256_set1_ps(1.0f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  __m256 s = a[0];
  for (int j = 1; j < kAccumulators; ++j) s = _mm256_add_ps(s, a[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f,avx512bf16"))) float dot_bf16() {
  __m512 a[kAccumulators];
  for (auto& x : a) x = _mm512_setzero_ps();
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3400);  // 1, 2^-23
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) a[j] = _mm512_dpbf16_ps(a[j], b, c);
  __m512 s = a[0];
  for (int j = 1; j < kAccumulators; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) float dot_int8() {
  __m512i a[kAccumulators];
  for (auto& x : a) x = _mm512_setzero_si512();
  const __m512i b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(1);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) a[j] = _mm512_dpbusd_epi32(a[j], b, c);
  __m512i s = a[0];
  for (int j = 1; j < kAccumulators; ++j) s = _mm512_add_epi32(s, a[j]);
  return static_cast<float>(_mm512_reduce_add_epi32(s));
}

// Operations a second of `kernel` on every thread: ops_per_call counts each lane's products as two (multiply, add).
double peak(int threads, int repeat, double ops_per_call, float (*kernel)()) {
  std::vector<double> rates;
  std::vector<float> sink(threads);
  for (int r = 0; r < repeat; ++r) {
    const double s = timed_on_threads(threads, [&](int t) { sink[t] = kernel(); });
    rates.push_back(threads * ops_per_call / s / 1e9);
  }
  if (sink[0] == 12345.0f) std::puts("");  // keeps the sums alive
  return median(rates);
}

// Sums of 8-float vectors over `streams` equal parts of [p, p + n) read side by side, each with a software prefetch
// `ahead` bytes in front (0: none): far fewer instructions than bytes, so the memory is the limit. A plain
// sequential loop leaves bandwidth unused on some cores (the hardware prefetcher alone keeps too few lines in
// flight); the engine's streaming kernels prefetch, so the probe tries the ways a kernel can read and keeps the
// fastest.
__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n, int streams, size_t ahead) {
  const size_t part = n / streams / 32 * 32;
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (size_t i = 0; i < part; i += 32)
    for (int s = 0; s < streams; ++s) {
      const float* q = p + s * part + i;
      if (ahead) _mm_prefetch(reinterpret_cast<const char*>(q) + ahead, _MM_HINT_T0);
      for (int j = 0; j < 4; ++j) a[j] = _mm256_add_ps(a[j], _mm256_loadu_ps(q + 8 * j));
    }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  return out[0];
}

// A 1 GiB buffer on 4 KB pages, or on 2 MB transparent huge pages (2 MB aligned and advised MADV_HUGEPAGE before
// its first touch), as the engine's large tensors are (util/malloc_policy.h).
struct ReadBuffer {
  float* data = nullptr;
  explicit ReadBuffer(size_t bytes, bool huge) {
    data = static_cast<float*>(std::aligned_alloc(huge ? size_t{2} << 20 : 4096, bytes));
    if (!data) throw std::bad_alloc();
    if (huge) madvise(data, bytes, MADV_HUGEPAGE);  // advisory: a kernel without THP reads 4 KB pages
  }
  ~ReadBuffer() { std::free(data); }
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
};

// GB/s of the fastest way to read; each way's figure into `by_way` ("<streams> streams, prefetch <bytes>", with
// ", 2 MB pages" on huge pages).
double read_bandwidth(int threads, int repeat, nlohmann::ordered_json& by_way) {
  const size_t n = (size_t{1} << 30) / sizeof(float);
  const size_t part = n / threads;
  std::vector<float> sink(threads);
  double best = 0;
  for (const bool huge : {false, true}) {
    ReadBuffer buffer(n * sizeof(float), huge);
    // First touch by the thread that reads each part, as the engines' threads touch their own weights.
    timed_on_threads(threads, [&](int t) { std::memset(buffer.data + t * part, 0, part * sizeof(float)); });
    for (const int streams : {1, 4})
      for (const size_t ahead : {size_t{0}, size_t{1024}, size_t{4096}}) {
        std::vector<double> rates;
        for (int r = 0; r < repeat + 1; ++r) {
          const double s = timed_on_threads(
              threads, [&](int t) { sink[t] = sum_avx2(buffer.data + t * part, part, streams, ahead); });
          if (r > 0) rates.push_back(part * threads * sizeof(float) / s / 1e9);  // the first pass is a warm-up
        }
        by_way[std::to_string(streams) + " streams, prefetch " + std::to_string(ahead) + (huge ? ", 2 MB pages" : "")] =
            median(rates);
        best = std::max(best, median(rates));
      }
  }
  if (sink[0] == 12345.0f) std::puts("");
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency()), repeat = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--threads" || a == "--repeat") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v < 1) {
        std::fprintf(stderr, "bench_roofline: %s must be a positive integer\n", a.c_str());
        return 2;
      }
      (a == "--threads" ? threads : repeat) = v;
    } else {
      std::fprintf(stderr, "usage: bench_roofline [--threads N] [--repeat N]\n");
      return 2;
    }
  }
  __builtin_cpu_init();
  nlohmann::ordered_json out = {{"threads", threads}, {"repeat", repeat}};
  const double chains = double(kIterations) * kAccumulators;
  nlohmann::ordered_json by_way;
  out["read_gb_s"] = read_bandwidth(threads, repeat, by_way);
  out["read_gb_s_by_way"] = by_way;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    out["fp32_avx2_gflop_s"] = peak(threads, repeat, chains * 8 * 2, fma_avx2);
  if (__builtin_cpu_supports("avx512f"))
    out["fp32_avx512_gflop_s"] = peak(threads, repeat, chains * 16 * 2, fma_avx512);
  if (__builtin_cpu_supports("avx512bf16"))
    out["bf16_dot_gflop_s"] = peak(threads, repeat, chains * 16 * 2 * 2, dot_bf16);
  if (__builtin_cpu_supports("avx512vnni"))
    out["int8_dot_gop_s"] = peak(threads, repeat, chains * 16 * 4 * 2, dot_int8);
  std::puts(out.dump(2).c_str());
  return 0;
}
