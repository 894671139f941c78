// The fused training kernels (kernels/fused_training.h) on the CPU, through the arithmetic their CUDA launch shares
// (src/kernels/fused_training_math.h): each forward and backward against ATen's composite (the model's rms_norm,
// add_rms_norm, rms_norm_rope and SwiGLU with the kernels off) and against fp64, within the elementwise bound that
// tests/device/fused_training_checks.h derives (the device check holds the CUDA launch to the same checks at the
// 1B's shapes), then the model's loss and gradients with the kernels on.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../device/fused_training_checks.h"
#include "archspace/kernels/dispatch.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"

namespace archspace {
namespace {

namespace checks = fused_training_checks;

void expect_all_within(const std::vector<checks::Check>& results) {
  for (const checks::Check& c : results) {
    std::printf("%-52s worst %.3f of its bound, %5.1f%% bit-equal\n", c.name.c_str(), c.worst, 100 * c.equal);
    EXPECT_TRUE(c.pass()) << c.name << ": worst " << c.worst << " of its bound, " << 100 * c.equal
                          << "% bit-equal (at least " << 100 * c.min_equal << "% wanted)";
  }
}

const at::Device kCpu(at::kCPU);

TEST(FusedTraining, RmsNormForwardAndBackward) {
  at::manual_seed(1);
  expect_all_within(checks::rms_norm(kCpu, at::kFloat, 10, 256));
  expect_all_within(checks::rms_norm(kCpu, at::kBFloat16, 10, 256));
  expect_all_within(checks::rms_norm(kCpu, at::kBFloat16, 3, 7));     // rows narrower than a GPU block's threads
  expect_all_within(checks::rms_norm(kCpu, at::kBFloat16, 130, 64));  // more rows than one backward block's 64
}

// An fp32 stream with bf16 sublayer outputs (autocast), both bf16, both fp32.
TEST(FusedTraining, AddRmsNormForwardAndBackward) {
  at::manual_seed(2);
  expect_all_within(checks::add_rms_norm(kCpu, at::kFloat, at::kBFloat16, 12, 64));
  expect_all_within(checks::add_rms_norm(kCpu, at::kBFloat16, at::kBFloat16, 12, 64));
  expect_all_within(checks::add_rms_norm(kCpu, at::kFloat, at::kFloat, 12, 64));
}

TEST(FusedTraining, RmsNormRopeForwardAndBackward) {
  at::manual_seed(3);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const bool per_sequence : {false, true})
      expect_all_within(checks::rms_norm_rope(kCpu, dtype, 2, 5, 3, 16, per_sequence));
  }
}

TEST(FusedTraining, SwigluForwardAndBackward) {
  at::manual_seed(4);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const bool halves : {true, false}) expect_all_within(checks::swiglu(kCpu, dtype, 12, 40, halves));
  }
  // Strided gate/up rows give what their contiguous copies give.
  const at::Tensor both = at::randn({6, 80}).to(at::kBFloat16);
  const at::Tensor strided = fused_training::swiglu_forward(both.narrow(-1, 0, 40), both.narrow(-1, 40, 40));
  const at::Tensor copied =
      fused_training::swiglu_forward(both.narrow(-1, 0, 40).contiguous(), both.narrow(-1, 40, 40).contiguous());
  EXPECT_TRUE(at::equal(strided, copied));
}

// The bf16 bound is two ulps of an element (2 b with k = 1) plus the sums' share: an element off by four ulps
// (2^-5 of itself), as a wrong rotation sign or a missed rounding would leave it at least, fails it.
TEST(FusedTraining, TheBoundCatchesAnElementFourUlpsOff) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({4, 64}).to(at::kBFloat16), w = at::ones({64});
  const fused_training::NormResult r = fused_training::norm_forward(x, w, 1e-6);
  at::Tensor wrong = r.out.to(at::kFloat);
  wrong.view(-1)[5] *= 1 + 1.0 / 32;
  const at::Tensor magnitude = r.out.to(at::kDouble).abs();
  EXPECT_GT(checks::compare("moved", wrong, r.out, magnitude, checks::bound_factor(64, 1)).worst, 1.0);
}

TEST(FusedTraining, OffByDefaultAndRefusedWhereTheyDoNotApply) {
  EXPECT_FALSE(KernelChoices{}.fused);
  const at::Tensor x = at::randn({2, 3, 8}), w = at::ones({8});
  const at::Tensor trained = x.clone().requires_grad_(true);           // what training normalises (no inference kernel)
  EXPECT_EQ(rms_norm_kernel(trained, w, {}), Kernel::kAtenComposite);  // off
  EXPECT_EQ(rms_norm_kernel(trained, w, {/*fused=*/true}), Kernel::kFusedTrainingCpu);
  EXPECT_TRUE(fused_training_norm_applies(x, w));
  EXPECT_FALSE(fused_training_norm_applies(x.to(at::kDouble), w));                             // fp64: the composite
  EXPECT_FALSE(fused_training_norm_applies(x, at::ones({7})));                                 // width
  EXPECT_FALSE(fused_training_add_norm_applies(x.to(at::kBFloat16).to(at::kBFloat16), x, w));  // bf16 + fp32 -> fp32
  EXPECT_TRUE(fused_training_add_norm_applies(x, x.to(at::kBFloat16), w));
  EXPECT_FALSE(fused_training_norm_rope_applies(x, w, at::ones({3, 6}), at::ones({3, 6}), 6));  // 8 % 6
  EXPECT_FALSE(fused_training_swiglu_applies(x, x.to(at::kBFloat16)));
  EXPECT_THROW((void)fused_training::norm_forward(x, at::ones({7}), 1e-6), c10::Error);
}

