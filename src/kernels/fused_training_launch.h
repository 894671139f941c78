// One launch of a fused training kernel, described by raw pointers and sizes: kernels/fused_training.cpp builds
// these from tensors and hands them to the CPU launch (fused_training_cpu.cpp) or the CUDA one
// (fused_training_cuda.cu), which both compute through fused_training_math.h. Private to src; no ATen here, so
// nvcc compiles the CUDA side without LibTorch's headers.
#pragma once

#include <cstdint>

#include "device_scalars.h"

namespace archspace::fused_training {

using kernels::Storage;

// The rotation after a Q/K norm (rms_norm_rope): cos and sin fp32 [T, head_dim] or [B, 1, T, head_dim].
struct RopeTables {
  const float* cos = nullptr;  // null: no rotation
  const float* sin = nullptr;
  int64_t head_dim = 0;
  int64_t positions = 0;     // T: row r of the activation is position r % T of sequence r / T
  int64_t batch_stride = 0;  // 0 for [T, head_dim] tables, T * head_dim for [B, 1, T, head_dim]
};

// y = norm(x) (and its rotation), or out = residual + norm(x), per row of `width`; rstd [rows] kept for backward.
struct NormForward {
  Storage x_storage = Storage::kFloat;
  const void* x = nullptr;
  const float* weight = nullptr;  // [width], fp32
  int64_t rows = 0, width = 0;
  float eps = 0;
  const void* residual = nullptr;  // add_rms_norm: [rows, width] of out_storage
  Storage out_storage = Storage::kFloat;
  RopeTables rope;
  void* out = nullptr;  // [rows, width] of out_storage (x_storage without a residual)
  float* rstd = nullptr;
};

// dx (x_storage) and the weight gradient's partial sums: dw_partial [blocks, width] fp32, zeroed, block b
// summing rows [b * rows_per_block, (b + 1) * rows_per_block); the caller sums its rows.
struct NormBackward {
  Storage x_storage = Storage::kFloat;
  const void* dy = nullptr;  // the gradient at the norm's (or rotation's) output, x_storage, [rows, width]
  const void* x = nullptr;
  const float* weight = nullptr;
  const float* rstd = nullptr;
  int64_t rows = 0, width = 0;
  RopeTables rope;
  void* dx = nullptr;
  float* dw_partial = nullptr;
  int64_t rows_per_block = 0;
};

// hidden = silu(gate) * up over [rows, width]; gate and up may be strided rows (views of one gate/up matmul),
// the outputs contiguous. Backward: d_gate and d_up from d_hidden (contiguous).
struct Swiglu {
  Storage storage = Storage::kFloat;
  const void* gate = nullptr;
  const void* up = nullptr;
  int64_t rows = 0, width = 0, gate_row_stride = 0, up_row_stride = 0;
  void* hidden = nullptr;          // forward
  const void* d_hidden = nullptr;  // backward
  void* d_gate = nullptr;
  void* d_up = nullptr;
};

namespace cpu {
void norm_forward(const NormForward& launch);
void norm_backward(const NormBackward& launch);
void swiglu_forward(const Swiglu& launch);
void swiglu_backward(const Swiglu& launch);
}  // namespace cpu

// Built only with CUDA (ARCHSPACE_WITH_CUDA_KERNELS); `stream` is the cudaStream_t to launch on.
namespace cuda {
void norm_forward(const NormForward& launch, void* stream);
void norm_backward(const NormBackward& launch, void* stream);
void swiglu_forward(const Swiglu& launch, void* stream);
void swiglu_backward(const Swiglu& launch, void* stream);
}  // namespace cuda

}  // namespace archspace::fused_training
