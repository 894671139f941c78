// kernels/cross_entropy_rows: the per-row log-sum-exp and the in-place logits gradient of cross-entropy + z-loss,
// against fp64 (autograd of the loss's own formula) with bounds derived from the kernel's arithmetic, on every
// CPU path this machine can run, fp32 and bf16 logits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "archspace/kernels/cross_entropy_rows.h"
#include "archspace/util/error.h"

using namespace archspace;

namespace {

constexpr double u = 0x1p-24;     // fp32 unit roundoff
constexpr double kExp = 0x1p-22;  // the AVX2 exp's relative error (DecodeAttention.ExpWithinTwoUlp); std::exp's is less
constexpr double uBf16 = 0x1p-8;  // bf16 unit roundoff (8 significant bits)

std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> paths = {CpuIsa::kScalar};
  if (max_cpu_isa() >= CpuIsa::kAvx2) paths.push_back(CpuIsa::kAvx2);
  return paths;
}

// Rows of logits as a head makes them (spread of a few units), with a very negative entry (its exp underflows)
// and the row's maximum at the label in one row.
at::Tensor logits_like(int64_t n, int64_t V, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({n, V}, at::kDouble) * 3;
  if (V > 2) x.index_put_({0, 1}, -1e4);
  return x.to(dtype);
}

struct Reference {
  at::Tensor lse, grad;  // fp64
};

// The loss g_ce * sum(lse - picked) + g_z * coeff * sum(lse^2) in fp64 and its gradient by autograd.
Reference reference(const at::Tensor& logits, const at::Tensor& targets, double g_ce, double g_z, double coeff) {
  at::Tensor x = logits.to(at::kDouble).detach().requires_grad_(true);
  at::Tensor lse = at::logsumexp(x, -1);
  at::Tensor picked = x.gather(1, targets.unsqueeze(1)).squeeze(1);
  at::Tensor loss = g_ce * (lse - picked).sum() + g_z * coeff * lse.pow(2).sum();
  loss.backward();
  return {lse.detach(), x.grad()};
}

void expect_rows(int64_t n, int64_t V, at::ScalarType dtype, uint64_t seed) {
  const at::Tensor logits = logits_like(n, V, dtype, seed);
  const at::Tensor targets = at::randint(V, {n}, at::kLong);
  const double g_ce = 0.37, g_z = 1.3, coeff = 1e-4;  // the backward's output gradients and the z-loss coefficient
  const Reference ref = reference(logits, targets, g_ce, g_z, coeff);
  const at::Tensor x64 = logits.to(at::kDouble);
  const at::Tensor range = (std::get<0>(x64.max(-1)) - std::get<0>(x64.min(-1))).clamp_max(88.4);
  for (CpuIsa isa : runnable_paths()) {
    SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " " + c10::toString(dtype) + " V=" + std::to_string(V));
    const RowLogSumExp got = cross_entropy_rows(logits, targets, isa);
    EXPECT_TRUE(at::equal(got.picked, logits.gather(1, targets.unsqueeze(1)).squeeze(1).to(at::kFloat)));
    // lse: each exp(x - max) within kExp + u |x - max| (the subtraction's rounding) relative, the fp32 sums of
    // at most 32 terms a lane plus 3 to join the lanes within 35u, the fp64 joins and log exact enough, then
    // one rounding of lse to fp32; underflowed terms (below FLT_MIN each) add at most V FLT_MIN.
    const at::Tensor lse_error = (got.lse.to(at::kDouble) - ref.lse).abs();
    const at::Tensor lse_bound = kExp + u * range + 35 * u + u * ref.lse.abs() + V * 1.2e-38;
    EXPECT_TRUE((lse_error <= lse_bound).all().item<bool>()) << (lse_error - lse_bound).max().item<double>();

    // The gradient, in place, from the kernel's own lse (which differs from fp64's by lse_error: exp(x - lse)
    // moves by that much relative, the scale g_ce + g_z2 lse by g_z2 times it).
    at::Tensor grad = logits.clone();
    const float g_z2 = static_cast<float>(2 * coeff * g_z);
    cross_entropy_grad_rows_(grad, targets, got.lse, static_cast<float>(g_ce), g_z2, isa);
    const at::Tensor lse_k = got.lse.to(at::kDouble).unsqueeze(1), delta = lse_error.unsqueeze(1);
    const at::Tensor e = at::exp(x64 - lse_k), scale = g_ce + g_z2 * lse_k;
    // exp within kExp + u |x - lse| relative, scale and product 3u, the label's subtraction u |g_ce|; bf16
    // rounds the result once more (uBf16 of the value).
    at::Tensor bound = (e * scale).abs() * (kExp + u * (x64 - lse_k).abs() + 3 * u + delta) + (e * g_z2).abs() * delta;
    bound = bound + at::zeros_like(bound).scatter_(1, targets.unsqueeze(1), u * g_ce);
    if (dtype == at::kBFloat16) bound = bound + uBf16 * (ref.grad.abs() + bound);
    const at::Tensor error = (grad.to(at::kDouble) - ref.grad).abs();
    EXPECT_TRUE((error <= bound).all().item<bool>()) << (error - bound).max().item<double>();
  }
}

}  // namespace

