// model/loss: the chunked head + cross-entropy + z-loss (head_loss) against the unchunked form (the head's
// linear, then next_token_loss) in value and gradients, fp32 and bf16 autocast, with SFT masks and z-loss,
// on a whole model of each variant with gradient accumulation; its hand-written backward against fp64
// central differences; label_logprobs (eval ppl, scoring) against log_softmax of the full logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "archspace/eval/perplexity.h"
#include "archspace/kernels/bf16_gemm.h"
#include "archspace/kernels/linear.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"
#include "test_support.h"

namespace archspace {
namespace {

// max |a - b| / max |b|: the normwise relative difference the bounds below are stated in.
double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         b.to(at::kDouble).abs().max().item<double>();
}

// Labels over [N]: random ids with every third row and a run of rows masked (SFT), -100 where masked.
at::Tensor masked_labels(int64_t N, int64_t V) {
  at::Tensor labels = at::randint(V, {N}, at::kLong);
  for (int64_t i = 0; i < N; i += 3) labels[i] = kIgnoreIndex;
  for (int64_t i = N / 2; i < std::min(N, N / 2 + 9); ++i) labels[i] = kIgnoreIndex;  // a wholly masked chunk
  return labels;
}

struct Result {
  double ce, z;
  int64_t count;
  at::Tensor grad_h, grad_w;
};

// head_loss on leaves h and w, backward of ce_scale * ce + z_scale * z (different scales, so each output's
// gradient is checked for itself). `pad`: head_loss's pad_rows_to (1: the CPU's default, no padding; larger: the
// padded matmuls CUDA runs, through the same ATen ops, here on the CPU).
Result run(const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& labels, double z_coeff, int64_t chunk,
           bool autocast = false, double ce_scale = 0.5, double z_scale = 1.5, int64_t pad = 1) {
  at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  LossSums s;
  {
    AutocastGuard guard(autocast, at::kCPU);
    s = head_loss(h, w, labels, z_coeff, chunk, {}, pad);
  }
  (s.ce_sum * ce_scale + s.z_sum * z_scale).backward();
  return {s.ce_sum.item<double>(), s.z_sum.item<double>(), s.count, h.grad(), w.grad()};
}

// fp32: both forms compute every logit as the same dot product and each row's log-sum-exp and gradient
// row by the same formulas (on the CPU the chunked form through kernels/cross_entropy_rows: its exp within
// 2^-22 of exp, its sums in fp32 blocks of 32 terms joined in fp64; CrossEntropyRows bounds it against
// fp64), so the values differ only where a kernel rounds or sums in another order: a GEMM of
// another row count (M = 1..7 takes other MKL kernels than M = N), the weight gradient's sum over rows
// split into chunks, autograd's order of adding the two outputs' gradients. 1e-6 relative to the largest
// entry is the bound: 16 units of fp32's 2^-24, for sums of at most 211 terms here. Seen: losses
// bit-equal for chunks of 32 and more (the same per-row values in the same final sum), within 1.5e-7 for
// chunks of 1 and 7; gradients 0 to 3.3e-7, 6.7e-7 at chunk 1 (grad_h through M = 1 GEMMs, the worst case).
// The same bounds with the head padded to 256 rows (CUDA's padded matmuls): the padded ids add exact zeros to
// no sum of a real id, so only the kernels' order can differ.
TEST(HeadLoss, ChunkedEqualsUnchunkedFp32WithMasksAndZLoss) {
  at::manual_seed(3);
  const int64_t B = 2, T = 49, D = 24, V = 211, N = B * T;
  const at::Tensor h = at::randn({B, T, D}), w = at::randn({V, D}) * 0.3;
  const at::Tensor labels = masked_labels(N, V).view({B, T});
  const Result ref = run(h, w, labels, 1e-2, 0);
  EXPECT_EQ(ref.count, (labels != kIgnoreIndex).sum().item<int64_t>());
  for (int64_t pad : {int64_t{1}, int64_t{128}}) {
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{32}, N - 1}) {
      const Result got = run(h, w, labels, 1e-2, chunk, false, 0.5, 1.5, pad);
      std::printf("pad %ld chunk %ld: ce %+.3g z %+.3g relative, grad_h %.3g grad_w %.3g\n", long(pad), long(chunk),
                  (got.ce - ref.ce) / ref.ce, (got.z - ref.z) / ref.z, relative(got.grad_h, ref.grad_h),
                  relative(got.grad_w, ref.grad_w));
      const std::string what = "pad " + std::to_string(pad) + " chunk " + std::to_string(chunk);
      EXPECT_EQ(got.count, ref.count);
      EXPECT_NEAR(got.ce, ref.ce, 1e-6 * std::abs(ref.ce)) << what;
      EXPECT_NEAR(got.z, ref.z, 1e-6 * std::abs(ref.z)) << what;
      EXPECT_LE(relative(got.grad_h, ref.grad_h), 1e-6) << what;
      EXPECT_LE(relative(got.grad_w, ref.grad_w), 1e-6) << what;
      ASSERT_EQ(got.grad_w.sizes(), w.sizes()) << what;  // the padded rows are not the weight's
      EXPECT_TRUE(got.grad_w.is_contiguous()) << what;
      // Masked rows get no gradient at all.
      const at::Tensor masked = (labels == kIgnoreIndex).view({B, T});
      EXPECT_EQ(got.grad_h.index({masked}).abs().max().item<float>(), 0.0f);
    }
  }
  // Against PyTorch's own cross-entropy (sum over labelled rows, ignore_index -100) on the fp32 logits.
  const at::Tensor logits = at::linear(h, w).view({N, V});
  const double ce =
      at::cross_entropy_loss(logits, labels.view({N}), {}, at::Reduction::Sum, kIgnoreIndex).item<double>();
  EXPECT_NEAR(run(h, w, labels, 1e-2, 7).ce, ce, 1e-6 * ce);
}

