// Text generation with the KV cache: chunked prefill, then one token per step, sampled (temperature,
// top-k, top-p; temperature 0 is greedy), streamed as UTF-8 text as it is produced. Several prompts of
// different lengths decode together as one left-padded batch (KVCache); each row stops on its own.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<uint32_t> stop_ids;         // generation ends after any of these (not printed)
  std::vector<std::string> stop_strings;  // or when the text contains one (cut before it)
  int64_t prefill_chunk = 1024;

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

// A completion's text as its tokens arrive: stop strings cut it (before the stop), and only whole UTF-8
// characters that cannot be the start of a stop string are released for streaming, so the pieces
// streamed always add up to the final text.
class CompletionText {
 public:
  explicit CompletionText(std::vector<std::string> stop_strings = {}) : stops_(std::move(stop_strings)) {}
  // Adds one token's bytes; returns the text that became safe to stream (may be empty).
  std::string add(const std::string& token_bytes);
  // Releases whatever is held back (at the end of the completion).
  std::string flush();
  bool stopped() const { return stopped_; }  // a stop string appeared
  std::string text() const;                  // the whole text so far (invalid UTF-8 replaced)

 private:
  std::vector<std::string> stops_;
  std::string bytes_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

// Picks the next token from logits [V] (fp32).
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& gen);

// on_text(prompt index, text) receives each prompt's completion piece by piece (whole UTF-8 characters).
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer,
                        const std::vector<std::vector<uint32_t>>& prompts, const GenerateOptions& options,
                        const std::function<void(size_t, const std::string&)>& on_text);

// One prompt.
GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_text);

}  // namespace archspace
