// What the engine's streaming GEMV kernels share (kernels/linear.cpp's fp32 and bf16 kernels,
// kernels/int8_weights.cpp's int8 kernel): the weight prefetch, the eight-way horizontal sum, the split of
// the output features over threads, and the scalar and AVX2 kernels, one template for the three weight types
// (the AVX512 ones differ by type: bf16 multiplies in bf16, fp32 and int8 block x differently). Private to
// src/model.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace::streaming_gemv {

// The rows of x as the kernels see it: every dimension but the last (features) flattened.
inline int64_t rows_of(const at::Tensor& x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

// Splits the output features of `count` matrices (the weights one x multiplies: q/k/v, or gate/up) over threads
// as one list of four-row blocks: the matrices share one parallel region, and a thread whose rows run on into the
// next matrix prefetches that matrix's first rows while it finishes the last ones (`then`, below) instead of
// starting it cold. 256 rows a task at least, so that small matrices do not pay for waking threads.
// `rows(i, n0, n1, then)` computes features [n0, n1) of matrix i for every row of x; `then` is the next matrix
// when this thread goes on with its first rows (n1 is then matrix i's last row), else null. A block never spans
// two matrices.
template <typename T, typename Rows>
void for_feature_blocks(const int64_t* N, const T* const* W, size_t count, const Rows& rows) {
  int64_t blocks = 0;
  for (size_t i = 0; i < count; ++i) blocks += (N[i] + 3) / 4;
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    int64_t first = 0;  // matrix i's first block in the list
    for (size_t i = 0; i < count && first < b1; first += (N[i] + 3) / 4, ++i) {
      const int64_t end = first + (N[i] + 3) / 4;
      if (end <= b0) continue;
      const void* then = b1 > end && i + 1 < count ? static_cast<const void*>(W[i + 1]) : nullptr;
      rows(i, 4 * (std::max(b0, first) - first), std::min(N[i], 4 * (std::min(b1, end) - first)),
           static_cast<const char*>(then));
    }
  });
}

// One matrix: `rows(n0, n1)`.
template <typename Rows>
void for_feature_blocks(int64_t N, const Rows& rows) {
  const char* none = nullptr;
  for_feature_blocks(&N, &none, 1, [&](size_t, int64_t n0, int64_t n1, const char*) { rows(n0, n1); });
}

#if defined(__x86_64__)
// Software prefetch: a weight matrix is one sequential stream, but the hardware prefetchers restart at every
// 4 KB page and, while the kernel computes on several rows of x, do not keep enough lines in flight. Each
// block of four rows asks for the block 64 KB ahead (within this thread's range of rows). Measured on
// evaluation's decode (micro preset, gsm8k, 5-8 rows, the head [100278 x 64] read from memory every step;
// Zen 5, 2 threads, medians of 4-5 alternating runs): AVX512 kernel 1.20-1.38x, AVX2 kernel 1.22x requests/s;
// 32-128 KB ahead within noise of each other, 4 KB and 256 KB slower; batch-1 decode of the 190M preset (fp32
// and bf16) unchanged within noise. Into L2 (T1), not L1 (T0): on the same Zen 4 host (2026-12-03, 2 threads,
// 3 alternating rounds of 190M batch-1 decode) T1 against T0 took bf16 from 37-43 to 59-60 tok/s and the int8
// kernel from 40-53 to 70-80, fp32 within noise (23-28 against 24-30); the int8 head [100278 x 768] read at
// 20-28 GB/s against 9 (bench_linear). A T0 prefetch occupies L1's few miss buffers and lines that the rows
// being multiplied need; L2 holds 64 KB ahead easily.
// Paced, not in a burst: the block ahead is asked for a line at a time as the kernel's k loop reads the same
// number of bytes of its own block (PacedPrefetch::advance), so the requests stay spread between the loads
// and arithmetic instead of filling the miss queues at the start of every block and then idling. Measured
// on a Zen 4 host (2026-12-03, 2 threads, a stand-alone copy of the loops over 190 MB of weights, medians of
// 7): fp32 31 GB/s paced against 19 in a burst, the int8 kernel 16-19 against 13-15. In the engine, old and
// new builds alternating: bench_linear --shapes step (every 190M weight once, 6 rounds) fp32 28.7 against
// 24.9 GB/s, int8 23.7 against 19.2; 190M batch-1 decode (7 rounds) fp32 1.17x, bf16 1.10x, int8 1.17x.
constexpr int64_t kPrefetchAheadBytes = 64 * 1024;  // also for the int8 kernel: 128 and 256 KB within noise

