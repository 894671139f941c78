// Scoring: the log-probability the model gives to each token of given sequences, batched. The one
// primitive behind downstream evaluation (continuation log-likelihoods), the server's `echo` with
// `logprobs`, and anything else that asks "how likely is this text".
//
// Sequences of different lengths are sorted by length and right-padded into batches of at most
// max_batch_tokens padded tokens; right padding cannot change a real position's logits under causal
// attention. Sequences that share their unscored prefix run it once (infer/prefix_groups.h). Only the positions asked
// for go through the output head, a chunk at a time, so a long sequence never holds [T, vocab] logits at once.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "archspace/model/causal_lm.h"

namespace archspace {

struct ScoreRequest {
  std::vector<uint32_t> ids;
  // Tokens ids[first_scored..] are scored, each given the tokens before it (at least 1: the first token
  // has no context).
  int64_t first_scored = 1;
  // Also return the distribution after the last token (to continue the sequence by one token).
  bool next_token = false;
  // The tokens that go through the model: without next_token the last token is only a target, never an input
  // (as lm-eval, which feeds (context + continuation)[:-1]), so max_position_embeddings + 1 tokens still fit.
  int64_t run_length() const { return static_cast<int64_t>(ids.size()) - (next_token ? 0 : 1); }
};

struct ScoreOptions {
  int64_t top_logprobs = 0;         // per scored position, the n most likely tokens with their log-probabilities
  int64_t max_batch_tokens = 8192;  // padded tokens per forward (a longer sequence goes alone)
  int64_t max_batch_sequences = 0;  // sequences per forward (0: as many as max_batch_tokens allows)
  int64_t head_chunk = 512;         // positions per output-head matmul
  // Requests with the same unscored prefix (a document's context, its choices' continuations scored) run it once
  // and their own tokens over its cached keys and values (infer/prefix_groups.h); off: every sequence whole.
  bool share_prefixes = true;
};

struct TokenLogprob {
  float logprob = 0;                            // log p(token | tokens before it)
  bool greedy = false;                          // the token is the most likely one there (argmax)
  std::vector<std::pair<uint32_t, float>> top;  // top_logprobs most likely (id, log p), most likely first
};

struct SequenceScore {
  std::vector<TokenLogprob> tokens;  // for ids[first_scored..], in order
  at::Tensor next_logprobs;          // [vocab] fp32 log-softmax after the last token (next_token only)
  double sum_logprob() const;
  bool all_greedy() const;
};

// Throws naming the request when a sequence is empty, first_scored is out of [1, size] (size itself: nothing
// scored), an id is outside the vocabulary, or the tokens it runs exceed max_position_embeddings (without
// next_token the last token is only scored, not run: max_position_embeddings + 1 tokens fit).
// progress(done, total) counts sequences.
std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<ScoreRequest>& requests,
                                           const ScoreOptions& options = {},
                                           const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace archspace
