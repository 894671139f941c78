// One launch of the fused FP8 cast (kernels/fp8_linear.h: cast_to_e4m3) on CUDA, described by raw pointers: the
// amax of x, then each entry scaled, clamped and cast (fp8_cast_math.h), two kernels reading and writing x's memory
// once each, and the scale never leaving the device. fp8_linear.cpp builds it from tensors; fp8_cast_cuda.cu
// launches it. No ATen here (nvcc compiles the launch without LibTorch's headers). Private to src.
#pragma once

#include <cstdint>

#include "device_scalars.h"

namespace archspace::fp8_cast {

struct Launch {
  kernels::Storage storage = kernels::Storage::kFloat;
  const void* x = nullptr;  // n contiguous entries
  int64_t n = 0;
  uint8_t* values = nullptr;       // n float8_e4m3fn entries
  uint32_t* amax_bits = nullptr;   // one zeroed word of scratch: the amax's fp32 bits (non-negative: ordered)
  float* inverse_scale = nullptr;  // one fp32: 1 / scale
};

// Built only with CUDA (ARCHSPACE_WITH_CUDA_KERNELS); `stream` is the cudaStream_t to launch on.
namespace cuda {
void cast(const Launch& launch, void* stream);
}

}  // namespace archspace::fp8_cast
