#include "archspace/eval/perplexity.h"

#include <c10/core/InferenceMode.h>

#include <cmath>

#include "archspace/model/loss.h"
#include "archspace/util/error.h"

namespace archspace {

double PerplexityResult::perplexity() const { return std::exp(nll_sum / static_cast<double>(scored_tokens)); }

PerplexityResult perplexity(const CausalLM& model, const std::vector<int64_t>& tokens, const PerplexityOptions& o,
                            const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  PerplexityResult r;
  // A window of one token scores nothing (its only token has no context).
  if (o.context < 0 || o.context == 1)
    throw Error("eval ppl: --context must be at least 2 (got " + std::to_string(o.context) + ")");
  if (o.stride < 0) throw Error("eval ppl: --stride must be at least 1 (got " + std::to_string(o.stride) + ")");
  r.context = o.context > 0 ? o.context : std::min<int64_t>(c.max_position_embeddings, 4096);
  r.stride = o.stride > 0 ? o.stride : r.context;
  if (r.context > c.max_position_embeddings) {
    throw Error("eval ppl: --context " + std::to_string(r.context) + " exceeds the model's max_position_embeddings " +
                std::to_string(c.max_position_embeddings));
  }
  if (r.stride > r.context) throw Error("eval ppl: --stride must not exceed --context");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) throw Error("eval ppl: need at least 2 tokens, got " + std::to_string(n));
  for (int64_t t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      throw Error("eval ppl: token id " + std::to_string(t) + " is out of the model's vocabulary");
  }
  c10::InferenceMode inference;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += r.stride) {
    const int64_t end = std::min(begin + r.context, n), len = end - begin;
    const int64_t new_tokens = end - prev_end;  // scored in this window: positions [end - new_tokens, end)
    at::Tensor ids =
        at::tensor(std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + end), at::kLong).unsqueeze(0);
    SequenceOptions forward;
    forward.final_hidden_only = true;
    const at::Tensor hidden = model.forward(ids, forward)[0];  // [len, d]
    // Position i predicts token i + 1; score targets at window positions max(1, len - new_tokens) .. len - 1,
    // through the head only there and a chunk at a time (no [len, V] logits).
    const int64_t first_target = std::max<int64_t>(1, len - new_tokens);
    if (first_target < len) {
      const at::Tensor targets = ids[0].narrow(0, first_target, len - first_target);
      const at::Tensor lp = label_logprobs(hidden.narrow(0, first_target - 1, len - first_target), model.head_weight(),
                                           targets, o.head_chunk);
      r.nll_sum -= lp.sum().item<double>();
      r.scored_tokens += len - first_target;
    }
    ++r.windows;
    prev_end = end;
    if (progress) progress(end, n);
    if (end == n) break;
  }
  return r;
}

}  // namespace archspace
