// Comparison bounds for fp32 results, derived from the arithmetic rather than from what one CPU printed
// (docs/reference.md). tests/python/tolerances.py states the same rules for pytest.
//
// The model: each fp32 operation is exact, then rounded, so its relative error is at most u = 2^-24. A sum of
// n terms, in whatever order a kernel adds them (GEMM blocking, vector width, thread split, oneDNN or MKL
// or ATen), is within gamma(n) times the sum of the terms' magnitudes of the exact sum: n u / (1 - n u) at
// worst (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1), about 10 sqrt(n) u but for a
// probability below 1e-16 (Higham and Mary 2019; see gamma). Two fp32 computations of one value are each
// within their bound of the exact value, so they differ by at most the sum of the two bounds. A chain of
// reductions adds its links' bounds (chain_gamma).
//
// Three kinds of check, each with its helper:
//   - a product or dot product whose operands the test holds: linear_bound / matmul_bound, elementwise
//     gamma(K) |x| |w|^T (the bound issue 20 asks for: K * eps * |x||w|);
//   - a composite computation: chain_bound(n, scale) = gamma(n) * scale for a short one, attention_bound for
//     attention, forward_bound for whole forwards (chain_gamma of forward_links, on head_scale: the largest
//     the head's dot products can be). First-order analysis: each reduction adds gamma(its length) relative
//     to the stream it reads, and every block's normalisation keeps an error relative to its stream instead
//     of compounding it;
//   - two paths that must be bitwise equal: at::equal, and the test says why.
// Bounds against fp64 references are left as their tests state them (their reference has no rounding).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "archspace/model/causal_lm.h"

namespace archspace::tolerance {

// fp32's unit roundoff: half the distance from 1 to the next float.
constexpr double kFp32Unit = 0x1p-24;

// n roundings in series (a sum of n terms in any order): Higham's gamma_n, the worst case.
inline double gamma_worst(int64_t n) {
  const double nu = static_cast<double>(n) * kFp32Unit;
  return nu / (1.0 - nu);
}

// The bound the tests use: the smaller of the worst case and Higham and Mary's probabilistic bound
// (SIAM J. Sci. Comput. 41(3), 2019, theorem 3.1): with rounding errors independent and of mean zero, a sum
// of n terms is within exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 (about lambda sqrt(n) u) of its terms'
// magnitudes with probability at least 1 - 2n exp(-lambda^2 (1 - u)^2 / 2). lambda = 10: below 1e-16 for
// n = 10^5 (a vocabulary), so no test run will see it fail; the worst case n u is reached only by
// adversarial data and is the smaller for n < lambda^2.
constexpr double kProbabilisticLambda = 10.0;
inline double gamma(int64_t n) {
  const double nd = static_cast<double>(n);
  const double probabilistic =
      std::expm1(kProbabilisticLambda * std::sqrt(nd) * kFp32Unit + nd * kFp32Unit * kFp32Unit / (1 - kFp32Unit));
  return std::min(gamma_worst(n), probabilistic);
}

// |fl(x W^T) - x W^T| <= gamma(K) (|x| |W|^T) for x [..., K], W [N, K]; in fp64, elementwise.
inline at::Tensor linear_bound(const at::Tensor& x, const at::Tensor& w) {
  return at::linear(x.to(at::kDouble).abs(), w.to(at::kDouble).abs()) * gamma(x.size(-1));
}

// The same for a @ b with a [..., M, K], b [..., K, N].
inline at::Tensor matmul_bound(const at::Tensor& a, const at::Tensor& b) {
  return at::matmul(a.to(at::kDouble).abs(), b.to(at::kDouble).abs()) * gamma(a.size(-1));
}

// A sum of n terms (or n roundings in series) on values of magnitude up to `scale`.
inline double chain_bound(int64_t n, double scale) { return gamma(n) * scale; }

// The largest magnitude of a tensor's values (a chain_bound's scale).
inline double magnitude(const at::Tensor& t) { return t.abs().max().item<double>(); }

// The links of the deepest chain of reductions in one forward over T positions, each a sum's length: per
// block the input norm (a mean of d squares), the q/k/v projections (d), the q/k norms (H h), the scores
// (h), softmax's sum and the weighted sum of values (keys each: the window on sliding layers, T on full
// ones), the output projection (H h), the MLP's norm (d), gate and up (d) and down (intermediate);
// Depth-Attention adds its scores (h), its softmax and its sum over the sources (layers + 1 each) and
// SiameseNorm a second stream's norm (d); then the final norm (d) and the head (d). 16 single roundings per
// block cover the elementwise steps (residual adds, RoPE, SwiGLU, the norms' scale and square root).
inline std::vector<int64_t> forward_links(const ModelConfig& c, int64_t T) {
  const int64_t d = c.hidden_size, Hh = c.num_attention_heads * c.head_dim;
  std::vector<int64_t> links = {d, d};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool sliding = l < static_cast<int64_t>(c.layer_types.size()) && c.layer_types[l] == LayerType::kSliding;
    const int64_t keys = sliding ? std::min(T, c.sliding_window) : T;
    for (int64_t n : {d, d, Hh, c.head_dim, keys, keys, Hh, d, d, c.intermediate_size}) links.push_back(n);
    links.insert(links.end(), 16, 1);
    if (c.variant == Variant::kSiameseDepth)
      for (int64_t n : {c.head_dim, c.num_hidden_layers + 1, c.num_hidden_layers + 1, d}) links.push_back(n);
  }
  return links;
}

