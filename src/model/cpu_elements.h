// Element access shared by the engine's CPU kernels over fp32 or bf16 rows (fused_norm_rope, decode_attention):
// one value as fp32, one fp32 value stored back (bf16: rounded to nearest even), and 8 values widened to fp32 in
// an AVX2 register (a bf16 value is the high half of an fp32). Private to src/model.
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

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif

}  // namespace archspace::cpu_elements