// The model's loss and every parameter's gradient with the kernels on, from 4 initialisations of each variant.
// fp32: as accurate as the composite they replace. A whole model's error has no closed form here, so the bound is
// relative, norm-wise per tensor against an fp64 run of the same model: |fused - fp64| <= 2 |composite - fp64| +
// 2^-20 |fp64| (both errors come from the order of fp32 sums and are of one size; the factor 2 leaves room for
// their spread across tensors). bf16 autocast: both runs round the same values to bf16, and a rounding that flips
// between them moves a value by one bf16 unit (2^-8); the runs' gradients are asserted within 2^-4 of each other
// norm-wise per tensor (a missing or misrouted gradient path is off by the order of the gradient itself).
// Activation checkpointing changes the fused run no more than it changes the composite (base: not at all;
// siamese_depth: the order in which the embedding's two streams' gradients are summed), plus 2^-20 of the scale.
TEST(FusedTraining, ModelGradientsFollowTheComposite) {
  for (const Variant variant : {Variant::kBase, Variant::kSiameseDepth}) {
    for (const bool bf16 : {false, true}) {
      double worst = 0;
      for (const uint64_t seed : {3, 4, 5, 6}) {
        CausalLM model = CausalLM::random_init(preset("tiny", variant), seed);
        for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
        at::manual_seed(static_cast<int64_t>(seed));
        const at::Tensor ids = at::randint(512, {2, 16}, at::kLong), labels = at::randint(512, {2, 16}, at::kLong);
        auto pass = [&](bool fused, bool checkpointing, bool autocast, std::vector<at::Tensor>& out) {
          SequenceOptions options;
          options.activation_checkpointing = checkpointing;
          options.fused_kernels = fused;
          at::Tensor logits;
          {
            AutocastGuard guard(autocast, at::kCPU);
            logits = model.forward(ids, options);
          }
          at::Tensor loss = next_token_loss(logits, labels, 0).ce_sum;
          loss.backward();
          out.push_back(loss.detach().to(at::kDouble).reshape({1}));
          for (const auto& [name, p] : model.parameters()) {
            out.push_back(p.grad().to(at::kDouble));
            p.mutable_grad().reset();
          }
        };
        std::vector<at::Tensor> fused, fused_ckpt, composite, composite_ckpt, exact;
        pass(true, false, bf16, fused);
        pass(true, true, bf16, fused_ckpt);
        pass(false, false, bf16, composite);
        pass(false, true, bf16, composite_ckpt);
        for (const auto& [name, p] : model.parameters()) p.set_data(p.detach().to(at::kDouble));
        pass(false, false, false, exact);
        const double floor = 1.0 / (1 << 20);
        for (size_t i = 0; i < fused.size(); ++i) {
          const std::string what = std::string(variant == Variant::kBase ? "base" : "siamese_depth") +
                                   (bf16 ? " bf16" : " fp32") + " seed " + std::to_string(seed) + " tensor " +
                                   std::to_string(i) + " (0: the loss)";
          const double scale = exact[i].norm().item<double>();
          const double ckpt_change = (fused[i] - fused_ckpt[i]).norm().item<double>();
          const double composite_ckpt_change = (composite[i] - composite_ckpt[i]).norm().item<double>();
          if (variant == Variant::kBase) EXPECT_EQ(ckpt_change, 0.0) << what << " under checkpointing";
          EXPECT_LE(ckpt_change, composite_ckpt_change + floor * scale) << what << " under checkpointing";
          double share;
          if (bf16) {
            const double apart = (fused[i] - composite[i]).norm().item<double>();
            share = apart / (composite[i].norm().item<double>() / 16 + floor * scale);
          } else {
            const double fused_error = (fused[i] - exact[i]).norm().item<double>();
            const double composite_error = (composite[i] - exact[i]).norm().item<double>();
            share = fused_error / (2 * composite_error + floor * scale);
          }
          worst = std::max(worst, share);
          EXPECT_LE(share, 1.0) << what;
        }
      }
      std::printf("model %s %s: worst tensor at %.3f of its bound over 4 seeds\n",
                  variant == Variant::kBase ? "base" : "siamese_depth", bf16 ? "bf16" : "fp32", worst);
    }
  }
}

}  // namespace
}  // namespace archspace
