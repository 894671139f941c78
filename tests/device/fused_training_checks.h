// The fused training kernels (kernels/fused_training.h) against ATen's composite and fp64 on one device, each
// forward and backward: shared by the CPU unit test (tests/unit/test_fused_training.cpp, small shapes) and the
// device check (tests/device/check_kernels.cpp, the 1B's shapes on the GPU), so both hold the kernels to one bound.
//
// The bound, elementwise, with u = 2^-24 (fp32's unit roundoff) and b = 2^-8 (bf16's):
//   |fused - reference| <= (2 (D + 8) u + 2 k b) M
// where M is the fp64 magnitude of the terms that form the element (per kernel below), D the length of the one sum
// that feeds it (a row of the norm, plus the rows for the weight's gradient; 1 for SwiGLU, whose exp differs by a
// few ulp between libm, CUDA and ATen's vectorised exp, within the 8), and k the number of roundings to bf16 on its
// way (0 in fp32 storage) at which the two sides' fp32 values, off by the first term, may round to neighbouring bf16
// values (each such flip, or the fused side's own rounding against fp64, moves the result by at most 2 b of the
// rounded value). Each side's sum of D terms is within (D - 1) u of the exact one relative to the sum of the terms'
// magnitudes (Higham's bound, any order); the 8 covers the few products and the division around it; the factor 2
// counts both sides (the fp64 reference's own error, ~2^-53, counts for nothing). A wrong index, a missed rotation
// sign moves an element by the order of M itself, far above these bounds.
//
// A dropped or extra rounding to bf16 moves an element by at most a bf16 unit, which the bound allows; where no
// sum feeds an element (SwiGLU), the fused kernel and the composite run the same correctly rounded operations but
// for exp (a few fp32 ulps apart, 2^-22 relative), which flips a later bf16 rounding with probability about
// 2^-22 / 2^-8 = 2^-14 per rounding: there the check also wants 99% of the elements bit-equal (a dropped rounding
// leaves ~70%).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "archspace/kernels/fused_training.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/rope.h"

namespace archspace::fused_training_checks {

struct Check {
  std::string name;
  double worst = 0;      // the worst element's |fused - reference| as a share of its bound: passes at <= 1
  double equal = 0;      // the share of elements bit-equal to the reference
  double min_equal = 0;  // the least share that passes
  bool pass() const { return worst <= 1.0 && equal >= min_equal; }
};

inline constexpr double kU = 1.0 / (1 << 24), kB = 1.0 / 256;

inline double bound_factor(int64_t D, int roundings) {
  return 2.0 * static_cast<double>(D + 8) * kU + 2.0 * roundings * kB;
}

inline Check compare(const std::string& name, const at::Tensor& got, const at::Tensor& want,
                     const at::Tensor& magnitude, double factor, double min_equal = 0) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  TORCH_CHECK(g.sizes() == w.sizes(), name, ": ", g.sizes(), " against ", w.sizes());
  const at::Tensor bound = (magnitude.to(at::kDouble).abs() * factor).clamp_min(1e-300);
  return {name, ((g - w).abs() / bound).max().item<double>(), at::eq(g, w).to(at::kDouble).mean().item<double>(),
          min_equal};
}

inline at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

inline std::string dtype_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "fp32"; }

// Runs f with the run's kernel choices (kernels/dispatch.h) holding the fused kernels on or off.
template <class F>
auto with_kernels(bool fused, F&& f) {
  return f(KernelChoices{fused, false});
}

