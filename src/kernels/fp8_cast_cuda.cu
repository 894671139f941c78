// The CUDA launch of the fused FP8 cast (fp8_cast_launch.h): a grid-stride pass that takes each thread's, then each
// block's, largest |x| and folds it into one word with atomicMax (a non-negative float's bits order as the float
// does, NaN's above infinity's: the result is the amax, NaN included, whatever the order), then a grid-stride pass
// that reads the amax where the first left it, computes the scale and writes each entry's e4m3 bits. All values come
// from fp8_cast_math.h, which the CPU tests hold to ATen's separate ops; a maximum and a product per entry leave no
// order of sums to differ. Compiled with -fmad=false as the fused training kernels are (no product is contracted
// here anyway). scripts/device_check.py compares it with ATen's ops on the GPU (tests/device/check_kernels.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "fp8_cast_launch.h"
#include "fp8_cast_math.h"

namespace archspace::fp8_cast::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs) several times over

using kernels::Bf16;
using kernels::load;

__device__ float block_abs_max(float m) {
  __shared__ float warp_max[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(0xffffffffu, m, offset);
    m = (other > m || other != other) ? other : m;  // other is already an |x|: abs_max without the fabsf
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total = abs_max(total, warp_max[w]);
  return total;
}

template <class S>
__global__ void amax_kernel(Launch a) {
  const S* x = static_cast<const S*>(a.x);
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.n; i += int64_t{gridDim.x} * blockDim.x)
    m = abs_max(m, load(x, i));
  m = block_abs_max(m);
  if (threadIdx.x == 0) atomicMax(a.amax_bits, kernels::float_bits(m));
}

template <class S>
__global__ void cast_kernel(Launch a) {
  const S* x = static_cast<const S*>(a.x);
  const float scale = scale_of(kernels::bits_float(*a.amax_bits));
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.inverse_scale = 1.0f / scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.n; i += int64_t{gridDim.x} * blockDim.x)
    a.values[i] = scaled_e4m3_bits(load(x, i), scale);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("fp8 cast kernel ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

void cast(const Launch& a, void* stream) {
  if (a.n <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((a.n + kThreads - 1) / kThreads, kMaxBlocks)));
  const dim3 block(kThreads);
  if (a.storage == kernels::Storage::kBf16) {
    amax_kernel<Bf16><<<grid, block, 0, s>>>(a);
    cast_kernel<Bf16><<<grid, block, 0, s>>>(a);
  } else {
    amax_kernel<float><<<grid, block, 0, s>>>(a);
    cast_kernel<float><<<grid, block, 0, s>>>(a);
  }
  check(cudaGetLastError(), "cast");
}

}  // namespace archspace::fp8_cast::cuda