// No labelled row at all: zero sums, zero gradients (not NaN).
TEST(HeadLoss, NoLabelledRowGivesZeros) {
  const at::Tensor h = at::randn({40, 8}), w = at::randn({50, 8});
  for (int64_t pad : {int64_t{1}, int64_t{64}}) {
    const Result got = run(h, w, at::full({40}, kIgnoreIndex, at::kLong), 1e-4, 6, false, 0.5, 1.5, pad);
    EXPECT_EQ(got.count, 0);
    EXPECT_EQ(got.ce, 0);
    EXPECT_EQ(got.z, 0);
    EXPECT_EQ(got.grad_h.abs().max().item<float>(), 0.0f);
    ASSERT_EQ(got.grad_w.sizes(), w.sizes());
    EXPECT_EQ(got.grad_w.abs().max().item<float>(), 0.0f);
  }
}

TEST(HeadLoss, RejectsANonPositivePadding) {
  const at::Tensor h = at::randn({4, 8}), w = at::randn({5, 8});
  testing::expect_error([&] { head_loss(h, w, at::zeros({4}, at::kLong), 0, 2, {}, 0); }, {"pad_rows_to", "0"});
}

// The hand-written backward in fp64 against central differences of the forward itself: with step e the
// difference quotient is within e^2/6 |f'''| of the derivative, plus the forward's rounding (about 1e-16
// |f|) / e; e = 1e-5 makes both ~1e-11 against derivatives of order 1e-2..1, so 1e-7 relative is loose and
// still catches any wrong term (a missing z-loss term or softmax factor is off by > 1%).
TEST(HeadLoss, BackwardMatchesFiniteDifferencesInFp64) {
  at::manual_seed(5);
  const int64_t N = 11, D = 4, V = 9, chunk = 3;
  const at::Tensor h = at::randn({N, D}, at::kDouble), w = at::randn({V, D}, at::kDouble);
  at::Tensor labels = at::randint(V, {N}, at::kLong);
  labels[2] = kIgnoreIndex;
  labels[7] = kIgnoreIndex;
  const double z_coeff = 0.1, ce_scale = 0.5, z_scale = 1.5;
  for (int64_t pad : {int64_t{1}, int64_t{16}}) {  // 16: the padded matmuls, 7 zero rows
    auto f = [&](const at::Tensor& hh, const at::Tensor& ww) {
      const LossSums s = head_loss(hh, ww, labels, z_coeff, chunk, {}, pad);
      return ce_scale * s.ce_sum.item<double>() + z_scale * s.z_sum.item<double>();
    };
    const Result got = run(h, w, labels, z_coeff, chunk, false, ce_scale, z_scale, pad);
    ASSERT_EQ(got.grad_h.scalar_type(), at::kDouble);
    const double e = 1e-5;
    auto check = [&](const at::Tensor& x, const at::Tensor& grad, bool is_h) {
      double worst = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        at::Tensor plus = x.clone(), minus = x.clone();
        plus.view({-1})[i] += e;
        minus.view({-1})[i] -= e;
        const double fd = is_h ? (f(plus, w) - f(minus, w)) / (2 * e) : (f(h, plus) - f(h, minus)) / (2 * e);
        worst = std::max(worst, std::abs(fd - grad.view({-1})[i].item<double>()));
      }
      return worst / grad.abs().max().item<double>();
    };
    EXPECT_LE(check(h, got.grad_h, true), 1e-7) << "pad " << pad;
    EXPECT_LE(check(w, got.grad_w, false), 1e-7) << "pad " << pad;
  }
}