// The norm over [rows, width]: y, dx and dw against the composite (same dtype) and fp64.
inline std::vector<Check> rms_norm(at::Device device, at::ScalarType dtype, int64_t rows, int64_t width) {
  auto opts = at::TensorOptions().device(device);
  const at::Tensor x = (at::randn({rows, width}, opts) * 3).to(dtype), w = at::randn({width}, opts) * 0.5 + 1;
  const at::Tensor dy = at::randn({rows, width}, opts).to(dtype);
  const double eps = 1e-6;
  auto run = [&](const at::Tensor& xs, const at::Tensor& ws, bool fused) {
    return with_kernels(fused, [&](KernelChoices kernels) {
      at::Tensor xl = leaf(xs), wl = leaf(ws);
      at::Tensor y = archspace::rms_norm(xl, wl, eps, kernels);
      y.backward(dy.to(y.scalar_type()));
      return std::vector<at::Tensor>{y.detach(), xl.grad(), wl.grad()};
    });
  };
  const auto fused = run(x, w, true), composite = run(x, w, false);
  const auto exact = run(x.to(at::kDouble), w.to(at::kDouble), false);
  // Magnitudes: y's terms; dx's two terms r g w and x r^3 sum(g w x) / D; dw's terms over the rows.
  const at::Tensor x64 = x.to(at::kDouble), w64 = w.to(at::kDouble), g64 = dy.to(at::kDouble);
  const at::Tensor r = at::rsqrt(x64.pow(2).mean(-1, true) + eps);
  const at::Tensor m_y = (w64 * x64 * r).abs();
  const at::Tensor m_dx = r * (g64 * w64).abs() + x64.abs() * r.pow(3) * (g64 * w64 * x64).abs().sum(-1, true) / width;
  const at::Tensor m_dw = (g64 * x64 * r).abs().sum(0);
  const int k = dtype == at::kBFloat16 ? 1 : 0;
  const std::string name = "rms_norm " + dtype_name(dtype) + " D=" + std::to_string(width);
  std::vector<Check> out;
  for (const auto& [ref, label] : {std::pair{&composite, " vs composite"}, std::pair{&exact, " vs fp64"}}) {
    const int own = std::string(label) == " vs fp64" ? k : 0;  // the fused side's own rounding, which fp64 lacks
    out.push_back(compare(name + " y" + label, fused[0], (*ref)[0], m_y, bound_factor(width, k + own)));
    out.push_back(compare(name + " dx" + label, fused[1], (*ref)[1], m_dx, bound_factor(width, k + own)));
    out.push_back(compare(name + " dw" + label, fused[2], (*ref)[2], m_dw, bound_factor(width + rows, 0)));
  }
  return out;
}

// residual + norm(x), the blocks' residual adds: out, the residual's gradient (the output's, unchanged), dx and dw
// against the composite.
inline std::vector<Check> add_rms_norm(at::Device device, at::ScalarType residual_dtype, at::ScalarType x_dtype,
                                       int64_t rows, int64_t width) {
  auto opts = at::TensorOptions().device(device);
  const at::Tensor residual = at::randn({rows, width}, opts).to(residual_dtype);
  const at::Tensor x = (at::randn({rows, width}, opts) * 5).to(x_dtype), w = at::randn({width}, opts) * 0.3 + 1;
  const at::ScalarType out_dtype = at::promote_types(residual_dtype, x_dtype);
  const at::Tensor dy = at::randn({rows, width}, opts).to(out_dtype);
  const double eps = 1e-5;
  auto run = [&](bool fused) {
    return with_kernels(fused, [&](KernelChoices kernels) {
      at::Tensor rl = leaf(residual), xl = leaf(x), wl = leaf(w);
      at::Tensor y = archspace::add_rms_norm(rl, xl, wl, eps, kernels);
      y.backward(dy);
      return std::vector<at::Tensor>{y.detach(), rl.grad(), xl.grad(), wl.grad()};
    });
  };
  const auto fused = run(true), composite = run(false);
  const at::Tensor x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  const at::Tensor g64 = dy.to(x_dtype).to(at::kDouble);  // the norm's gradient: the output's in x's dtype
  const at::Tensor r = at::rsqrt(x64.pow(2).mean(-1, true) + eps);
  const at::Tensor m_y = residual.to(at::kDouble).abs() + (w64 * x64 * r).abs();
  const at::Tensor m_dx = r * (g64 * w64).abs() + x64.abs() * r.pow(3) * (g64 * w64 * x64).abs().sum(-1, true) / width;
  const at::Tensor m_dw = (g64 * x64 * r).abs().sum(0);
  // The norm rounds to x's dtype, then the sum to the output's.
  const int kx = x_dtype == at::kBFloat16 ? 1 : 0, k = kx + (out_dtype == at::kBFloat16 ? 1 : 0);
  const std::string name = "add_rms_norm " + dtype_name(residual_dtype) + "+" + dtype_name(x_dtype);
  return {compare(name + " y vs composite", fused[0], composite[0], m_y, bound_factor(width, k)),
          compare(name + " dresidual vs composite", fused[1], composite[1], composite[1], 0.0),
          compare(name + " dx vs composite", fused[2], composite[2], m_dx, bound_factor(width, kx)),
          compare(name + " dw vs composite", fused[3], composite[3], m_dw, bound_factor(width + rows, 0))};
}

