// Scalars as the kernels that run on both devices see them (the fused training kernels, the FP8 cast): the
// ARCHSPACE_HD marker that makes a function __host__ __device__ under nvcc, a float's bits, and the storage types
// those kernels read and write, float and Bf16 (bf16's bits: the layout of at::BFloat16 and __nv_bfloat16). No
// ATen here, so nvcc compiles it without LibTorch's headers. Private to src.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ARCHSPACE_HD __host__ __device__ __forceinline__
#else
#define ARCHSPACE_HD inline
#endif

namespace archspace::kernels {

enum class Storage { kFloat, kBf16 };  // how a launch's tensors hold their values

struct Bf16 {
  uint16_t bits;
};

ARCHSPACE_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

ARCHSPACE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// To bf16, rounded to nearest even, NaN to the canonical 0x7fc0: as c10::BFloat16(float) on both devices.
ARCHSPACE_HD Bf16 to_bf16(float v) {
  if (v != v) return Bf16{0x7fc0};
  const uint32_t u = float_bits(v);
  return Bf16{static_cast<uint16_t>((u + (((u >> 16) & 1u) + 0x7fffu)) >> 16)};
}

ARCHSPACE_HD float load(const float* p, int64_t i) { return p[i]; }
ARCHSPACE_HD float load(const Bf16* p, int64_t i) { return bits_float(static_cast<uint32_t>(p[i].bits) << 16); }
ARCHSPACE_HD void store(float* p, int64_t i, float v) { p[i] = v; }
ARCHSPACE_HD void store(Bf16* p, int64_t i, float v) { p[i] = to_bf16(v); }

}  // namespace archspace::kernels
