// The SiameseNorm paper's analyses (sections 5.1-5.3) as one pass over held-out tokens, for any model the
// engine runs (both variants, any normalization topology, with or without Depth-Attention):
//   - hidden-state norms per layer of each residual stream (one stream "hidden", or SiameseNorm's X and Y),
//   - layer pruning: the loss increase when one block at a time is removed (its streams pass unchanged, and
//     it is no longer a Depth-Attention source),
//   - the logit lens per stream: each stream read through its final norm(s) and the output head; how often
//     its most likely token is the model's (overall, and where the two streams disagree),
//   - input intensity of each stream into each sublayer (estimated from the norm weights and the measured
//     RMS of the un-normalised stream), the final fusion weights, every norm weight's magnitude,
//   - Depth-Attention's mixing weight per source layer.
// Returns one JSON object (archspace analyze writes it and plots it; docs/analysis.md documents the keys).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "archspace/model/causal_lm.h"

namespace archspace {

struct AnalyzeOptions {
  int64_t head_chunk = 512;  // positions per output-head matmul (logit-lens and losses)
};

// tokens: [N, T] int64 held-out sequences. progress(done, total) counts forwards (1 + one per layer).
nlohmann::json analyze_model(const CausalLM& model, const at::Tensor& tokens, const AnalyzeOptions& options = {},
                             const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace archspace
