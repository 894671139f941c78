// The CUDA launch of the fused training kernels: one thread block per row (norms) or per group of rows (the norm's
// backward, which also sums the weight's gradient over its rows), each thread taking the elements threadIdx.x,
// threadIdx.x + blockDim.x, ... through the arithmetic the CPU tests hold (fused_training_math.h). Only the sums'
// order is the GPU's own: each thread's partial sum, then a tree over the block. Compiled with -fmad=false (no
// contraction into FMAs), as the math header states. scripts/device_check.py compares these with ATen's
// composite on the GPU (tests/device/check_kernels.cpp).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "fused_training_launch.h"
#include "fused_training_math.h"

namespace archspace::fused_training::cuda {

namespace {

constexpr int kThreads = 256;

// The block's sum of each thread's v (all threads get it).
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // warp_sums may still be read by an earlier call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

template <class S, class R>
__global__ void norm_forward_kernel(NormForward a) {
  const int64_t r = blockIdx.x;
  const S* x = static_cast<const S*>(a.x) + r * a.width;
  const float rstd = rms_inverse(block_sum(sum_squares(x, threadIdx.x, a.width, blockDim.x)), a.width, a.eps);
  if (threadIdx.x == 0) a.rstd[r] = rstd;
  if (a.residual) {
    add_rms_norm_store(static_cast<const R*>(a.residual) + r * a.width, x, a.weight, rstd,
                       static_cast<R*>(a.out) + r * a.width, threadIdx.x, a.width, blockDim.x);
  } else if (a.rope.cos) {
    const RopeTables& t = a.rope;
    rms_norm_rope_store(x, a.weight, rstd, rope_row(t.cos, r, t.positions, t.batch_stride, t.head_dim),
                        rope_row(t.sin, r, t.positions, t.batch_stride, t.head_dim), t.head_dim,
                        static_cast<S*>(a.out) + r * a.width, threadIdx.x, a.width, blockDim.x);
  } else {
    rms_norm_store(x, a.weight, rstd, static_cast<S*>(a.out) + r * a.width, threadIdx.x, a.width, blockDim.x);
  }
}

// The weight's gradient over the block's rows is summed in shared memory when a row of fp32 fits (widths to
// 8,192: 32 KiB of the 48 KiB a block may have), else in the block's row of dw_partial in global memory; each thread owns the
// same elements throughout (zeroing, summing, writing out), so neither needs a barrier of its own.
template <class S>
__global__ void norm_backward_kernel(NormBackward a, bool shared_sums) {
  extern __shared__ float shared_dw[];
  float* out = a.dw_partial + blockIdx.x * a.width;
  float* dw = shared_sums ? shared_dw : out;
  if (shared_sums)
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) dw[i] = 0.0f;
  const int64_t first = blockIdx.x * a.rows_per_block;
  const int64_t end = min(a.rows, first + a.rows_per_block);
  for (int64_t r = first; r < end; ++r) {
    const NormOutputGradient<S> g = norm_output_gradient<S>(a, r);
    const S* x = static_cast<const S*>(a.x) + r * a.width;
    const float dot = block_sum(norm_backward_dot(g, x, a.weight, threadIdx.x, a.width, blockDim.x));
    // Each thread owns the same elements of dw in every row: no other thread writes them.
    norm_backward_store(g, x, a.weight, a.rstd[r], dot, a.width, static_cast<S*>(a.dx) + r * a.width, dw,
                        threadIdx.x, a.width, blockDim.x);
  }
  if (shared_sums)
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) out[i] = dw[i];
}

template <class S>
__global__ void swiglu_kernel(Swiglu a, bool backward) {
  const int64_t r = blockIdx.x;
  const S* g = static_cast<const S*>(a.gate) + r * a.gate_row_stride;
  const S* u = static_cast<const S*>(a.up) + r * a.up_row_stride;
  const int64_t o = r * a.width;
  if (backward) {
    swiglu_backward_store(static_cast<const S*>(a.d_hidden) + o, g, u, static_cast<S*>(a.d_gate) + o,
                          static_cast<S*>(a.d_up) + o, threadIdx.x, a.width, blockDim.x);
  } else {
    swiglu_store(g, u, static_cast<S*>(a.hidden) + o, threadIdx.x, a.width, blockDim.x);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("fused training kernel ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

void norm_forward(const NormForward& a, void* stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(a.rows)), block(kThreads);
  if (a.x_storage == Storage::kFloat) {
    norm_forward_kernel<float, float><<<grid, block, 0, as_stream(stream)>>>(a);
  } else if (a.out_storage == Storage::kBf16) {
    norm_forward_kernel<Bf16, Bf16><<<grid, block, 0, as_stream(stream)>>>(a);
  } else {
    norm_forward_kernel<Bf16, float><<<grid, block, 0, as_stream(stream)>>>(a);
  }
  check(cudaGetLastError(), "norm_forward");
}

void norm_backward(const NormBackward& a, void* stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>((a.rows + a.rows_per_block - 1) / a.rows_per_block)), block(kThreads);
  const size_t row_bytes = static_cast<size_t>(a.width) * sizeof(float);
  const bool shared_sums = row_bytes <= 32 * 1024;
  const size_t shared = shared_sums ? row_bytes : 0;
  if (a.x_storage == Storage::kBf16) {
    norm_backward_kernel<Bf16><<<grid, block, shared, as_stream(stream)>>>(a, shared_sums);
  } else {
    norm_backward_kernel<float><<<grid, block, shared, as_stream(stream)>>>(a, shared_sums);
  }
  check(cudaGetLastError(), "norm_backward");
}

void swiglu_forward(const Swiglu& a, void* stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(a.rows)), block(kThreads);
  if (a.storage == Storage::kBf16) {
    swiglu_kernel<Bf16><<<grid, block, 0, as_stream(stream)>>>(a, false);
  } else {
    swiglu_kernel<float><<<grid, block, 0, as_stream(stream)>>>(a, false);
  }
  check(cudaGetLastError(), "swiglu_forward");
}

void swiglu_backward(const Swiglu& a, void* stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(a.rows)), block(kThreads);
  if (a.storage == Storage::kBf16) {
    swiglu_kernel<Bf16><<<grid, block, 0, as_stream(stream)>>>(a, true);
  } else {
    swiglu_kernel<float><<<grid, block, 0, as_stream(stream)>>>(a, true);
  }
  check(cudaGetLastError(), "swiglu_backward");
}

}  // namespace archspace::fused_training::cuda