// OLMo 3's Q/K norm over the whole projection x [B, T, H * h], then each head's rotation; tables [T, h] (one set of
// positions) or [B, 1, T, h] (per-sequence positions, as document masking and decoding pass them).
inline std::vector<Check> rms_norm_rope(at::Device device, at::ScalarType dtype, int64_t B, int64_t T, int64_t H,
                                        int64_t h, bool per_sequence) {
  auto opts = at::TensorOptions().device(device);
  const int64_t D = H * h;
  const at::Tensor x = (at::randn({B, T, D}, opts) * 2).to(dtype), w = at::randn({D}, opts) * 0.2 + 1;
  const Rope rope{plain_inv_freq(h, 500000.0), 1.0};
  at::Tensor positions = at::arange(T, opts.dtype(at::kLong));
  if (per_sequence) positions = at::stack({positions, positions + 7}).narrow(0, 0, std::min<int64_t>(B, 2));
  auto [cos, sin] = rope.tables(positions);
  if (per_sequence) {
    TORCH_CHECK(B <= 2, "rms_norm_rope check: per-sequence tables for at most 2 sequences");
    cos = cos.unsqueeze(1).contiguous();
    sin = sin.unsqueeze(1).contiguous();
  }
  const at::Tensor dy = at::randn({B, H, T, h}, opts).to(dtype);
  const double eps = 1e-6;
  auto run = [&](const at::Tensor& xs, const at::Tensor& ws, bool fused) {
    return with_kernels(fused, [&](KernelChoices kernels) {
      at::Tensor xl = leaf(xs), wl = leaf(ws);
      const at::ScalarType table = xs.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      at::Tensor y = archspace::rms_norm_rope(xl, wl, eps, cos.to(table), sin.to(table), h, kernels);
      y.backward(dy.to(y.scalar_type()));
      return std::vector<at::Tensor>{y.detach(), xl.grad(), wl.grad()};
    });
  };
  const auto fused = run(x, w, true), composite = run(x, w, false);
  const auto exact = run(x.to(at::kDouble), w.to(at::kDouble), false);
  // Magnitudes: y = n c + rot(n) s with n = w x r; the norm's gradient g = dy c + rot^T(dy s) (terms |dy c| and
  // |dy_p s_p|), then the norm's backward as above.
  const at::Tensor x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  const at::Tensor r = at::rsqrt(x64.pow(2).mean(-1, true) + eps);
  const at::Tensor n = (w64 * x64 * r).view({B, T, H, h}).transpose(1, 2);
  const at::Tensor c64 = cos.to(at::kDouble), s64 = sin.to(at::kDouble);
  auto rotate = [&](const at::Tensor& t) { return at::cat({t.narrow(-1, h / 2, h / 2), t.narrow(-1, 0, h / 2)}, -1); };
  const at::Tensor m_y = (n * c64).abs() + (rotate(n) * s64).abs();
  const at::Tensor dy64 = dy.to(at::kDouble);
  const at::Tensor g = ((dy64 * c64).abs() + rotate(dy64 * s64).abs()).transpose(1, 2).reshape({B, T, D});
  const at::Tensor m_dx = r * (g * w64).abs() + x64.abs() * r.pow(3) * (g * w64 * x64).abs().sum(-1, true) / D;
  const at::Tensor m_dw = (g * x64 * r).abs().sum(at::IntArrayRef{0, 1});
  const int k = dtype == at::kBFloat16 ? 1 : 0;
  const std::string name = "rms_norm_rope " + dtype_name(dtype) + (per_sequence ? " [B,1,T,h]" : " [T,h]");
  std::vector<Check> out;
  for (const auto& [ref, label] : {std::pair{&composite, " vs composite"}, std::pair{&exact, " vs fp64"}}) {
    // Roundings to bf16: the normed value (read at i and at its partner) and the output; in the backward, the
    // rotation's gradient (the same value on both sides of the composite: no sum feeds it; fp64 has none) and dx.
    const int own = std::string(label) == " vs fp64" ? k : 0;
    out.push_back(compare(name + " y" + label, fused[0], (*ref)[0], m_y, bound_factor(D, 3 * k + own)));
    out.push_back(compare(name + " dx" + label, fused[1], (*ref)[1], m_dx, bound_factor(D, k + 2 * own)));
    out.push_back(compare(name + " dw" + label, fused[2], (*ref)[2], m_dw, bound_factor(D + B * T, own)));
  }
  return out;
}

