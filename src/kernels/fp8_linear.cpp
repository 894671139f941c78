#include "archspace/kernels/fp8_linear.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <optional>
#include <vector>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/linear.h"
#include "fp8_cast_launch.h"
#include "fp8_cast_math.h"

#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace archspace {

namespace {

static_assert(fp8_cast::kMax == kE4m3Max && fp8_cast::kAmaxFloor == kFp8AmaxFloor);

constexpr int64_t kGrain = 1 << 15;  // entries a task: a cast is one pass over memory

// The largest |t| of a contiguous CPU tensor in fp32 (NaN if any entry is NaN, as at::amax).
template <typename T>
float cpu_amax(const T* p, int64_t n) {
  return at::parallel_reduce(
      0, n, kGrain, 0.0f,
      [p](int64_t begin, int64_t end, float m) {
        for (int64_t i = begin; i < end; ++i) m = fp8_cast::abs_max(m, static_cast<float>(p[i]));
        return m;
      },
      [](float a, float b) { return fp8_cast::abs_max(a, b); });
}

// The scale, clamp and cast of each entry in one pass (fp8_cast_math.h: the CUDA launch's arithmetic too).
template <typename T>
void cpu_scale_cast(const T* p, uint8_t* q, int64_t n, float scale) {
  at::parallel_for(0, n, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) q[i] = fp8_cast::scaled_e4m3_bits(static_cast<float>(p[i]), scale);
  });
}

E4m3Cast cpu_cast(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  at::Tensor values = at::empty(c.sizes(), c.options().dtype(at::kFloat8_e4m3fn));
  float scale = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, c.scalar_type(), "cast_to_e4m3", [&] {
    const auto* p = c.const_data_ptr<scalar_t>();
    scale = fp8_cast::scale_of(cpu_amax(p, c.numel()));
    cpu_scale_cast(p, static_cast<uint8_t*>(values.mutable_data_ptr()), c.numel(), scale);
  });
  return {values, at::scalar_tensor(1.0f / scale, c.options().dtype(at::kFloat))};
}

