#include "archspace/kernels/dispatch.h"

#include <algorithm>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/decode_attention.h"
#include "archspace/kernels/fp8_linear.h"
#include "archspace/kernels/fused_norm_rope.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"

namespace archspace {

namespace {

Kernel fused_training_on(const at::Tensor& x) {
  return x.is_cuda() ? Kernel::kFusedTrainingCuda : Kernel::kFusedTrainingCpu;
}

}  // namespace

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kAtenComposite:
      return "aten_composite";
    case Kernel::kFusedInference:
      return "fused_inference";
    case Kernel::kFusedTrainingCpu:
      return "fused_training_cpu";
    case Kernel::kFusedTrainingCuda:
      return "fused_training_cuda";
    case Kernel::kStreamingGemv:
      return "streaming_gemv";
    case Kernel::kInt8StreamingGemv:
      return "int8_streaming_gemv";
    case Kernel::kInt8WidenedGemm:
      return "int8_widened_gemm";
    case Kernel::kBf16Widened:
      return "bf16_widened";
    case Kernel::kAtenLinear:
      return "aten_linear";
    case Kernel::kFp8ScaledMm:
      return "fp8_scaled_mm";
    case Kernel::kDecodeAttention:
      return "decode_attention";
    case Kernel::kAtenSdpa:
      return "aten_sdpa";
  }
  return "?";
}

// Inference without gradients on the CPU takes the one-pass kernels first; with train.fused_kernels the fused
// training kernels take what they apply to; the rest is ATen's composite.
Kernel rms_norm_kernel(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices) {
  if (uses_fused_rms_norm(x, weight)) return Kernel::kFusedInference;
  if (choices.fused && fused_training_norm_applies(x, weight)) return fused_training_on(x);
  return Kernel::kAtenComposite;
}

Kernel add_rms_norm_kernel(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                           KernelChoices choices) {
  if (uses_fused_add_rms_norm(residual, x, weight)) return Kernel::kFusedInference;
  if (choices.fused && fused_training_add_norm_applies(residual, x, weight)) return fused_training_on(x);
  return Kernel::kAtenComposite;
}

Kernel rms_norm_rope_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t head_dim, KernelChoices choices) {
  if (uses_fused_rms_norm_rope(x, weight, cos, sin, head_dim)) return Kernel::kFusedInference;
  if (choices.fused && fused_training_norm_rope_applies(x, weight, cos, sin, head_dim)) return fused_training_on(x);
  return Kernel::kAtenComposite;
}

Kernel rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return uses_fused_rope(x, cos, sin) ? Kernel::kFusedInference : Kernel::kAtenComposite;
}

Kernel swiglu_kernel(const at::Tensor& gate, const at::Tensor& up, KernelChoices choices) {
  if (choices.fused && fused_training_swiglu_applies(gate, up)) return fused_training_on(gate);
  return Kernel::kAtenComposite;
}

Kernel linear_kernel(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices) {
  if (is_int8_weight(weight))
    return uses_int8_streaming_linear(x, weight) ? Kernel::kInt8StreamingGemv : Kernel::kInt8WidenedGemm;
  if (choices.fp8 && fp8_linear_applies(x, weight)) return Kernel::kFp8ScaledMm;
  if (uses_streaming_linear(x, weight)) return Kernel::kStreamingGemv;
  return bf16_linear_widened(x, weight) ? Kernel::kBf16Widened : Kernel::kAtenLinear;
}

Kernel linear_many_kernel(const at::Tensor& x, const std::vector<at::Tensor>& weights, KernelChoices choices) {
  if (weights.size() < 2) return Kernel::kAtenLinear;
  // FP8 casts x once for all the weights, whichever of them its _scaled_mm takes.
  if (choices.fp8 && std::none_of(weights.begin(), weights.end(), is_int8_weight)) return Kernel::kFp8ScaledMm;
  // Decoding asks this for every layer's q/k/v and gate/up: each weight's rule once, and only while they agree.
  const Kernel first = linear_kernel(x, weights.front(), choices);
  if (first != Kernel::kStreamingGemv && first != Kernel::kInt8StreamingGemv) return Kernel::kAtenLinear;
  const bool same = std::all_of(weights.begin() + 1, weights.end(),
                                [&](const at::Tensor& w) { return linear_kernel(x, w, choices) == first; });
  return same ? first : Kernel::kAtenLinear;
}

Kernel decode_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& padding_mask) {
  return uses_decode_attention(q, k, v, padding_mask) ? Kernel::kDecodeAttention : Kernel::kAtenSdpa;
}

}  // namespace archspace
