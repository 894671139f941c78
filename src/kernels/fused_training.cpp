#include "archspace/kernels/fused_training.h"

#include <ATen/TensorUtils.h>
#include <torch/autograd.h>

#include "fused_training_launch.h"

#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace archspace {

namespace {

bool device_supported(const at::Tensor& t) { return t.is_cpu() || (t.is_cuda() && fused_training_cuda_built()); }
bool storage_supported(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; }

}  // namespace

bool fused_training_cuda_built() {
#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
  return true;
#else
  return false;
#endif
}

bool fused_training_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return x.defined() && weight.defined() && x.dim() >= 1 && x.numel() > 0 && device_supported(x) &&
         storage_supported(x.scalar_type()) && weight.dim() == 1 && x.size(-1) == weight.size(0) &&
         weight.device() == x.device() && storage_supported(weight.scalar_type());
}

bool fused_training_add_norm_applies(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight) {
  return fused_training_norm_applies(x, weight) && residual.defined() && residual.sizes() == x.sizes() &&
         residual.device() == x.device() &&
         at::promote_types(residual.scalar_type(), x.scalar_type()) == residual.scalar_type();
}

bool fused_training_norm_rope_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                      const at::Tensor& sin, int64_t head_dim) {
  if (!fused_training_norm_applies(x, weight) || x.dim() != 3 || head_dim <= 0 || head_dim % 2 != 0 ||
      x.size(2) % head_dim != 0)
    return false;
  auto table_fits = [&](const at::Tensor& t) {
    if (!t.defined() || t.scalar_type() != at::kFloat || t.device() != x.device() || !t.is_contiguous()) return false;
    if (t.dim() == 2) return t.size(0) == x.size(1) && t.size(1) == head_dim;
    return t.dim() == 4 && (t.size(0) == 1 || t.size(0) == x.size(0)) && t.size(1) == 1 && t.size(2) == x.size(1) &&
           t.size(3) == head_dim;
  };
  return table_fits(cos) && table_fits(sin) && cos.sizes() == sin.sizes();
}

bool fused_training_swiglu_applies(const at::Tensor& gate, const at::Tensor& up) {
  return gate.defined() && up.defined() && gate.dim() >= 1 && gate.numel() > 0 && gate.sizes() == up.sizes() &&
         gate.scalar_type() == up.scalar_type() && storage_supported(gate.scalar_type()) && device_supported(gate) &&
         up.device() == gate.device();
}