// bf16 autocast: both forms round h and W to bf16 and multiply them in bf16 (fp32 accumulation), the
// logits rounded to bf16 and then fp32. The losses read the same bf16 logits. The gradients: each side
// rounds the logits' gradient to bf16 (relative 2^-8) and at most rounds its products to bf16 (2^-8; the
// chunked weight gradient sums its bf16 x bf16 products in fp32 on CPUs with AMX, kernels/bf16_gemm.h, else
// rounds once per chunk and sums in fp32), so each is within 2 x 2^-8 of the
// exact product of the gradient with the bf16 operands, elementwise relative to the product of magnitudes,
// and the two within 4 x 2^-8 of each other. Also: bf16 differs from fp32 (autocast did apply).
TEST(HeadLoss, ChunkedEqualsUnchunkedUnderBf16Autocast) {
  at::manual_seed(7);
  const int64_t N = 90, D = 32, V = 301;
  const at::Tensor h = at::randn({N, D}), w = at::randn({V, D}) * 0.2;
  const at::Tensor labels = masked_labels(N, V);
  const Result ref = run(h, w, labels, 1e-2, 0, true);
  const Result fp32 = run(h, w, labels, 1e-2, 0, false);
  EXPECT_NE(ref.ce, fp32.ce);
  // The logits' gradient magnitudes, from the fp32 run: |dL/dlogits| <= ce_scale + z_scale 2 coeff |lse| per
  // row's softmax, bounded here by recomputing it in fp64.
  const at::Tensor logits = at::linear(h.to(at::kDouble), w.to(at::kDouble));
  const at::Tensor lse = logits.logsumexp(-1, true), p = (logits - lse).exp();
  const at::Tensor valid = (labels != kIgnoreIndex).to(at::kDouble).unsqueeze(1);
  const at::Tensor dl =
      (p * (0.5 + 1.5 * 2e-2 * lse.abs()) + at::one_hot(labels.clamp_min(0), V).to(at::kDouble) * 0.5) * valid;
  const double u = 0x1p-8;
  const at::Tensor bound_h = 4 * u * at::matmul(dl, w.to(at::kDouble).abs()) + 1e-30;
  const at::Tensor bound_w = 4 * u * at::matmul(dl.t(), h.to(at::kDouble).abs()) + 1e-30;
  // Both ways to the weight gradient, whichever this CPU takes (AMX's fp32 sums or the bf16 product and a cast).
  for (bool fp32_sums : {false, true}) {
    if (fp32_sums && !has_fp32_output_bf16_gemm()) continue;
    ScopedFp32OutputBf16GemmChoice choice(fp32_sums);
    for (auto [chunk, pad] : {std::pair<int64_t, int64_t>{7, 1}, {64, 1}, {7, 128}, {64, 128}}) {
      const Result got = run(h, w, labels, 1e-2, chunk, true, 0.5, 1.5, pad);
      const std::string what =
          std::to_string(chunk) + " pad " + std::to_string(pad) + (fp32_sums ? " fp32 sums" : " bf16 products");
      EXPECT_NEAR(got.ce, ref.ce, 1e-6 * std::abs(ref.ce)) << what;
      EXPECT_NEAR(got.z, ref.z, 1e-6 * std::abs(ref.z)) << what;
      EXPECT_EQ(got.grad_h.scalar_type(), at::kFloat);
      EXPECT_TRUE(((got.grad_h - ref.grad_h).abs().to(at::kDouble) <= bound_h).all().item<bool>()) << what;
      EXPECT_TRUE(((got.grad_w - ref.grad_w).abs().to(at::kDouble) <= bound_w).all().item<bool>()) << what;
      std::printf("bf16 chunk %s: grad_h %.3g grad_w %.3g relative (bf16 unit 3.9e-3)\n", what.c_str(),
                  relative(got.grad_h, ref.grad_h), relative(got.grad_w, ref.grad_w));
    }
  }
}

