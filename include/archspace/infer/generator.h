// Text generation: a client of the decoding engine (infer/scheduler.h). Its prompts are submitted as one
// request and decoded together as a batch (each prefilled alone in chunks, then one token per step: KV caches
// joined left-padded); each row stops on its own, its text streamed as UTF-8 as it is produced. Row i samples
// (infer/sampler.h: temperature, top-k, top-p; temperature 0 is greedy) from its own generator seeded with
// seed + i, as serve seeds a request's n choices: the same prompt, settings and seed give the same tokens from
// `generate`, from `serve` and in a batch with other requests.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "archspace/infer/completion_text.h"
#include "archspace/infer/decode_step.h"
#include "archspace/infer/sampler.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

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

// on_text(prompt index, text) receives each prompt's completion piece by piece (whole UTF-8 characters).
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer,
                        const std::vector<std::vector<uint32_t>>& prompts, const GenerateOptions& options,
                        const std::function<void(size_t, const std::string&)>& on_text);

// One prompt.
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_text);

}  // namespace archspace
