// The AVX512-BF16 streaming GEMV over bf16 activations, shared by bf16 weights (kernels/linear.cpp) and int8
// weights (kernels/int8_weights.cpp, `--quantization int8 --dtype bf16`): vdpbf16ps multiplies 32 bf16 pairs and
// adds each pair's two products into one of 16 fp32 lanes (denormal inputs read as zero, as oneDNN's bf16 GEMMs
// on these CPUs do). An int8 weight is widened to bf16 in registers, exactly (|q| <= 127 needs 7 bits of
// significand, bf16 has 8), so its products are exact as bf16's are; the kernel then does half the FMA work a
// widening to fp32 did (one vdpbf16ps for 32 weights a row of x, against two vfmadd), which is what bounds a
// batch of rows (serving: 8 rows of a 1B step, 200 GFLOP/s of fp32 FMAs before). Private to src/kernels.
#pragma once

#include "streaming_gemv.h"

#if defined(__x86_64__)
namespace archspace::streaming_gemv {

// GCC 12's AVX512 cast and extract intrinsics start from _mm256_undefined_*(), which -Wmaybe-uninitialized
// reports as (maybe) uninitialised (a false positive: every lane is written).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define ARCHSPACE_BF16X_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

// The first `count` (< 32) of 32 lanes.
inline __mmask32 first_lanes(int64_t count) { return static_cast<__mmask32>((uint64_t{1} << count) - 1); }

// 32 weights as bf16: bf16 loaded; int8 widened through fp32 (exact) and packed. The masked forms load the lanes
// of `lanes` and zeros elsewhere (a zero adds nothing).
ARCHSPACE_BF16X_TARGET inline __m512bh load_bf16x32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
ARCHSPACE_BF16X_TARGET inline __m512bh load_bf16x32(const uint16_t* p, __mmask32 lanes) {
  return (__m512bh)_mm512_maskz_loadu_epi16(lanes, p);
}
ARCHSPACE_BF16X_TARGET inline __m512bh bf16x32_of(__m128i lo, __m128i hi) {
  return _mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)));
}
ARCHSPACE_BF16X_TARGET inline __m512bh load_bf16x32(const int8_t* p) {
  return bf16x32_of(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
}
ARCHSPACE_BF16X_TARGET inline __m512bh load_bf16x32(const int8_t* p, __mmask32 lanes) {
  return bf16x32_of(_mm_maskz_loadu_epi8(static_cast<__mmask16>(lanes), p),
                    _mm_maskz_loadu_epi8(static_cast<__mmask16>(lanes >> 16), p + 16));
}

ARCHSPACE_BF16X_TARGET inline __m256 fold16_bf16(__m512 a) {  // lanes 0-7 plus lanes 8-15
  return _mm512_castps512_ps256(_mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0x4E)));
}

// Weight rows w..w+3 (of output features n..n+3) against x rows m..m+R-1, one accumulator a pair: 32-wide dot
// products over k, the K tail as one masked step, each accumulator folded to 8 lanes and eight pairs at a time summed
// by horizontal_sums8 (which sums each vector by the same tree wherever it stands), so every (x row, weight row) pair
// takes the same steps whatever R is (rows stay batch invariant). `out(m, n, sum)` stores each fp32 sum.
template <int R, typename T, typename Out>
ARCHSPACE_BF16X_TARGET inline void dot_block_bf16x(const T* w, const uint16_t* x, int64_t m, int64_t n, int64_t K,
                                                   PacedPrefetch& ahead, const Out& out) {
  constexpr int I = 4;  // weight rows
  static_assert(I * R <= 16, "at most 16 accumulators");
  const int64_t K32 = K - K % 32;
  const __mmask32 tail = first_lanes(K % 32);
  x += m * K;
  __m512 a[R][I];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < I; ++i) a[r][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K32; k += 32) {
    ahead.advance(I * 32 * static_cast<int64_t>(sizeof(T)));
    __m512bh v[I];
#pragma GCC unroll 4
    for (int i = 0; i < I; ++i) v[i] = load_bf16x32(w + i * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = load_bf16x32(x + r * K + k);
#pragma GCC unroll 4
      for (int i = 0; i < I; ++i) a[r][i] = _mm512_dpbf16_ps(a[r][i], v[i], xv);
    }
  }
  if (K32 < K) {
    __m512bh v[I];
#pragma GCC unroll 4
    for (int i = 0; i < I; ++i) v[i] = load_bf16x32(w + i * K + K32, tail);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = load_bf16x32(x + r * K + K32, tail);
#pragma GCC unroll 4
      for (int i = 0; i < I; ++i) a[r][i] = _mm512_dpbf16_ps(a[r][i], v[i], xv);
    }
  }
  constexpr int G = 8 / I;  // x rows in one eight-way sum (the last one's repeated where R runs out)