// A whole model of each variant, as the Trainer runs it (final hidden states through head_loss, SFT masks,
// z-loss, two micro-batches accumulating into the same gradients, each normalised by the total labelled
// count): every parameter's gradient from the chunked loss equals the unchunked one's within 1e-6 of the
// largest (the reasons of the fp32 test above; the blocks' backward is the same on both sides).
TEST(HeadLoss, WholeModelGradientsWithAccumulationMatchBothVariants) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    at::manual_seed(9);
    const ModelConfig c = preset("tiny", v);
    CausalLM model = CausalLM::random_init(c, 2);
    for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
    const int64_t B = 2, T = 24;
    std::vector<at::Tensor> ids, labels;
    int64_t labelled = 0;
    for (int m = 0; m < 2; ++m) {
      ids.push_back(at::randint(c.vocab_size, {B, T}, at::kLong));
      labels.push_back(masked_labels(B * T, c.vocab_size).view({B, T}));
      labelled += (labels.back() != kIgnoreIndex).sum().item<int64_t>();
    }
    auto grads = [&](int64_t chunk, double* loss) {
      *loss = 0;
      for (int m = 0; m < 2; ++m) {
        SequenceOptions o;
        o.final_hidden_only = true;
        const LossSums s = head_loss(model.forward(ids[m], o), model.head_weight(), labels[m], 1e-3, chunk);
        at::Tensor l = (s.ce_sum + s.z_sum) / static_cast<double>(labelled);
        l.backward();
        *loss += l.item<double>();
      }
      std::vector<at::Tensor> out;
      for (const auto& [name, p] : model.parameters()) {
        out.push_back(p.grad().clone());
        p.mutable_grad().reset();
      }
      return out;
    };
    double loss0 = 0, loss1 = 0;
    const auto ref = grads(0, &loss0), got = grads(10, &loss1);
    EXPECT_NEAR(loss1, loss0, 1e-6 * loss0) << variant_name(v);
    double scale = 0, worst = 0;
    std::string where;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, ref[i].abs().max().item<double>());
      const double d = (got[i] - ref[i]).abs().max().item<double>();
      if (d > worst) {
        worst = d;
        where = model.parameters()[i].first;
      }
    }
    std::printf("%s: largest gradient difference %.3g of the largest gradient (%s)\n", variant_name(v), worst / scale,
                where.c_str());
    EXPECT_LE(worst / scale, 1e-6) << variant_name(v) << " " << where;
  }
}

// label_logprobs: the label's entry of log_softmax(h W^T) row by row, for any chunk size; rows without a
// label give 0, and the visitor sees every chunk's full log-probabilities once, in order. The head runs
// on each chunk's rows (another row count than the full matmul: the streaming kernel for <= 32 rows), so
// values agree within fp32 rounding of the D-term dot products and log_softmax, 1e-5 absolute here.
TEST(LabelLogprobs, EqualsLogSoftmaxOfTheFullLogits) {
  at::manual_seed(13);
  const int64_t N = 45, D = 16, V = 123;
  const at::Tensor h = at::randn({N, D}), w = at::randn({V, D}) * 0.3;
  at::Tensor labels = at::randint(V, {N}, at::kLong);
  labels[4] = -1;
  const at::Tensor full = at::log_softmax(at::linear(h, w), -1);
  const at::Tensor expected = full.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1).masked_fill(labels < 0, 0);
  for (int64_t chunk : {1, 8, 40, 1000}) {
    int64_t next = 0;
    const at::Tensor got = label_logprobs(h, w, labels, chunk, [&](int64_t first, const at::Tensor& lp) {
      EXPECT_EQ(first, next);
      EXPECT_EQ(lp.size(1), V);
      EXPECT_TRUE(at::allclose(lp, full.narrow(0, first, lp.size(0)), 0, 1e-5));
      next += lp.size(0);
    });
    EXPECT_EQ(next, N);
    EXPECT_TRUE(at::allclose(got, expected, 0, 1e-5)) << chunk;
    EXPECT_EQ(got[4].item<float>(), 0.0f);
  }
  testing::expect_error([&] { label_logprobs(h, w, labels, 0); }, {"chunk", "0"});
  testing::expect_error([&] { head_loss(h, w, labels.narrow(0, 0, 3), 0, 4); }, {"3 labels", "45 rows"});
  testing::expect_error([&] { label_logprobs(h, w, labels, 8, nullptr, 0); }, {"pad_rows_to", "0"});
}

