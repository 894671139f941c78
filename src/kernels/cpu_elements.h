// Element access shared by the engine's CPU kernels over fp32 or bf16 rows (fused_norm_rope, decode_attention,
// cross_entropy_rows): one value as fp32, one fp32 value stored back (bf16: rounded to nearest even), 8 values
// widened to fp32 in an AVX2 register (a bf16 value is the high half of an fp32) and stored back, and an 8-wide
// exp. Private to src: the model's kernels and kernels/adamw.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace::cpu_elements {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const at::BFloat16* p, int64_t i) { return static_cast<float>(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(at::BFloat16* p, int64_t i, float v) { p[i] = at::BFloat16(v); }

// Below this exp's result is under FLT_MIN (subnormal); the AVX2 exp gives 0 there.
constexpr float kExpLow = -87.33f;
constexpr float kExpHigh = 88.3f;

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
__attribute__((target("avx2,fma"))) inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// Rounded to nearest even as at::BFloat16(float) rounds (NaN becomes its canonical 0x7fc0).
__attribute__((target("avx2,fma"))) inline void store8(at::BFloat16* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  // 8 x 32-bit lanes (values below 2^16) -> 8 x 16 bits: pack within each 128-bit half, then join the halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2 / 2, ln2 / 2] (ln 2 split in two so that
// n * hi is exact), exp(r) by its Taylor series to r^7 / 7! (truncation below 3e-9 relative, a tenth of fp32's
// unit roundoff), 2^n built in the exponent bits.
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  // NaN stays NaN: max_ps and min_ps return their second operand when either is NaN.
  x = _mm256_min_ps(_mm256_set1_ps(kExpHigh), _mm256_max_ps(_mm256_set1_ps(kExpLow), x));
  constexpr double kLn2 = 0.693147180559945309417232121458;
  constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits: n * kLn2Hi is exact for |n| <= 2^15
  const float ln2_lo = static_cast<float>(kLn2 - 0.693359375);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(static_cast<float>(1.0 / kLn2))),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_lo), r);
  __m256 y = _mm256_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(below, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}
#endif

}  // namespace archspace::cpu_elements