// The fused CUDA launch (fp8_cast_cuda.cu), for fp32 and bf16 tensors: two kernels, no fp32 temporaries.
bool cuda_cast_applies(const at::Tensor& t) {
  return t.is_cuda() && fp8_cast_cuda_built() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
E4m3Cast cuda_cast(const at::Tensor& t) {
  const c10::cuda::CUDAGuard guard(t.device());
  const at::Tensor c = t.contiguous();
  at::Tensor values = at::empty(c.sizes(), c.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor amax_bits = at::zeros({1}, c.options().dtype(at::kInt));
  at::Tensor inverse_scale = at::empty({}, c.options().dtype(at::kFloat));
  fp8_cast::Launch a;
  a.storage = c.scalar_type() == at::kBFloat16 ? kernels::Storage::kBf16 : kernels::Storage::kFloat;
  a.x = c.const_data_ptr();
  a.n = c.numel();
  a.values = static_cast<uint8_t*>(values.mutable_data_ptr());
  a.amax_bits = static_cast<uint32_t*>(amax_bits.mutable_data_ptr());
  a.inverse_scale = inverse_scale.mutable_data_ptr<float>();
  fp8_cast::cuda::cast(a, c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
  return {values, inverse_scale};
}
#else
[[noreturn]] E4m3Cast cuda_cast(const at::Tensor&) {
  TORCH_CHECK(false, "cast_to_e4m3: this build has no CUDA launch");
}
#endif

// at::_scaled_mm on the CPU is a oneDNN fp8 matmul, which needs AVX512 for some shapes and output types (with
// ONEDNN_MAX_CPU_ISA=AVX2 it cannot create the primitive for some and runs others). So it is used only where bf16
// matmuls are native (kernels/bf16_matmuls.h's rule, chosen once per process) and until it first refuses; otherwise
// the CPU takes the same arithmetic in ATen's ops: the e4m3 values widened to fp32 (exactly), their fp32 GEMM (exact
// products, fp32 sums), the two inverse scales, one rounding to out_dtype.
std::atomic<bool> cpu_scaled_mm_refused{false};

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& inverse_a, const at::Tensor& inverse_b,
                     at::ScalarType out_dtype) {
  // The dtypes here are the FP8 linear's own: under training's autocast the fallback's fp32 GEMM would run in bf16,
  // and the CPU's _scaled_mm rounds its output differently (test_fp8_linear.cpp AutocastChangesNothing).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (!a.device().is_cpu()) return at::_scaled_mm(a, b, inverse_a, inverse_b, std::nullopt, std::nullopt, out_dtype);
  if (!bf16_matmuls_widened() && !cpu_scaled_mm_refused.load()) {
    try {
      return at::_scaled_mm(a, b, inverse_a, inverse_b, std::nullopt, std::nullopt, out_dtype);
    } catch (const std::exception&) {  // c10::Error, or oneDNN's own dnnl::error
      cpu_scaled_mm_refused.store(true);
    }
  }
  return (at::mm(a.to(at::kFloat), b.to(at::kFloat)) * (inverse_a * inverse_b)).to(out_dtype);
}

// A row-major [r, c] e4m3 matrix as the column-major operand _scaled_mm wants second: the same matrix, stored
// transposed.
at::Tensor column_major(const at::Tensor& m) { return m.t().contiguous().t(); }

at::ScalarType gradient_dtype(at::ScalarType t) { return t == at::kFloat ? at::kFloat : at::kBFloat16; }

// x_values and x_inverse_scale: x's cast, made once by the caller for all the weights that read x (not
// differentiated through: the gradient goes to x).
struct Fp8Linear : public torch::autograd::Function<Fp8Linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& x_values, const at::Tensor& x_inverse_scale) {
    const int64_t N = weight.size(0);
    const E4m3Cast xq{x_values, x_inverse_scale}, wq = cast_to_e4m3(weight);
    // y = x W^T: W [N, K] row-major is W^T [K, N] column-major.
    const at::Tensor y = scaled_mm(xq.values, wq.values.t(), xq.inverse_scale, wq.inverse_scale, at::kBFloat16);
    ctx->save_for_backward({xq.values, xq.inverse_scale, wq.values, wq.inverse_scale});
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["w_dtype"] = weight.scalar_type();
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = N;
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x8 = saved[0], &x_inv = saved[1], &w8 = saved[2], &w_inv = saved[3];
    const int64_t N = w8.size(0);
    const E4m3Cast gq = cast_to_e4m3(grads[0].reshape({-1, N}));
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      // dx = g W: g [M, N] row-major, W [N, K] column-major.
      dx = scaled_mm(gq.values, column_major(w8), gq.inverse_scale, w_inv, at::kBFloat16)
               .to(ctx->saved_data["x_dtype"].toScalarType())
               .view(ctx->saved_data["x_shape"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      // dW = g^T x: g^T [N, M] row-major, x [M, K] column-major.
      const at::ScalarType w_dtype = ctx->saved_data["w_dtype"].toScalarType();
      dw = scaled_mm(gq.values.t().contiguous(), column_major(x8), gq.inverse_scale, x_inv, gradient_dtype(w_dtype))
               .to(w_dtype);
    }
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

E4m3Cast cast_to_e4m3(const at::Tensor& t) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // as in scaled_mm
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble,
              "cast_to_e4m3: needs an fp32, bf16 or fp16 tensor, got ", t.scalar_type());
  if (t.device().is_cpu()) return cpu_cast(t);
  return cuda_cast_applies(t) ? cuda_cast(t) : cast_to_e4m3_composite(t);
}

E4m3Cast cast_to_e4m3_composite(const at::Tensor& t) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor f = t.to(at::kFloat);
  const at::Tensor amax = f.abs().amax();
  // 448 / amax as one fp32 division (at::operator/(Scalar, Tensor) would multiply by a rounded reciprocal).
  const at::Tensor scale = at::div(at::scalar_tensor(kE4m3Max, amax.options()), amax.clamp_min(kFp8AmaxFloor));
  at::Tensor values = (f * scale).clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn).contiguous();
  return {values, scale.reciprocal()};
}

bool fp8_cast_cuda_built() {
#if defined(ARCHSPACE_WITH_CUDA_KERNELS)
  return true;
#else
  return false;
#endif
}

bool fp8_linear_applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.is_cuda()) return true;
  const int64_t K = weight.size(1), N = weight.size(0), M = x.numel() / std::max<int64_t>(K, 1);
  return M % 16 == 0 && K % 16 == 0 && N % 16 == 0;
}

std::vector<at::Tensor> fp8_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  std::optional<E4m3Cast> xq;  // made at the first weight that takes _scaled_mm
  std::vector<at::Tensor> ys;
  for (const at::Tensor& w : weights) {
    TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "fp8_linear: x ", x.sizes(),
                " against a weight ", w.sizes());
    if (!fp8_linear_applies(x, w)) {
      ys.push_back(archspace::linear(x, w));
      continue;
    }
    if (!xq) {
      c10::NoGradGuard no_grad;
      xq = cast_to_e4m3(x.detach().reshape({-1, x.size(-1)}));
    }
    ys.push_back(Fp8Linear::apply(x, w, xq->values, xq->inverse_scale));
  }
  return ys;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight) { return fp8_linear_many(x, {weight}).front(); }

}  // namespace archspace
