// The arithmetic of the FP8 cast (kernels/fp8_linear.h: cast_to_e4m3), shared by its CPU pass (fp8_linear.cpp) and
// its CUDA launch (fp8_cast_cuda.cu), so that the CPU tests, which hold the CPU pass to ATen's separate ops bit for
// bit, test the GPU's arithmetic too:
//   amax   the largest |t_i|, NaN if any entry is NaN (as at::amax)
//   scale  448 / max(amax, 1e-12) in fp32 (NaN stays NaN, as clamp_min keeps it)
//   q_i    e4m3(clamp(fp32(t_i) * scale, -448, 448)): the product rounded to fp32, the clamp keeping NaN, then
//          float8_e4m3fn's rounding (e4m3_bits below, c10::Float8_e4m3fn's: nearest even, NaN for what is too large)
// A maximum and one product per entry: no sum whose order could differ between the devices, so the two launches
// give the same bits. Private to src.
#pragma once

#include <cmath>
#include <cstdint>

#include "device_scalars.h"

namespace archspace::fp8_cast {

inline constexpr float kMax = 448.0f;               // the largest finite float8_e4m3fn (kernels/fp8_linear.h: kE4m3Max)
inline constexpr float kAmaxFloor = 1e-12f;         // kFp8AmaxFloor
inline constexpr uint32_t kTooLarge = 0x43f00000u;  // 480.0f: from here on (and for NaN) the encoding is NaN

// The running maximum of |v|, NaN once any v is NaN.
ARCHSPACE_HD float abs_max(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

ARCHSPACE_HD float scale_of(float amax) { return kMax / (amax < kAmaxFloor ? kAmaxFloor : amax); }

// float8_e4m3fn's bits of v: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities. Nearest even;
// magnitudes from 464 up round past 448, to the encoding 0x7f, which is NaN (as is anything non-finite).
ARCHSPACE_HD uint8_t e4m3_bits(float v) {
  const uint32_t bits = kernels::float_bits(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= kTooLarge) return sign | 0x7f;  // NaN, infinities and what rounds past 448
  if (magnitude < (121u << 23)) {
    // Below 2^-6, e4m3's subnormals: multiples of 2^-9, the multiple's count its bits (8 lands on 2^-6, the
    // smallest normal, whose bits are 0x08). |v| * 512 is exact; rintf rounds to nearest even.
    return sign | static_cast<uint8_t>(rintf(kernels::bits_float(magnitude) * 512.0f));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, rounding the 20 dropped to nearest even (a carry moves the exponent),
  // then rebias the exponent from 127 to 7.
  const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  return sign | static_cast<uint8_t>((((rounded >> 23) - 120u) << 3) | ((rounded >> 20) & 7u));
}

// q_i's bits from t_i and the scale.
ARCHSPACE_HD uint8_t scaled_e4m3_bits(float v, float scale) {
  float p = v * scale;
  p = p < -kMax ? -kMax : (p > kMax ? kMax : p);  // NaN fails both comparisons and stays
  return e4m3_bits(p);
}

}  // namespace archspace::fp8_cast
