// Text generation with the KV cache: chunked prefill, then one token per step, sampled (temperature,
// top-k, top-p; temperature 0 is greedy), streamed as UTF-8 text as it is produced. Several prompts of
// different lengths decode together as one left-padded batch (KVCache); each row stops on its own.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "archspace/infer/completion_text.h"
#include "archspace/infer/decode_step.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

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
  uint64_t seed = 0;
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<uint32_t> stop_ids;         // generation ends after any of these (not printed)
  std::vector<std::string> stop_strings;  // or when the text contains one (cut before it)
  int64_t prefill_chunk = 1024;
  // How each decoding step runs (infer/decode_step.h): eager, fixed shapes, or a replayed CUDA graph.
  DecodeMode decode_steps = DecodeMode::kEager;

  // Throws naming the flag and its valid range: max_new_tokens >= 1, temperature finite >= 0, top_k >= 0,
  // top_p in (0, 1], no empty stop string.
  void validate() const;
};

struct Completion {
  std::vector<uint32_t> ids;  // generated ids (without the prompt; without the stop id that ended it)
  std::string text;
};

struct GenerateResult {
  std::vector<Completion> completions;            // one per prompt, in order
  int64_t prefill_tokens = 0, decode_tokens = 0;  // summed over prompts (padding not counted)
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t cache_bytes = 0, cache_sliding_bytes = 0, cache_full_bytes = 0;
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

// on_text(prompt index, text) receives each prompt's completion piece by piece (whole UTF-8 characters).
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer,
                        const std::vector<std::vector<uint32_t>>& prompts, const GenerateOptions& options,
                        const std::function<void(size_t, const std::string&)>& on_text);

// One prompt.
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_text);

}  // namespace archspace