// A chain's relative error: its links' bounds add (first order: each link's error is relative to the stream
// it reads, and every block's normalisation keeps it so instead of compounding it).
inline double chain_gamma(const std::vector<int64_t>& links) {
  double sum = 0;
  for (int64_t n : links) sum += gamma(n);
  return sum;
}

// The largest magnitude the head's dot products can reach: the final RMSNorm leaves ||h||_2 <= sqrt(d) max|g|
// (its input scaled to RMS 1, times its weight g), and sum_k |h_k W_vk| <= ||h||_2 ||W_v||_2 (Cauchy-Schwarz).
inline double head_scale(const CausalLM& m) {
  const at::Tensor g = m.parameter("model.norm.weight").to(at::kDouble);
  const at::Tensor w = m.parameter(m.config().tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  return std::sqrt(static_cast<double>(m.config().hidden_size)) * g.abs().max().item<double>() *
         w.to(at::kDouble).norm(2, {1}).max().item<double>();
}

// Two fp32 forwards of one model on the same T positions that differ only in summation order (a batch or a
// row alone, chunked prefill and cached decoding, another kernel): the final hidden state of each is within
// a normwise relative chain_gamma(forward_links) of the exact one, which reaches each logit through
// ||W_v||_2, so each logit is within chain_gamma(forward_links) head_scale of exact, the two within twice that.
inline double forward_bound(const CausalLM& m, int64_t T) {
  return 2 * chain_gamma(forward_links(m.config(), T)) * head_scale(m);
}

// Parameter gradients of a loss over `terms` predictions (summed into each weight's gradient), by two fp32
// computations on T positions: the backward runs the transposes of the forward's chain (twice its roundings)
// and sums over the terms; relative to the largest gradient entry, grad_scale (tests/python/tolerances.py's
// gradient_bound).
inline double gradient_bound(const ModelConfig& c, int64_t T, int64_t terms, double grad_scale) {
  return 2 * (2 * chain_gamma(forward_links(c, T)) + gamma(terms)) * grad_scale;
}

// Two fp32 computations of causal softmax(q k^T / sqrt(h)) v with at most `keys` keys per query (q [B, H, T,
// h], k and v [B, G, S, h]): the scores are within gamma(h + 1) S of exact (S the largest sum_d |q_d k_d| /
// sqrt(h)); a score error e moves a softmax weight by 2e relative (the subtracted maximum moves too), exp (1
// ulp), the normaliser's sum and the division add gamma(keys + 4); the weighted sum of values adds gamma(keys)
// relative to max|v|. The two computations differ by at most twice that.
inline double attention_bound(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t keys) {
  const int64_t h = q.size(-1), groups = q.size(1) / k.size(1);
  const at::Tensor kk = k.to(at::kDouble).abs().repeat_interleave(groups, 1);
  const double S = at::matmul(q.to(at::kDouble).abs(), kk.transpose(-1, -2)).max().item<double>() /
                   std::sqrt(static_cast<double>(h));
  const double weight_error = 2 * gamma(h + 1) * S + gamma(keys + 4);
  return 2 * (gamma(keys) + weight_error) * magnitude(v);
}

// log_softmax over V logits of two computations whose logits are within `logit_bound` of each other: each
// log-probability moves by at most twice that (its logit and the log-sum-exp), plus each side's own
// log-sum-exp roundings: gamma(V + 2) from the sum of exponentials and the log, 2 u |log p| from the subtractions.
inline double logprob_bound(double logit_bound, int64_t V, double max_abs_logprob) {
  return 2 * logit_bound + 2 * (gamma(V + 2) + 2 * kFp32Unit * max_abs_logprob);
}

namespace detail {
// ARCHSPACE_TOLERANCE_LOG=FILE: one line per check (test, worst |got - expected|, its bound, the ratio), so
// a run under each kernel path (scripts/kernel_paths.sh) shows how much of each bound the arithmetic used.
inline void log_check(double error, double bound, double ratio) {
  const char* path = std::getenv("ARCHSPACE_TOLERANCE_LOG");
  if (!path || !*path) return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s.%s\t%.3e\t%.3e\t%.4f\n", info ? info->test_suite_name() : "?", info ? info->name() : "?", error,
                 bound, ratio);
    std::fclose(f);
  }
}
}  // namespace detail