namespace fused_training {

#if !defined(ARCHSPACE_WITH_CUDA_KERNELS)
// A build without nvcc has no CUDA launch: these stand in for fused_training_cuda.cu so that the CPU path links;
// run() below refuses CUDA tensors before reaching them.
namespace cuda {
[[noreturn]] void not_built() { TORCH_CHECK(false, "fused training kernels: this build has no CUDA launch"); }
void norm_forward(const NormForward&, void*) { not_built(); }
void norm_backward(const NormBackward&, void*) { not_built(); }
void swiglu_forward(const Swiglu&, void*) { not_built(); }
void swiglu_backward(const Swiglu&, void*) { not_built(); }
}  // namespace cuda
#endif

namespace {

Storage storage_of(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? Storage::kBf16 : Storage::kFloat; }

RopeTables rope_tables(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim) {
  RopeTables t;
  if (!cos.defined()) return t;
  TORCH_CHECK(x.dim() == 3 && x.size(2) % head_dim == 0 && head_dim % 2 == 0,
              "fused rms_norm_rope: x [B, T, H * head_dim], got ", x.sizes(), " with head_dim ", head_dim);
  TORCH_CHECK(
      cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
          sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.size(-1) == head_dim && cos.size(-2) == x.size(1),
      "fused rms_norm_rope: cos and sin fp32 contiguous [T, head_dim] or [B, 1, T, head_dim], got ", cos.sizes());
  t.cos = cos.data_ptr<float>();
  t.sin = sin.data_ptr<float>();
  t.head_dim = head_dim;
  t.positions = x.size(1);
  t.batch_stride = cos.dim() == 4 && cos.size(0) > 1 ? x.size(1) * head_dim : 0;
  return t;
}

// A [rows, width] view of t with a contiguous last dim (rows a fixed stride apart: the gate and up halves of one
// matmul's output are), or of a contiguous copy where t's rows are not evenly spaced.
at::Tensor as_rows(const at::Tensor& t) {
  const int64_t width = t.size(-1);
  if (t.stride(-1) == 1) {
    const std::vector<int64_t> rows = {t.numel() / width, width};
    if (auto strides = at::detail::computeStride(t.sizes(), t.strides(), rows)) return t.as_strided(rows, *strides);
  }
  return t.contiguous().view({-1, width});
}

// gate's and up's rows as a Swiglu launch (the outputs are set by the caller).
Swiglu swiglu_rows(const at::Tensor& gate, const at::Tensor& g, const at::Tensor& u) {
  Swiglu a;
  a.storage = storage_of(gate);
  a.gate = g.data_ptr();
  a.up = u.data_ptr();
  a.rows = g.size(0);
  a.width = g.size(1);
  a.gate_row_stride = g.stride(0);
  a.up_row_stride = u.stride(0);
  return a;
}

#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
void* cuda_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#endif

template <class Launch>
void run(const at::Tensor& on, const Launch& launch, void (*cpu_launch)(const Launch&),
         void (*cuda_launch)(const Launch&, void*)) {
  if (on.is_cpu()) return cpu_launch(launch);
#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
  TORCH_CHECK(on.is_cuda(), "fused training kernels: tensors on ", on.device(), ", not the CPU or CUDA");
  const c10::cuda::CUDAGuard guard(on.device());
  cuda_launch(launch, cuda_stream(on));
#else
  (void)cuda_launch;
  TORCH_CHECK(false,
              "fused training kernels: this build has no CUDA launch (nvcc or CUDA LibTorch were not found "
              "at configure time); tensors on ",
              on.device());
#endif
}

}  // namespace

NormResult norm_forward(const at::Tensor& x_in, const at::Tensor& weight, double eps, const at::Tensor& residual,
                        const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim) {
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 1 && x.size(-1) == w.size(0), "fused rms_norm: x ", x.sizes(),
              " against a weight ", weight.sizes());
  NormForward a;
  a.x_storage = storage_of(x);
  a.x = x.data_ptr();
  a.weight = w.data_ptr<float>();
  a.width = x.size(-1);
  a.rows = x.numel() / a.width;
  a.eps = static_cast<float>(eps);
  a.rope = rope_tables(x, cos, sin, head_dim);
  at::Tensor r;
  at::ScalarType out_dtype = x.scalar_type();
  if (residual.defined()) {
    out_dtype = at::promote_types(residual.scalar_type(), x.scalar_type());
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == out_dtype,
                "fused add_rms_norm: the residual ", residual.sizes(), " ", residual.scalar_type(), " against x ",
                x.sizes(), " ", x.scalar_type());
    r = residual.contiguous();
    a.residual = r.data_ptr();
  }
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype));
  at::Tensor rstd = at::empty({a.rows}, x.options().dtype(at::kFloat));
  a.out_storage = storage_of(out);
  a.out = out.data_ptr();
  a.rstd = rstd.data_ptr<float>();
  run(x, a, &cpu::norm_forward, &cuda::norm_forward);
  return {out, rstd};
}

std::pair<at::Tensor, at::Tensor> norm_backward(const at::Tensor& dy_in, const at::Tensor& x_in,
                                                const at::Tensor& weight, const at::Tensor& rstd, const at::Tensor& cos,
                                                const at::Tensor& sin, int64_t head_dim) {
  const at::Tensor x = x_in.contiguous();
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  TORCH_CHECK(dy.sizes() == x.sizes() && rstd.scalar_type() == at::kFloat && rstd.is_contiguous() &&
                  rstd.numel() * w.numel() == x.numel(),
              "fused rms_norm backward: dy ", dy.sizes(), ", x ", x.sizes(), ", rstd ", rstd.sizes());
  NormBackward a;
  a.x_storage = storage_of(x);
  a.dy = dy.data_ptr();
  a.x = x.data_ptr();
  a.weight = w.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.width = x.size(-1);
  a.rows = x.numel() / a.width;
  a.rope = rope_tables(x, cos, sin, head_dim);
  // The CPU's threads and the GPU's blocks each sum the weight's gradient over their rows: about 1,000 blocks for
  // a GPU (16 rows each at 16,384 rows), and few enough partial rows on the CPU that their sum is cheap.
  a.rows_per_block = x.is_cpu() ? 64 : 16;
  const int64_t blocks = (a.rows + a.rows_per_block - 1) / a.rows_per_block;
  at::Tensor dx = at::empty_like(x);
  at::Tensor partial = at::zeros({blocks, a.width}, x.options().dtype(at::kFloat));
  a.dx = dx.data_ptr();
  a.dw_partial = partial.data_ptr<float>();
  run(x, a, &cpu::norm_backward, &cuda::norm_backward);
  return {dx, partial.sum(0)};
}