// Asks for the 64-byte line at p to be brought into L2.
struct PrefetchIntoL2 {
  void operator()(const char* p) const { _mm_prefetch(p, _MM_HINT_T1); }
};

// The prefetch of one block of four rows `ahead` rows on, spread over the loop that multiplies the current
// block: advance(bytes) after each step that read `bytes` of the current block asks for the lines of the
// block ahead up to as far into it; finish() asks for what is left (the K tail's lines). A step is called
// once per pass over the block; passes after the first (more rows of x) find everything asked for already.
// With `passes` > 1 (several passes of rows of x over the same block: a batch of 8 rows is two passes of 4),
// the block ahead is spread over all of them, a line for every `passes` lines read: asked for in the first pass
// alone, the memory stood idle in the later ones, which then ran after the reads instead of beside them.
// `Issue` is the prefetch instruction (a recorder in tests/unit/test_streaming_gemv.cpp).
template <typename Issue = PrefetchIntoL2>
class BasicPacedPrefetch {
 public:
  BasicPacedPrefetch(const char* block_ahead, int64_t block_bytes, Issue issue = {}, int64_t passes = 1)
      : base_(block_ahead), end_(block_ahead ? block_bytes : 0), issue_(issue), passes_(std::max<int64_t>(1, passes)) {}

  void advance(int64_t bytes) {
    if (next_ >= end_) return;
    asked_ += bytes;
    for (; next_ * passes_ < asked_ && next_ < end_; next_ += 64) issue_(base_ + next_);
  }
  void finish() { advance(end_); }

  const char* block() const { return base_; }
  int64_t block_bytes() const { return end_; }

 private:
  const char* base_;
  int64_t end_;
  Issue issue_;
  int64_t passes_;
  int64_t asked_ = 0, next_ = 0;
};
using PacedPrefetch = BasicPacedPrefetch<>;

class WeightPrefetch {
 public:
  WeightPrefetch(int64_t K, int64_t element_bytes, int64_t ahead_bytes = kPrefetchAheadBytes)
      : row_bytes_(std::max<int64_t>(1, K * element_bytes)), ahead_rows_((ahead_bytes / row_bytes_ + 4) / 4 * 4) {}

  // The paced prefetch of the block of four rows `ahead_rows_` after row n of W; if that block is not before n1
  // (this thread's range ends first), the same bytes further on in `then` (the next matrix this thread goes on
  // with, from its first row; same row width), or nothing.
  // `passes`: the passes over the current block (PacedPrefetch's).
  PacedPrefetch block(const void* W, int64_t n, int64_t n1, const char* then = nullptr, int64_t passes = 1) const {
    if (n + ahead_rows_ + 4 > n1) {
      if (!then) return PacedPrefetch(nullptr, 0);
      return PacedPrefetch(then + (n + ahead_rows_ - n1) * row_bytes_, 4 * row_bytes_, {}, passes);
    }
    return PacedPrefetch(static_cast<const char*>(W) + (n + ahead_rows_) * row_bytes_, 4 * row_bytes_, {}, passes);
  }

 private:
  int64_t row_bytes_;
  int64_t ahead_rows_;  // a multiple of the four-row block, at least kPrefetchAheadBytes
};

