// Perplexity with the strided sliding-window method (as in transformers' "Perplexity of fixed-length
// models"): windows of `context` tokens starting every `stride` tokens; each window scores only the
// tokens not scored by an earlier window, with the rest of the window as context. stride == context
// gives disjoint windows. PPL = exp(sum of NLL / number of scored tokens), exactly (no per-window
// averaging); the very first token has no context and is never scored.
#pragma once

#include <functional>
#include <vector>

#include "archspace/config/train_config.h"
#include "archspace/model/causal_lm.h"

namespace archspace {

struct PerplexityOptions {
  int64_t context = 0;                           // 0: min(max_position_embeddings, 4096)
  int64_t stride = 0;                            // 0: context
  int64_t head_chunk = kDefaultLossChunkTokens;  // positions per output-head matmul (model/loss.h label_logprobs)
};

struct PerplexityResult {
  double nll_sum = 0;
  int64_t scored_tokens = 0;
  int64_t windows = 0;
  int64_t context = 0, stride = 0;
  double perplexity() const;
};

PerplexityResult perplexity(const CausalLM& model, const std::vector<int64_t>& tokens, const PerplexityOptions& options,
                            const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

}  // namespace archspace