// |got - expected| <= bound elementwise (bound broadcasts: a tensor from linear_bound, or a number). The
// failure names the worst element: its index, both values, the bound there and the ratio.
inline ::testing::AssertionResult within(const at::Tensor& got, const at::Tensor& expected, const at::Tensor& bound) {
  if (got.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << got.sizes() << " vs " << expected.sizes();
  const at::Tensor g = got.to(at::kDouble), e = expected.to(at::kDouble);
  const at::Tensor b = bound.to(at::kDouble).expand_as(e);
  const at::Tensor error = (g - e).abs();
  if (!at::isfinite(g).all().item<bool>() || !at::isfinite(e).all().item<bool>())
    return ::testing::AssertionFailure() << "non-finite values";
  // The ratio error / bound; a zero bound admits only a zero error.
  const at::Tensor ratio = at::where(
      b > 0, error / b.clamp_min(1e-300),
      at::where(error > 0, at::full_like(error, std::numeric_limits<double>::infinity()), at::zeros_like(error)));
  const int64_t worst = ratio.flatten().argmax().item<int64_t>();
  const double r = ratio.flatten()[worst].item<double>();
  const double err = error.flatten()[worst].item<double>(), bnd = b.flatten()[worst].item<double>();
  detail::log_check(err, bnd, r);
  if (r <= 1.0) return ::testing::AssertionSuccess();
  std::ostringstream index;
  int64_t rest = worst;
  std::vector<int64_t> idx(e.dim());
  for (int64_t d = e.dim() - 1; d >= 0; --d) {
    idx[d] = rest % e.size(d);
    rest /= e.size(d);
  }
  for (size_t i = 0; i < idx.size(); ++i) index << (i ? "," : "") << idx[i];
  return ::testing::AssertionFailure() << "|got - expected| = " << err << " at [" << index.str() << "] (got "
                                       << g.flatten()[worst].item<double>() << ", expected "
                                       << e.flatten()[worst].item<double>() << ") exceeds the bound " << bnd
                                       << " (ratio " << r << ")";
}

inline ::testing::AssertionResult within(const at::Tensor& got, const at::Tensor& expected, double bound) {
  return within(got, expected, at::scalar_tensor(bound, at::kDouble));
}

}  // namespace archspace::tolerance
