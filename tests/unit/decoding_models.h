// The model incremental-decoding tests share: the tiny preset with 7 layers [S, S, S, F, S, S, S] (window 8,
// GQA 4/2), Depth-Attention every 2 layers, YaRN on the full layer, and weights perturbed away from their
// init (norms away from 1, larger matrices) so that a wrong cached key, position or mask shows in the logits.
#pragma once

#include "archspace/model/causal_lm.h"

namespace archspace::testing {

inline ModelConfig decoding_config(Variant v) {
  ModelConfig c = preset("tiny", v);
  c.num_hidden_layers = 7;
  c.layer_types = default_layer_types(7);
  c.depth_attention_stride = 2;
  c.depth_attention_recent_window = 1;
  c.rope_scaling = YarnScaling{4.0, 16, 32.0, 1.0, std::nullopt};
  return c;
}

inline CausalLM perturbed_model(const ModelConfig& c, uint64_t seed) {
  CausalLM m = CausalLM::random_init(c, seed);
  at::manual_seed(seed);
  NamedTensors p;
  for (const auto& [n, t] : m.parameters()) p.emplace_back(n, t.dim() == 1 ? t + 0.2 * at::randn_like(t) : t * 4);
  return CausalLM(c, p);
}

}  // namespace archspace::testing
