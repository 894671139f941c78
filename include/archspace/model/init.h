// A model trained from scratch, initialised as a field trainer does it (model.init, config/recipe.h InitScheme):
//   olmo-core  OLMo-core 3.0's InitMethod.normal, which its OLMo 3 configs use (olmo_core/nn/transformer/init.py):
//              the embedding and every linear layer (q/k/v/o, gate/up/down, the LM head) truncated normal with std
//              0.02 cut at +-3 std (the config's truncated_normal_factor), norms 1: CausalLM::random_init, SPEC.md's.
//   megatron   Megatron-Core's defaults (megatron/core/utils.py init_method_normal and scaled_init_method_normal, as
//              TransformerConfig applies them): normal with std 0.02, not truncated, and the output projections of
//              each sublayer (o_proj, down_proj) at 0.02 / sqrt(2 x layers); norms 1.
// Parameters with an init scale of their own (DeepNorm's beta) keep it under both.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "archspace/config/recipe.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/parameters.h"

namespace archspace {

CausalLM initialised_model(const ModelConfig& config, uint64_t seed, InitScheme scheme,
                           at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU);

// The loop every initialisation shares: the parameters of `config` in order, from one CPU generator seeded with
// `seed`; norms 1, every other tensor an fp32 tensor of its shape that `fill` draws into, then multiplied by its
// spec's init_scale; each cast to `dtype` on `device`.
using InitFill = std::function<void(at::Tensor& t, const ParamSpec& spec, at::Generator& gen)>;
CausalLM model_from_draws(const ModelConfig& config, uint64_t seed, at::ScalarType dtype, at::Device device,
                          const InitFill& fill);

}  // namespace archspace