// silu(gate) * up over the two halves of one gate/up output [rows, 2F] (strided rows) or over contiguous copies.
inline std::vector<Check> swiglu(at::Device device, at::ScalarType dtype, int64_t rows, int64_t F, bool halves) {
  auto opts = at::TensorOptions().device(device);
  const at::Tensor both = (at::randn({rows, 2 * F}, opts) * 3).to(dtype);
  const at::Tensor gate = halves ? both.narrow(-1, 0, F) : both.narrow(-1, 0, F).contiguous();
  const at::Tensor up = halves ? both.narrow(-1, F, F) : both.narrow(-1, F, F).contiguous();
  const at::Tensor dh = at::randn({rows, F}, opts).to(dtype);
  auto run = [&](const at::Tensor& g, const at::Tensor& u, bool fused) {
    return with_kernels(fused, [&](KernelChoices kernels) {
      // Views of one tensor, as the model's gate/up halves are (leaves of a shared base).
      at::Tensor base = leaf(at::cat({g, u}, -1));
      at::Tensor gl = base.narrow(-1, 0, F), ul = base.narrow(-1, F, F);
      if (!halves) {
        gl = gl.contiguous();
        ul = ul.contiguous();
      }
      at::Tensor hidden = fused ? fused_swiglu_trained(gl, ul) : at::silu(gl) * ul;
      hidden.backward(dh.to(hidden.scalar_type()));
      return std::vector<at::Tensor>{hidden.detach(), base.grad().narrow(-1, 0, F), base.grad().narrow(-1, F, F)};
    });
  };
  const auto fused = run(gate, up, true), composite = run(gate, up, false);
  const auto exact = run(gate.to(at::kDouble), up.to(at::kDouble), false);
  const at::Tensor g64 = gate.to(at::kDouble), u64 = up.to(at::kDouble), dh64 = dh.to(at::kDouble);
  const at::Tensor s = at::sigmoid(g64);
  const at::Tensor m_h = (g64 * s * u64).abs();
  const at::Tensor m_dg = (dh64 * u64 * s * (1 + g64 * (1 - s))).abs() + (dh64 * u64 * s).abs();
  const at::Tensor m_du = (dh64 * g64 * s).abs();
  const int k = dtype == at::kBFloat16 ? 2 : 0;  // silu(g) or dh * u, then the result
  const std::string name = "swiglu " + dtype_name(dtype) + (halves ? " halves" : "");
  std::vector<Check> out;
  for (const auto& [ref, label] : {std::pair{&composite, " vs composite"}, std::pair{&exact, " vs fp64"}}) {
    const bool fp64 = std::string(label) == " vs fp64";
    const int own = fp64 && dtype == at::kBFloat16 ? 1 : 0;
    const double min_equal = !fp64 && dtype == at::kBFloat16 ? 0.99 : 0;
    out.push_back(compare(name + " h" + label, fused[0], (*ref)[0], m_h, bound_factor(1, k + own), min_equal));
    out.push_back(compare(name + " dgate" + label, fused[1], (*ref)[1], m_dg, bound_factor(1, k + own), min_equal));
    out.push_back(compare(name + " dup" + label, fused[2], (*ref)[2], m_du, bound_factor(1, k + own), min_equal));
  }
  return out;
}

}  // namespace archspace::fused_training_checks
