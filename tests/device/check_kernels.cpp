// check_kernels: the fused training kernels (kernels/fused_training.h) on one device, as one JSON line on stdout
// (scripts/device_check.py runs it). Each kernel's forward and backward against ATen's composite and fp64 within the
// elementwise bound of tests/device/fused_training_checks.h (the CPU unit test's checks, here at the 1B's shapes),
// then each kernel's time, forward and backward through autograd, beside the composite's (and, for the plain norm,
// beside ATen's own at::rms_norm, which is fused on CUDA): the figures that decide whether train.fused_kernels
// becomes the default. Then FP8's fused cast (kernels/fp8_linear.h: cast_to_e4m3, train.fp8's every operand) against
// ATen's separate ops bit for bit, and its time beside theirs. With --device cpu (the dry run in CI) the CPU launches
// run at small shapes.
//
//   check_kernels [--device cuda|cpu] [--iterations N]
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/kernels/dispatch.h"
#include "archspace/kernels/fp8_linear.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/rope.h"
#include "fused_training_checks.h"

using namespace archspace;
namespace checks = archspace::fused_training_checks;

namespace {

struct Shapes {
  int64_t batch, sequence, hidden, heads, head_dim, intermediate;
  int64_t rows() const { return batch * sequence; }
};

// The median of `iterations` timed calls (after two untimed), in milliseconds, the device synchronised around each.
double median_ms(const at::Device& device, const std::function<void()>& f, int iterations) {
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
  };
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Forward and backward of `forward` over leaves made from `inputs`, with the kernels on or off.
std::function<void()> step(bool fused, const std::vector<at::Tensor>& inputs,
                           std::function<at::Tensor(const std::vector<at::Tensor>&, KernelChoices)> forward) {
  return [=] {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& t : inputs) leaves.push_back(t.detach().requires_grad_(true));
    at::Tensor y = forward(leaves, KernelChoices{fused, false});
    y.backward(at::ones_like(y));
  };
}

nlohmann::json timing(const at::Device& device, const Shapes& s, int iterations) {
  auto opts = at::TensorOptions().device(device);
  const int64_t rows = s.rows(), D = s.hidden, F = s.intermediate;
  const at::Tensor x = at::randn({s.batch, s.sequence, D}, opts).to(at::kBFloat16);
  const at::Tensor stream = at::randn({s.batch, s.sequence, D}, opts);  // the fp32 residual stream
  const at::Tensor w = at::randn({D}, opts) + 1;
  const at::Tensor gate_up = at::randn({rows, 2 * F}, opts).to(at::kBFloat16);
  const Rope rope{plain_inv_freq(s.head_dim, 500000.0), 1.0};
  auto [cos, sin] = rope.tables(at::arange(s.sequence, opts.dtype(at::kLong)));
  const double eps = 1e-6;
  struct Timed {
    const char* name;
    std::vector<at::Tensor> inputs;
    std::function<at::Tensor(const std::vector<at::Tensor>&, KernelChoices)> forward;
  };
  const std::vector<Timed> kernels = {
      {"rms_norm", {x, w}, [&](const auto& in, KernelChoices k) { return rms_norm(in[0], in[1], eps, k); }},
      {"add_rms_norm",
       {stream, x, w},
       [&](const auto& in, KernelChoices k) { return add_rms_norm(in[0], in[1], in[2], eps, k); }},
      {"rms_norm_rope",
       {x, w},
       [&](const auto& in, KernelChoices k) { return rms_norm_rope(in[0], in[1], eps, cos, sin, s.head_dim, k); }},
      {"swiglu", {gate_up}, [&](const auto& in, KernelChoices k) {
         const at::Tensor g = in[0].narrow(-1, 0, F), u = in[0].narrow(-1, F, F);
         return swiglu_kernel(g, u, k) == Kernel::kAtenComposite ? at::silu(g) * u : fused_swiglu_trained(g, u);
       }}};
  nlohmann::json out = nlohmann::json::object();
  for (const Timed& k : kernels) {
    const double fused = median_ms(device, step(true, k.inputs, k.forward), iterations);
    const double composite = median_ms(device, step(false, k.inputs, k.forward), iterations);
    out[k.name] = {{"fused_ms", fused}, {"composite_ms", composite}, {"speedup", composite / fused}};
  }
  // ATen's own fused RMSNorm (bf16 weight, as it takes one dtype), the other candidate the issue names.
  const at::Tensor w16 = w.to(at::kBFloat16);
  out["rms_norm"]["aten_rms_norm_ms"] = median_ms(
      device,
      step(false, {x, w16}, [&](const auto& in, KernelChoices) { return at::rms_norm(in[0], {D}, in[1], eps); }),
      iterations);
  return out;
}

