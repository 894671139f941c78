// The one dispatch rule of kernels/: for each op the model runs through kernels/, which implementation runs it,
// named from the operands (device, dtype, shape, whether autograd records them), the CPU's instruction set
// (cpu_isa.h: the engine's kernels then run their best path at or below kernel_isa()) and the run's choices
// (KernelChoices: train.fused_kernels and train.fp8, carried by each forward in model/forward_options.h, never by a
// process-wide flag). The model's ops (model/rms_norm.cpp, rope.cpp, mlp.cpp) and linear() ask here and run what
// they are told; tests/unit/test_kernel_dispatch.cpp lists the answer for each op on each kernel path.
// Attention has its own rule beside its kernels' callers (model/attention.h: attention_path), and decoding's
// attention kernel is chosen here (decode_attention_kernel).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace archspace {

// The run's choices that pick kernels.
struct KernelChoices {
  bool fused = false;  // train.fused_kernels: the fused training kernels (kernels/fused_training.h)
  bool fp8 = false;    // train.fp8: the block's matmuls in FP8 (kernels/fp8_linear.h)
};

enum class Kernel {
  kAtenComposite,      // ATen's ops: the reference arithmetic, and whatever no kernel below takes
  kFusedInference,     // kernels/fused_norm_rope.h: one pass on the CPU, no gradients
  kFusedTrainingCpu,   // kernels/fused_training.h, its CPU launch (autograd functions)
  kFusedTrainingCuda,  // ... its CUDA launch
  kStreamingGemv,      // kernels/linear.h: fp32 or bf16 weights, a few rows, no gradients, the CPU
  kInt8StreamingGemv,  // kernels/int8_weights.h: int8 weights, a few rows
  kInt8WidenedGemm,    // ... more rows: blocks of int8 rows widened to x's dtype for its GEMM
  kBf16Widened,        // kernels/bf16_matmuls.h: a bf16 GEMM run widened to fp32 on a CPU without fast bf16 GEMMs
  kAtenLinear,         // at::linear (MKL or oneDNN on the CPU; cuBLAS)
  kFp8ScaledMm,        // kernels/fp8_linear.h: e4m3 operands through _scaled_mm
  kDecodeAttention,    // kernels/decode_attention.h: one query per (row, head) over cached keys, the CPU
  kAtenSdpa,           // ATen's scaled_dot_product_attention (under kernels/bf16_matmuls.h's policy)
};

// "aten_composite", "fused_inference", ...: as the listing test and profiles name them.
const char* kernel_name(Kernel kernel);

// RMSNorm of x with `weight`; residual + that; the Q/K norm over x [B, T, H * head_dim] then its heads' rotation
// (cos, sin fp32); the rotation alone; silu(gate) * up.
Kernel rms_norm_kernel(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices);
Kernel add_rms_norm_kernel(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                           KernelChoices choices);
Kernel rms_norm_rope_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t head_dim, KernelChoices choices);
Kernel rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
Kernel swiglu_kernel(const at::Tensor& gate, const at::Tensor& up, KernelChoices choices);

// x W^T (W [out, in]): int8 weights take their kernels; train.fp8 takes _scaled_mm where it applies; a few rows
// without gradients on the CPU take the streaming GEMV; bf16 GEMMs widen where this CPU's are slow; else at::linear.
Kernel linear_kernel(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices);
// Several weights that read the same x (q/k/v; gate/up): the kernel that computes them in one call, when every
// weight takes the same one that can (the streaming GEMVs, FP8's one cast of x); else kAtenLinear's loop, each
// weight then by linear_kernel.
Kernel linear_many_kernel(const at::Tensor& x, const std::vector<at::Tensor>& weights, KernelChoices choices);

// Attention of one decoding query per (row, head) over its keys (model/attention.cpp's unmasked or padded decode).
Kernel decode_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& padding_mask = {});

}  // namespace archspace
