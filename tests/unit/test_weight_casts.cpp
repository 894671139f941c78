// bf16 weights cast once per optimizer step (train/weight_casts.h): a step of several micro-batches through
// StepWeightCasts computes autocast's losses and gradients bit for bit, with and without activation
// checkpointing, while casting each matmul weight (and the head) once per step instead of once per
// micro-batch and recomputation.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"
#include "archspace/train/optimizer.h"
#include "archspace/train/weight_casts.h"
#include "test_support.h"

namespace archspace {
namespace {

struct StepResult {
  std::vector<double> losses;
  NamedTensors grads;
};

// One optimizer step's micro-batches (forward, chunked head loss, backward) under CPU bf16 autocast; the weights
// from `casts` when given (as the Trainer passes them), else the model's own fp32 tensors.
StepResult step(CausalLM& model, const std::vector<at::Tensor>& batches, bool checkpointing, StepWeightCasts* casts) {
  StepResult r;
  for (auto& [name, p] : model.parameters()) p.mutable_grad().reset();
  for (const at::Tensor& ids : batches) {
    SequenceOptions options;
    options.final_hidden_only = true;
    options.activation_checkpointing = checkpointing;
    options.parameters = casts;
    LossSums sums;
    {
      AutocastGuard autocast(true, at::kCPU);
      const at::Tensor hidden = model.forward(ids.narrow(1, 0, ids.size(1) - 1), options);
      sums = head_loss(hidden, model.head_weight(), ids.narrow(1, 1, ids.size(1) - 1), 1e-4, /*chunk_tokens=*/5,
                       casts ? casts->head_weight_cast() : at::Tensor());
    }
    const at::Tensor loss = sums.ce_sum + sums.z_sum;
    loss.backward();
    r.losses.push_back(loss.item<double>());
  }
  if (casts) casts->end_step();
  for (const auto& [name, p] : model.parameters()) r.grads.emplace_back(name, p.grad().clone());
  return r;
}

TEST(StepWeightCasts, OneCastPerWeightAndStepSameGradientsAsAutocast) {
  for (Variant variant : {Variant::kBase, Variant::kSiameseDepth}) {
    for (bool checkpointing : {false, true}) {
      CausalLM model = CausalLM::random_init(preset("tiny", variant), 3);
      for (auto& [name, p] : model.parameters()) p.requires_grad_(true);
      const int64_t V = model.config().vocab_size;
      std::vector<at::Tensor> batches;
      for (int m = 0; m < 3; ++m) batches.push_back(at::randint(V, {2, 13}, at::kLong));

      const StepResult reference = step(model, batches, checkpointing, nullptr);
      StepWeightCasts casts(model, at::kBFloat16);
      const StepResult sourced = step(model, batches, checkpointing, &casts);
      const std::string what =
          std::string(variant == Variant::kBase ? "base" : "siamese_depth") + (checkpointing ? ", checkpointing" : "");
      EXPECT_EQ(sourced.losses, reference.losses) << what;
      ASSERT_EQ(sourced.grads.size(), reference.grads.size());
      for (size_t i = 0; i < reference.grads.size(); ++i)
        EXPECT_TRUE(at::equal(sourced.grads[i].second, reference.grads[i].second))
            << what << ": " << reference.grads[i].first;

      // Once per matmul weight of the blocks and once for the head, whatever the micro-batches and recomputation.
      int64_t matmul_weights = 0;
      for (const auto& spec : parameter_specs(model.config()))
        matmul_weights += spec.kind == ParamKind::kLinear && spec.name.rfind("model.layers.", 0) == 0;
      EXPECT_EQ(casts.casts_made(), matmul_weights + 1) << what;
      step(model, batches, checkpointing, &casts);  // the next step casts again (the weights would have changed)
      EXPECT_EQ(casts.casts_made(), 2 * (matmul_weights + 1)) << what;
    }
  }
}

// kept_across_steps (the Trainer's unsharded runs): the optimizer's pass rewrites the copies, so the next step
// casts nothing and still computes autocast's losses and gradients bit for bit from the updated weights; a
// weight changed any other way (an in-place op bumps its version) is cast again, alone.
TEST(StepWeightCasts, KeptCopiesAreRewrittenByTheOptimizerNotCastAgain) {
  for (bool fused : {true, false}) {
    CausalLM model = CausalLM::random_init(preset("tiny"), 5);
    std::vector<AdamW::Group> groups;
    std::vector<at::Tensor> params;
    for (auto& [name, p] : model.parameters()) {
      p.requires_grad_(true);
      groups.push_back({name, p, true});
      params.push_back(p);
    }
    AdamW optimizer(groups, {0.9, 0.95, 1e-8, fused});
    const int64_t V = model.config().vocab_size;
    std::vector<at::Tensor> batches;
    for (int m = 0; m < 2; ++m) batches.push_back(at::randint(V, {2, 9}, at::kLong));
    StepWeightCasts casts(model, at::kBFloat16, /*kept_across_steps=*/true);
    step(model, batches, false, &casts);
    const int64_t first = casts.casts_made();
    const std::vector<at::Tensor> copies = casts.copies_for(params);
    int64_t with_copies = 0;
    for (const at::Tensor& c : copies) with_copies += c.defined();
    EXPECT_EQ(with_copies, first);  // one per matmul weight and the head
    optimizer.step(1e-2, 0.1, 0.7f, copies);
    casts.copies_written(params);

    const StepResult reference = step(model, batches, false, nullptr);
    const StepResult kept = step(model, batches, false, &casts);
    EXPECT_EQ(casts.casts_made(), first) << "fused " << fused;
    EXPECT_EQ(kept.losses, reference.losses) << "fused " << fused;
    for (size_t i = 0; i < reference.grads.size(); ++i)
      EXPECT_TRUE(at::equal(kept.grads[i].second, reference.grads[i].second)) << reference.grads[i].first;

    {
      c10::NoGradGuard no_grad;
      model.layers()[0].q_proj.add_(0.25);
    }
    const StepResult changed_reference = step(model, batches, false, nullptr);
    const StepResult changed = step(model, batches, false, &casts);
    EXPECT_EQ(casts.casts_made(), first + 1) << "fused " << fused;
    EXPECT_EQ(changed.losses, changed_reference.losses) << "fused " << fused;
    EXPECT_NE(changed.losses, kept.losses);
  }
}

TEST(StepWeightCasts, WithoutGradTheCastsAreNotKept) {
  CausalLM model = CausalLM::random_init(preset("tiny"), 3);
  for (auto& [name, p] : model.parameters()) p.requires_grad_(true);
  StepWeightCasts casts(model, at::kBFloat16);
  {
    c10::NoGradGuard no_grad;
    casts.block(0);
  }
  EXPECT_EQ(casts.casts_made(), 0);
  // A cast made with grad keeps its path to the fp32 leaf.
  const BlockWeights w = casts.block(0);
  EXPECT_EQ(w.q_proj.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(w.q_proj.requires_grad());
  EXPECT_EQ(w.input_layernorm.defined() ? w.input_layernorm.scalar_type() : at::kFloat, at::kFloat);
  EXPECT_TRUE(casts.block(0).q_proj.is_same(w.q_proj));
}

}  // namespace
}  // namespace archspace