// With the head padded (CUDA's default, 128 rows; forced here through the same ATen calls): the same values as
// the unpadded head within the bound above (the padded rows add no term to a real id's logit, and the
// log-softmax reads only the first V columns), the visitor sees V columns, fp32 and bf16 weights. Seen: 4.8e-7
// apart in fp32, equal in bf16.
TEST(LabelLogprobs, PaddedHeadGivesTheUnpaddedValues) {
  at::manual_seed(14);
  const int64_t N = 45, D = 16, V = 123;
  const at::Tensor h = at::randn({N, D}), w = at::randn({V, D}) * 0.3;
  const at::Tensor labels = at::randint(V, {N}, at::kLong);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor hd = h.to(dtype), wd = w.to(dtype);
    for (int64_t chunk : {1, 8, 1000}) {
      const at::Tensor plain = label_logprobs(hd, wd, labels, chunk, nullptr, 1);
      int64_t columns = 0;
      const at::Tensor padded = label_logprobs(
          hd, wd, labels, chunk, [&](int64_t, const at::Tensor& lp) { columns = lp.size(1); }, 128);
      EXPECT_EQ(columns, V);
      std::printf("%s chunk %ld: largest difference %.3g\n", c10::toString(dtype), long(chunk),
                  (padded - plain).abs().max().item<double>());
      // bf16: the logits are the head's bf16 products in both (rounded once to 2^-8 of their size, up to ~6
      // here), so a GEMM summing in another order may round a logit one bf16 step apart: 0.05 absolute.
      EXPECT_TRUE(at::allclose(padded, plain, 0, dtype == at::kFloat ? 1e-5 : 5e-2)) << dtype << " chunk " << chunk;
    }
  }
}

// eval ppl through label_logprobs equals the same windows scored from the model's full logits
// (log_softmax of model.forward, as perplexity() computed it before the head was chunked), chunk sizes
// 1..context, both variants: within fp32 rounding of the summed log-probabilities.
TEST(LabelLogprobs, PerplexityEqualsTheFullLogitsValues) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    at::manual_seed(17);
    const ModelConfig c = preset("tiny", v);
    const CausalLM model = CausalLM::random_init(c, 4);
    std::vector<int64_t> tokens;
    const at::Tensor t = at::randint(c.vocab_size, {70}, at::kLong);
    for (int64_t i = 0; i < 70; ++i) tokens.push_back(t[i].item<int64_t>());
    PerplexityOptions o;
    o.context = 32;
    o.stride = 20;
    // The reference: the same windows, every scored token's log-probability from the full logits.
    double nll = 0;
    int64_t scored = 0, prev_end = 0;
    for (int64_t begin = 0; begin < 70; begin += o.stride) {
      const int64_t end = std::min<int64_t>(begin + o.context, 70), len = end - begin;
      const at::Tensor ids = t.narrow(0, begin, len).unsqueeze(0);
      const at::Tensor lp = at::log_softmax(model.forward(ids)[0].to(at::kFloat), -1);
      for (int64_t i = std::max<int64_t>(1, len - (end - prev_end)); i < len; ++i) {
        nll -= lp[i - 1][ids[0][i].item<int64_t>()].item<double>();
        ++scored;
      }
      prev_end = end;
      if (end == 70) break;
    }
    for (int64_t chunk : {1, 5, 32}) {
      o.head_chunk = chunk;
      const PerplexityResult r = perplexity(model, tokens, o);
      EXPECT_EQ(r.scored_tokens, scored);
      EXPECT_NEAR(r.nll_sum, nll, 1e-5 * nll) << variant_name(v) << " chunk " << chunk;
    }
  }
}

}  // namespace
}  // namespace archspace