// FP8's cast against ATen's separate ops (cast_to_e4m3_composite), which must agree bit for bit: the same maximum
// and one product per entry (src/kernels/fp8_cast_math.h). The cases: activations with an outlier (most entries
// then fall into e4m3's subnormals), a zero tensor, and a NaN (every value NaN, as the composite gives).
checks::Check fp8_cast_check(const at::Device& device, at::ScalarType dtype, int64_t rows, int64_t width) {
  at::Tensor t = at::randn({rows, width}, at::TensorOptions().device(device)) * 3;
  t[rows / 2][width / 3] = 1e4;
  std::vector<at::Tensor> cases = {t.to(dtype), at::zeros({rows, 16}, t.options().dtype(dtype))};
  at::Tensor with_nan = at::randn({64, width}, t.options()).to(dtype);
  with_nan[5][7] = NAN;
  cases.push_back(with_nan);
  int64_t equal = 0, total = 0;
  bool scales_equal = true;
  for (const at::Tensor& c : cases) {
    const E4m3Cast fused = cast_to_e4m3(c), composite = cast_to_e4m3_composite(c);
    const at::Tensor a = fused.values.view(at::kByte), b = composite.values.view(at::kByte);
    // NaN's e4m3 bits carry the sign of whichever NaN each side produced: compare them as NaN.
    const at::Tensor nan = fused.values.to(at::kFloat).isnan() & composite.values.to(at::kFloat).isnan();
    equal += ((a == b) | nan).sum().item<int64_t>();
    total += a.numel();
    const float fi = fused.inverse_scale.item<float>(), ci = composite.inverse_scale.item<float>();
    scales_equal = scales_equal && (fi == ci || (std::isnan(fi) && std::isnan(ci)));
  }
  checks::Check c;
  c.name = std::string("fp8_cast ") + (dtype == at::kBFloat16 ? "bf16" : "fp32");
  c.equal = static_cast<double>(equal) / static_cast<double>(total);
  c.min_equal = 1.0;
  c.worst = scales_equal ? 0.0 : 2.0;  // a different scale fails the check (worst above 1)
  return c;
}

// The cast of the MLP's down-projection input (the largest operand train.fp8 casts each step), fused and composite.
nlohmann::json fp8_cast_timing(const at::Device& device, const Shapes& s, int iterations) {
  const at::Tensor x = at::randn({s.rows(), s.intermediate}, at::TensorOptions().device(device)).to(at::kBFloat16);
  const double fused = median_ms(
      device, [&] { cast_to_e4m3(x); }, iterations);
  const double composite = median_ms(
      device, [&] { cast_to_e4m3_composite(x); }, iterations);
  return {{"fused_ms", fused}, {"composite_ms", composite}, {"speedup", composite / fused}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda";
  int iterations = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device_name = argv[i + 1];
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::max(1, std::atoi(argv[i + 1]));
  }
  const at::Device device(device_name);
  const bool small = !device.is_cuda();
  // The 1B's shapes at 4 x 4,096 tokens (hidden 2,048, 16 heads of 128, MLP 8,192); tiny ones on the CPU.
  const Shapes s = small ? Shapes{2, 24, 64, 4, 16, 96} : Shapes{4, 4096, 2048, 16, 128, 8192};
  at::manual_seed(0);
  std::vector<checks::Check> results;
  auto add = [&](std::vector<checks::Check> more) { results.insert(results.end(), more.begin(), more.end()); };
  add(checks::rms_norm(device, at::kBFloat16, s.rows(), s.hidden));
  add(checks::rms_norm(device, at::kFloat, std::min<int64_t>(s.rows(), 1024), s.hidden));
  add(checks::add_rms_norm(device, at::kFloat, at::kBFloat16, s.rows(), s.hidden));
  add(checks::add_rms_norm(device, at::kBFloat16, at::kBFloat16, s.rows(), s.hidden));
  add(checks::rms_norm_rope(device, at::kBFloat16, s.batch, s.sequence, s.heads, s.head_dim, false));
  add(checks::rms_norm_rope(device, at::kBFloat16, 2, s.sequence, s.heads, s.head_dim, true));
  add(checks::swiglu(device, at::kBFloat16, s.rows(), s.intermediate, true));
  add(checks::swiglu(device, at::kFloat, std::min<int64_t>(s.rows(), 1024), s.intermediate, false));
  results.push_back(fp8_cast_check(device, at::kBFloat16, s.rows(), s.intermediate));
  results.push_back(fp8_cast_check(device, at::kFloat, std::min<int64_t>(s.rows(), 1024), s.intermediate));
  // On a GPU the kernels must be this build's own CUDA launch: without it the model falls back to the composite,
  // and every check would compare the composite with itself.
  bool ok = !device.is_cuda() || (fused_training_cuda_built() && fp8_cast_cuda_built());
  nlohmann::json rows = nlohmann::json::array();
  for (const checks::Check& c : results) {
    ok = ok && c.pass();
    rows.push_back({{"check", c.name},
                    {"worst_share_of_bound", c.worst},
                    {"bit_equal", c.equal},
                    {"min_bit_equal", c.min_equal},
                    {"pass", c.pass()}});
  }
  nlohmann::json j = {{"device", device.str()},
                      {"cuda_launch_built", fused_training_cuda_built()},
                      {"shapes",
                       {{"batch", s.batch},
                        {"sequence", s.sequence},
                        {"hidden", s.hidden},
                        {"heads", s.heads},
                        {"head_dim", s.head_dim},
                        {"intermediate", s.intermediate}}},
                      {"checks", rows},
                      {"fp8_cast_cuda_built", fp8_cast_cuda_built()},
                      {"timing_ms", timing(device, s, small ? 3 : iterations)},
                      {"fp8_cast_timing_ms", fp8_cast_timing(device, s, small ? 3 : iterations)},
                      {"pass", ok}};
  std::printf("%s\n", j.dump().c_str());
  return ok ? 0 : 1;
}