// The eight sums of a0..a7's lanes, in that order, in one vector: three rounds of pairwise adds instead of
// eight separate horizontal sums (which cost as much as the FMAs when K is small).
__attribute__((target("avx2,fma"))) inline __m256 horizontal_sums8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                                                                   __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Eight weights as fp32: fp32 loaded, bf16 (the high half of an fp32's bits) shifted, int8 converted.
__attribute__((target("avx2,fma"))) inline __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 widen8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
__attribute__((target("avx2,fma"))) inline __m256 widen8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

// One weight as fp32 (bf16 as its bit pattern), exactly.
inline float widen(float w) { return w; }
inline float widen(int8_t w) { return static_cast<float>(w); }
inline float widen(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The kernels below: rows [n0, n1) of sum_k W[n, k] x[m, k] for the M rows of x (fp32, [M, K]), with W [N, K]
// of fp32, bf16 bits or int8; `out(m, n, sum)` stores each fp32 sum (the caller's rounding to bf16, or int8's
// row scale). Every path sums a (row of x, weight row) pair in an order of its own that does not depend on M,
// so a row's results do not depend on its batch, bit for bit.

// One pair at a time, in k order (the tails of the vector kernels and CPUs without AVX2).
template <typename T, typename Out>
void dot_rows_scalar(const T* W, const float* x, int64_t M, int64_t K, int64_t n0, int64_t n1, const Out& out) {
  for (int64_t n = n0; n < n1; ++n) {
    const T* w = W + n * K;
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += widen(w[k]) * x[m * K + k];
      out(m, n, acc);
    }
  }
}

#if defined(__x86_64__)
// One pass of dot_rows_avx2: weight rows n..n+3 (from w) against x rows m..m+R-1, one accumulator (FMA chain)
// a pair over k < K - K % 8, then its lanes summed (horizontal_sums8, two x rows a call) and the K tail added
// one product at a time.
template <int R, typename T, typename Out>
__attribute__((target("avx2,fma"))) inline void dot_block_avx2(const T* w, const float* x, int64_t m, int64_t n,
                                                               int64_t K, PacedPrefetch& ahead, const Out& out) {
  const int64_t K8 = K - K % 8;
  const float* xm = x + m * K;
  __m256 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) a[r][i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    ahead.advance(4 * 8 * static_cast<int64_t>(sizeof(T)));
    __m256 v[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) v[i] = widen8(w + i * K + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xm + r * K + k);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[r][i] = _mm256_fmadd_ps(v[i], xv, a[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r += 2) {
    const int q = r + 1 < R ? r + 1 : r;  // x rows r and r + 1 (or r twice) in one eight-way sum
    alignas(32) float s[8];
    _mm256_store_ps(s, horizontal_sums8(a[r][0], a[r][1], a[r][2], a[r][3], a[q][0], a[q][1], a[q][2], a[q][3]));
    for (int j = 0; j <= q - r; ++j) {
      const float* xr = xm + (r + j) * K;
      for (int i = 0; i < 4; ++i) {
        float sum = s[4 * j + i];
        for (int64_t k = K8; k < K; ++k) sum += widen(w[i * K + k]) * xr[k];
        out(m + r + j, n + i, sum);
      }
    }
  }
}

// Four weight rows against two rows of x a pass (each weight widened once for both), the last odd row alone; the
// 4 x K block of weights stays in L1 across the passes. `then`: as WeightPrefetch::block's.
template <typename T, typename Out>
__attribute__((target("avx2,fma"))) void dot_rows_avx2(const T* W, const float* x, int64_t M, int64_t K, int64_t n0,
                                                       int64_t n1, const char* then, const Out& out) {
  const WeightPrefetch prefetch(K, sizeof(T));
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    PacedPrefetch ahead = prefetch.block(W, n, n1, then, M / 2 + M % 2);
    const T* w = W + n * K;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) dot_block_avx2<2>(w, x, m, n, K, ahead, out);
    for (; m < M; ++m) dot_block_avx2<1>(w, x, m, n, K, ahead, out);
    ahead.finish();
  }
  dot_rows_scalar(W, x, M, K, n, n1, out);
}
#endif

}  // namespace archspace::streaming_gemv