#pragma GCC unroll 8
  for (int r = 0; r < R; r += G) {
    __m256 f[8];
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < I; ++i) f[j * I + i] = fold16_bf16(a[r + j < R ? r + j : R - 1][i]);
    alignas(32) float s[8];
    _mm256_store_ps(s, horizontal_sums8(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]));
    for (int j = 0; j < G && r + j < R; ++j)
      for (int i = 0; i < I; ++i) out(m + r + j, n + i, s[j * I + i]);
  }
}

// Weight rows w..w+3 (of block n) against every row of x: passes over 4, 2 and 1 rows of x (4 x 4 accumulators).
// int8 weights are widened again in each pass; two weight rows against 8 rows of x (widening once for 8) measured
// no faster at the 1B's 8-row step (78 against 79 ms), nor did a widened copy of the block read back by each pass
// (87-104 ms).
inline int64_t passes_over_block(int64_t M) { return M / 4 + M % 4 / 2 + M % 2; }

template <typename T, typename Out>
ARCHSPACE_BF16X_TARGET inline void dot_passes(const T* w, const uint16_t* x, int64_t M, int64_t n, int64_t K,
                                              PacedPrefetch& ahead, const Out& out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) dot_block_bf16x<4>(w, x, m, n, K, ahead, out);
  for (; m + 2 <= M; m += 2) dot_block_bf16x<2>(w, x, m, n, K, ahead, out);
  for (; m < M; ++m) dot_block_bf16x<1>(w, x, m, n, K, ahead, out);
}

// Rows [n0, n1) of W [N, K] (bf16 bits or int8) against the M rows of x (bf16 bits, [M, K]). `then`: as
// WeightPrefetch::block's.
template <typename T, typename Out>
ARCHSPACE_BF16X_TARGET void dot_rows_bf16x(const T* W, const uint16_t* x, int64_t M, int64_t K, int64_t n0, int64_t n1,
                                           const char* then, const Out& out) {
  const int64_t K32 = K - K % 32;
  const __mmask32 tail = first_lanes(K % 32);
  const int64_t step_bytes = 4 * 32 * static_cast<int64_t>(sizeof(T));
  const WeightPrefetch prefetch(K, sizeof(T));
  int64_t n = n0;
  // One row of x (batch-1 decoding): eight weight rows a pass, so the per-block work (the prefetch's set-up, the
  // horizontal sums, the roundings) is paid per 8 rows instead of 4: at 2 bytes a weight it cost as much per byte as
  // the fp32 kernel's at 4 with twice its blocks. Each row's sum runs as in the 4-row loop below (one accumulator,
  // the same k order, the same folds), so results are those of any other batch bit for bit.
  for (; M == 1 && n + 8 <= n1; n += 8) {
    PacedPrefetch ahead_lo = prefetch.block(W, n, n1, then), ahead_hi = prefetch.block(W, n + 4, n1, then);
    const T* w = W + n * K;
    __m512 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      ahead_lo.advance(step_bytes);
      ahead_hi.advance(step_bytes);
      const __m512bh xv = load_bf16x32(x + k);
      for (int i = 0; i < 8; ++i) a[i] = _mm512_dpbf16_ps(a[i], load_bf16x32(w + i * K + k), xv);
    }
    if (K32 < K) {
      const __m512bh xv = load_bf16x32(x + K32, tail);
      for (int i = 0; i < 8; ++i) a[i] = _mm512_dpbf16_ps(a[i], load_bf16x32(w + i * K + K32, tail), xv);
    }
    alignas(32) float s[8];
    _mm256_store_ps(s, horizontal_sums8(fold16_bf16(a[0]), fold16_bf16(a[1]), fold16_bf16(a[2]), fold16_bf16(a[3]),
                                        fold16_bf16(a[4]), fold16_bf16(a[5]), fold16_bf16(a[6]), fold16_bf16(a[7])));
    for (int i = 0; i < 8; ++i) out(0, n + i, s[i]);
    ahead_lo.finish();
    ahead_hi.finish();
  }
  for (; n + 4 <= n1; n += 4) {
    PacedPrefetch ahead = prefetch.block(W, n, n1, then, passes_over_block(M));
    dot_passes(W + n * K, x, M, n, K, ahead, out);
    ahead.finish();
  }
  // The last N % 4 rows, one at a time with the same instruction.
  for (; n < n1; ++n) {
    const T* w = W + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const uint16_t* xm = x + m * K;
      __m512 a = _mm512_setzero_ps();
      for (int64_t k = 0; k < K32; k += 32) a = _mm512_dpbf16_ps(a, load_bf16x32(w + k), load_bf16x32(xm + k));
      if (K32 < K) a = _mm512_dpbf16_ps(a, load_bf16x32(w + K32, tail), load_bf16x32(xm + K32, tail));
      out(m, n, _mm512_reduce_add_ps(a));
    }
  }
}

#undef ARCHSPACE_BF16X_TARGET
#pragma GCC diagnostic pop

}  // namespace archspace::streaming_gemv
#endif