TEST(CrossEntropyRows, LseAndGradientAgainstFp64OnEveryPath) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int64_t V : {1, 7, 8, 13, 1000, 100278}) expect_rows(V > 1000 ? 3 : 9, V, dtype, static_cast<uint64_t>(V));
}

// Rows are independent: a row alone equals the same row in a batch bit for bit, whatever the thread count.
TEST(CrossEntropyRows, RowsAreBatchAndThreadInvariant) {
  const at::Tensor logits = logits_like(6, 5003, at::kBFloat16, 3);
  const at::Tensor targets = at::randint(5003, {6}, at::kLong);
  const int threads = at::get_num_threads();
  for (CpuIsa isa : runnable_paths()) {
    at::set_num_threads(1);
    const RowLogSumExp one = cross_entropy_rows(logits, targets, isa);
    at::set_num_threads(std::max(2, threads));
    const RowLogSumExp many = cross_entropy_rows(logits, targets, isa);
    EXPECT_TRUE(at::equal(one.lse, many.lse));
    const RowLogSumExp alone = cross_entropy_rows(logits.narrow(0, 4, 1), targets.narrow(0, 4, 1), isa);
    EXPECT_TRUE(at::equal(alone.lse, many.lse.narrow(0, 4, 1)));
  }
  at::set_num_threads(threads);
}

TEST(CrossEntropyRows, StridedRowsAndNonFiniteLogits) {
  at::Tensor wide = logits_like(4, 40, at::kFloat, 5);
  const at::Tensor rows = wide.narrow(1, 3, 30);  // row stride 40, contiguous within a row
  const at::Tensor targets = at::tensor({0, 29, 5, 7}, at::kLong);
  const RowLogSumExp strided = cross_entropy_rows(rows, targets),
                     packed = cross_entropy_rows(rows.contiguous(), targets);
  EXPECT_TRUE(at::equal(strided.lse, packed.lse));
  at::Tensor bad = rows.contiguous();
  bad.index_put_({1, 2}, std::numeric_limits<float>::quiet_NaN());
  bad.index_put_({2, 2}, std::numeric_limits<float>::infinity());
  const RowLogSumExp out = cross_entropy_rows(bad, targets);
  EXPECT_TRUE(std::isfinite(out.lse[0].item<float>()));
  EXPECT_FALSE(std::isfinite(out.lse[1].item<float>()));
  EXPECT_FALSE(std::isfinite(out.lse[2].item<float>()));
}

TEST(CrossEntropyRows, BadInputIsNamed) {
  const at::Tensor logits = at::randn({2, 5});
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              cross_entropy_rows(logits, at::tensor({0, 5}, at::kLong));
            }).find("target 5 of row 1"),
            std::string::npos);
  EXPECT_NE(message([&] {
              cross_entropy_rows(logits.t(), at::tensor({0, 1}, at::kLong));
            }).find("contiguous rows"),
            std::string::npos);
  EXPECT_NE(message([&] {
              cross_entropy_rows(logits.to(at::kDouble), at::tensor({0, 1}, at::kLong));
            }).find("fp32"),
            std::string::npos);
  EXPECT_NE(message([&] {
              cross_entropy_rows(logits, at::tensor({0, 1}, at::kInt));
            }).find("int64"),
            std::string::npos);
  at::Tensor g = logits.clone();
  EXPECT_NE(message([&] {
              cross_entropy_grad_rows_(g, at::tensor({0, 1}, at::kLong), at::zeros({3}), 1, 0);
            }).find("lse must be"),
            std::string::npos);
}