at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() && gate.dim() >= 1,
              "fused swiglu: gate ", gate.sizes(), " ", gate.scalar_type(), " against up ", up.sizes(), " ",
              up.scalar_type());
  const at::Tensor g = as_rows(gate), u = as_rows(up);
  at::Tensor hidden = at::empty(gate.sizes(), gate.options().memory_format(at::MemoryFormat::Contiguous));
  Swiglu a = swiglu_rows(gate, g, u);
  a.hidden = hidden.data_ptr();
  run(gate, a, &cpu::swiglu_forward, &cuda::swiglu_forward);
  return hidden;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& d_hidden, const at::Tensor& gate,
                                                  const at::Tensor& up) {
  const at::Tensor g = as_rows(gate), u = as_rows(up);
  const at::Tensor dh = d_hidden.to(gate.scalar_type()).contiguous();
  TORCH_CHECK(dh.sizes() == gate.sizes(), "fused swiglu backward: d_hidden ", dh.sizes(), " against ", gate.sizes());
  const auto contiguous = gate.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor d_gate = at::empty(gate.sizes(), contiguous), d_up = at::empty(gate.sizes(), contiguous);
  Swiglu a = swiglu_rows(gate, g, u);
  a.d_hidden = dh.data_ptr();
  a.d_gate = d_gate.data_ptr();
  a.d_up = d_up.data_ptr();
  run(gate, a, &cpu::swiglu_backward, &cuda::swiglu_backward);
  return {d_gate, d_up};
}

}  // namespace fused_training

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The norm's weight gradient in the weight's dtype (fp32 master weights: as computed).
at::Tensor weight_gradient(const at::Tensor& dw, const at::Tensor& weight) { return dw.to(weight.scalar_type()); }

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    fused_training::NormResult r = fused_training::norm_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, r.rstd});
    return r.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = fused_training::norm_backward(grads[0], saved[0], saved[1], saved[2]);
    return {dx.view(saved[0].sizes()), weight_gradient(dw, saved[1]), at::Tensor()};
  }
};

// residual + norm(x): the residual's gradient is the output's; the norm's is the output's rounded to x's dtype
// (autograd casts a promoted add's gradient back to each input's dtype).
struct AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& residual, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    fused_training::NormResult r = fused_training::norm_forward(x, weight, eps, residual);
    ctx->save_for_backward({x, weight, r.rstd});
    ctx->saved_data["residual_dtype"] = residual.scalar_type();
    return r.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor d_residual;
    if (ctx->needs_input_grad(0)) d_residual = grads[0].to(ctx->saved_data["residual_dtype"].toScalarType());
    auto [dx, dw] = fused_training::norm_backward(grads[0], saved[0], saved[1], saved[2]);
    return {d_residual, dx.view(saved[0].sizes()), weight_gradient(dw, saved[1]), at::Tensor()};
  }
};

struct RmsNormRopeFunction : public torch::autograd::Function<RmsNormRopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim) {
    fused_training::NormResult r = fused_training::norm_forward(x, weight, eps, {}, cos, sin, head_dim);
    ctx->save_for_backward({x, weight, r.rstd, cos, sin});
    ctx->saved_data["head_dim"] = head_dim;
    return r.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = fused_training::norm_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                                                  ctx->saved_data["head_dim"].toInt());
    return {dx.view(saved[0].sizes()),
            weight_gradient(dw, saved[1]),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return fused_training::swiglu_forward(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [d_gate, d_up] = fused_training::swiglu_backward(grads[0], saved[0], saved[1]);
    return {d_gate, d_up};
  }
};

}  // namespace

at::Tensor fused_rms_norm_trained(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor fused_add_rms_norm_trained(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                      double eps) {
  return AddRmsNormFunction::apply(residual, x, weight, eps);
}

at::Tensor fused_rms_norm_rope_trained(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                                       const at::Tensor& sin, int64_t head_dim) {
  const at::Tensor out = RmsNormRopeFunction::apply(x, weight, eps, cos, sin, head_dim);
  return out.view({x.size(0), x.size(1), -1, head_dim}).transpose(1, 2);
}

at::Tensor fused_swiglu_trained(const at::Tensor& gate, const at::Tensor& up) {
  return SwigluFunction::apply(gate, up);
}

}  // namespace archspace
