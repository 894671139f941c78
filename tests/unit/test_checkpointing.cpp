// Activation checkpointing per block (SequenceOptions::activation_checkpointing): the same logits and
// the same gradient for every parameter as the forward that keeps everything, for both blocks (base,
// SiameseNorm with Depth-Attention reading across blocks), sliding layers on all three attention paths,
// and under bf16 autocast (whose state the recomputation must restore).
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"

namespace archspace {
namespace {

struct Pass {
  at::Tensor logits;
  std::vector<at::Tensor> grads;
};

Pass forward_backward(const CausalLM& model, const at::Tensor& ids, const at::Tensor& labels, bool checkpointing,
                      bool autocast = false) {
  SequenceOptions options;
  options.activation_checkpointing = checkpointing;
  Pass run;
  {
    AutocastGuard guard(autocast, at::kCPU);
    run.logits = model.forward(ids, options);
  }
  const LossSums sums = next_token_loss(run.logits, labels, 1e-4);
  (sums.ce_sum + sums.z_sum).backward();
  for (const auto& [name, p] : model.parameters()) {
    run.grads.push_back(p.grad().clone());
    p.mutable_grad().reset();
  }
  return run;
}

ModelConfig config(Variant v) {
  ModelConfig c = preset("tiny", v);  // window 8; layers sliding, sliding, sliding, full
  c.depth_attention_stride = 2;       // sources read across several blocks
  c.depth_attention_recent_window = 1;
  return c;
}

// Largest |a - b| over all parameters' gradients, relative to the largest gradient entry.
double worst_relative(const Pass& a, const Pass& b, const CausalLM& model, std::string* where) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    scale = std::max(scale, a.grads[i].abs().max().item<double>());
    const double d = (a.grads[i] - b.grads[i]).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      *where = model.parameters()[i].first;
    }
  }
  return worst / scale;
}

// fp32 on the CPU: the recomputation is bit-identical, so the only possible difference is the order in
// which autograd sums the gradient of a tensor read by several blocks (Depth-Attention's source values):
// fp32 rounding, a few units in the last place (~1e-7 relative). Seen with LibTorch 2.11: 0 (bit-equal)
// for base, 6e-8 to 9e-8 for siamese_depth (the embedding's gradient, whose output feeds both streams).
// The bound 1e-6 relative fails on any wrong or missing gradient path.
TEST(ActivationCheckpointing, SameLogitsAndGradientsAsTheFullGraph) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    // T = 6, 12, 40 against window 8: plain causal, one [T, T] mask, masks per query block.
    for (int64_t T : {6, 12, 40}) {
      CausalLM model = CausalLM::random_init(config(v), 3);
      for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
      at::manual_seed(T);
      const at::Tensor ids = at::randint(512, {2, T}, at::kLong);
      const at::Tensor labels = at::randint(512, {2, T}, at::kLong);
      const Pass full = forward_backward(model, ids, labels, false);
      const Pass ckpt = forward_backward(model, ids, labels, true);
      EXPECT_TRUE(at::equal(full.logits, ckpt.logits)) << variant_name(v) << " T=" << T;
      std::string where;
      const double worst = worst_relative(full, ckpt, model, &where);
      std::printf("%s T=%ld: max gradient difference %.3g relative (%s)\n", variant_name(v), long(T), worst,
                  where.c_str());
      EXPECT_LE(worst, 1e-6) << variant_name(v) << " T=" << T << " at " << where;
    }
  }
}

// Every normalization topology (SPEC.md section 7) through the checkpointed block: its streams (x; X and Y;
// x and ResiDual's dual) go in and out of the checkpoint, with Depth-Attention on. Same bound as above.
TEST(ActivationCheckpointing, EveryTopologyHasTheFullGraphsGradients) {
  for (NormTopology t :
       {NormTopology::kPre, NormTopology::kPeri, NormTopology::kPost, NormTopology::kDeepNorm, NormTopology::kHybrid,
        NormTopology::kResidual, NormTopology::kSiameseHybridPre, NormTopology::kSiamesePostPre}) {
    ModelConfig c = config(Variant::kSiameseDepth);
    VariantSwitches switches;
    switches.norm_topology = t;
    switches.apply_to(c, "test");
    CausalLM model = CausalLM::random_init(c, 5);
    for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
    at::manual_seed(9);
    const at::Tensor ids = at::randint(512, {2, 12}, at::kLong);
    const at::Tensor labels = at::randint(512, {2, 12}, at::kLong);
    const Pass full = forward_backward(model, ids, labels, false);
    const Pass ckpt = forward_backward(model, ids, labels, true);
    EXPECT_TRUE(at::equal(full.logits, ckpt.logits)) << norm_topology_name(t);
    std::string where;
    const double worst = worst_relative(full, ckpt, model, &where);
    std::printf("%s: max gradient difference %.3g relative (%s)\n", norm_topology_name(t), worst, where.c_str());
    EXPECT_LE(worst, 1e-6) << norm_topology_name(t) << " at " << where;
  }
}

// Under CPU bf16 autocast the recomputation must run in bf16 as the forward did; were autocast not
// restored, backward would recompute in fp32 and the gradients would differ by bf16's 4e-3 (and had the
// block been given its input leaves directly, autocast's cast cache would sum q/k/v's gradients in bf16:
// seen 8e-3). Seen: 0 for base, 3.5e-8 for siamese_depth.
TEST(ActivationCheckpointing, RestoresAutocastForTheRecomputation) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    CausalLM model = CausalLM::random_init(config(v), 4);
    for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
    at::manual_seed(1);
    const at::Tensor ids = at::randint(512, {2, 20}, at::kLong);
    const at::Tensor labels = at::randint(512, {2, 20}, at::kLong);
    const Pass full = forward_backward(model, ids, labels, false, /*autocast=*/true);
    const Pass ckpt = forward_backward(model, ids, labels, true, /*autocast=*/true);
    EXPECT_EQ(full.logits.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(full.logits, ckpt.logits)) << variant_name(v);
    std::string where;
    const double worst = worst_relative(full, ckpt, model, &where);
    std::printf("%s bf16 autocast: max gradient difference %.3g relative (%s)\n", variant_name(v), worst,
                where.c_str());
    EXPECT_LE(worst, 1e-6) << variant_name(v) << " at " << where;
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
}

// Without grad (evaluation, generation) there is nothing to save: the flag is ignored, and the forward is
// the plain one (the checkpointed forward runs its blocks with grad on, whose kernels can differ in the
// last bit: seen for SDPA on the CPU, so equality here shows the flag was not acted on).
TEST(ActivationCheckpointing, IgnoredWithoutGrad) {
  CausalLM model = CausalLM::random_init(config(Variant::kSiameseDepth), 5);
  for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
  const at::Tensor ids = at::randint(512, {1, 10}, at::kLong);
  SequenceOptions options;
  options.activation_checkpointing = true;
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(model.forward(ids, options), model.forward(ids)));
}

}  // namespace
}  // namespace archspace
