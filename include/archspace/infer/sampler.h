// The engine's one sampler: how a sequence picks its next token from its logits. `generate`, `serve` and the
// generation tasks of `eval` all sample through it, so a request's tokens follow from its prompt, its sampling
// settings and its seed alone, whatever else decodes beside it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace archspace {

// Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-39 overflows to inf.
inline constexpr double kGreedyTemperature = 1e-5;

struct SamplingOptions {
  double temperature = 0.0;  // 0 (or below kGreedyTemperature): greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off; else drop tokens below min_p x the most likely one's probability
  // vLLM's penalties (neutral values: off). repetition: transformers' RepetitionPenaltyLogitsProcessor over
  // the prompt and the output; presence/frequency: OpenAI's, logit -= presence x [count > 0] + frequency x
  // count, counts over the output.
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0, frequency_penalty = 0.0;
  uint64_t seed = 0;  // seeds the sequence's own generator (RowSampler)
};

// One sequence's token history for the penalties of SamplingOptions; empty (and free) when none is active.
class Penalties {
 public:
  Penalties() = default;
  Penalties(const SamplingOptions& options, const std::vector<uint32_t>& prompt, int64_t vocab);
  bool active() const { return seen_.defined(); }
  void add(int64_t id);  // a generated token
  // The penalised logits [V] (a new tensor; `logits` itself when none is active).
  at::Tensor apply(const at::Tensor& logits) const;

 private:
  double repetition_ = 1.0, presence_ = 0.0, frequency_ = 0.0;
  at::Tensor seen_;    // [V] bool: in the prompt or the output
  at::Tensor counts_;  // [V] fp32: occurrences in the output
};

// Picks the next token from logits [V] (fp32): temperature, then top_k, top_p and min_p (transformers'
// warper order). Stable for every temperature >= 0 and top_p in (0, 1] (the
// most likely token always stays a candidate); sampling (not greedy) throws when the logits hold NaN.
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& gen);

// One sequence's sampling state: its options, its penalties' history and its own random generator, seeded
// from options.seed. A row never shares a generator, so its draws do not depend on which rows decode beside
// it, nor in which order they sample.
class RowSampler {
 public:
  RowSampler() = default;
  RowSampler(const SamplingOptions& options, const std::vector<uint32_t>& prompt, int64_t vocab);
  // The next token from logits [V] (fp32) over the first `sampled_ids` ids (a vocabulary padded past the
  // tokenizer's holds no tokens); takes it into the penalties' history.
  int64_t next(const at::Tensor& logits, int64_t sampled_ids);

 private:
  SamplingOptions options_;
  Penalties penalties_;
  at::Generator gen_;
};

}  // namespace archspace
