#include "archspace/infer/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "archspace/infer/decode_step.h"
#include "archspace/kernels/argmax.h"
#include "archspace/model/kv_cache.h"
#include "archspace/util/error.h"

namespace archspace {

int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature < kGreedyTemperature) return argmax_index(logits);
  at::Tensor scaled = logits.to(at::kFloat).cpu() / o.temperature;
  if (o.top_k > 0 && o.top_k < scaled.size(0)) {
    const float kth = std::get<0>(scaled.topk(o.top_k)).min().item<float>();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scaled, -1);
  if (o.top_p < 1.0) {
    // Keep the smallest set of most likely tokens whose probability reaches top_p.
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    at::Tensor before = sorted.cumsum(-1) - sorted;  // mass of the tokens ranked above each
    at::Tensor drop = before >= o.top_p;             // top_p in fp32: 1e-300 is 0 there, and would drop every token
    drop[0] = false;
    sorted.masked_fill_(drop, 0.0);
    probs = at::zeros_like(probs).scatter(0, order, sorted);
  }
  if (o.min_p > 0) {  // transformers' MinPLogitsWarper: relative to the most likely token, which stays
    probs = probs.masked_fill(probs < probs.max() * o.min_p, 0.0);
  }
  return at::multinomial(probs, 1, false, gen).item<int64_t>();
}

Penalties::Penalties(const SamplingOptions& o, const std::vector<uint32_t>& prompt, int64_t vocab)
    : repetition_(o.repetition_penalty), presence_(o.presence_penalty), frequency_(o.frequency_penalty) {
  if (repetition_ == 1.0 && presence_ == 0.0 && frequency_ == 0.0) return;
  seen_ = at::zeros({vocab}, at::kBool);
  counts_ = at::zeros({vocab}, at::kFloat);
  if (!prompt.empty()) {
    seen_.index_fill_(0, at::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), at::kLong), true);
  }
}

void Penalties::add(int64_t id) {
  if (!active()) return;
  seen_[id] = true;
  counts_[id] += 1;
}

at::Tensor Penalties::apply(const at::Tensor& logits) const {
  if (!active()) return logits;
  const int64_t V = logits.size(0);
  at::Tensor out = logits.to(at::kFloat).clone();
  if (repetition_ != 1.0) {
    at::Tensor seen = seen_.narrow(0, 0, V);
    out = at::where(seen, at::where(out < 0, out * repetition_, out / repetition_), out);
  }
  at::Tensor counts = counts_.narrow(0, 0, V);
  if (frequency_ != 0.0) out -= counts * frequency_;
  if (presence_ != 0.0) out -= (counts > 0).to(at::kFloat) * presence_;
  return out;
}

void GenerateOptions::validate() const {
  auto fail = [](const std::string& flag, const std::string& range, const std::string& got) {
    throw Error(flag + " must be " + range + " (got " + got + ")");
  };
  const SamplingOptions& s = sampling;
  if (max_new_tokens < 1) fail("--max-new-tokens", "at least 1", std::to_string(max_new_tokens));
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    fail("--temperature", "a finite number >= 0 (0: greedy)", std::to_string(s.temperature));
  }
  if (s.top_k < 0) fail("--top-k", ">= 0 (0: off)", std::to_string(s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1)) fail("--top-p", "in (0, 1] (1: off)", std::to_string(s.top_p));
  for (const auto& stop : stop_strings) {
    if (stop.empty()) throw Error("--stop: an empty string would stop before the first token");
  }
  if (prefill_chunk < 1) fail("prefill chunk", "at least 1", std::to_string(prefill_chunk));
}

namespace {
void check_prompt(const std::vector<uint32_t>& prompt, const ModelConfig& c, const std::string& which) {
  if (prompt.empty()) throw Error("generate: " + which + " is empty");
  for (uint32_t id : prompt) {
    if (id >= static_cast<uint64_t>(c.vocab_size)) {
      throw Error("generate: " + which + " token id " + std::to_string(id) + " is out of range [0, " +
                  std::to_string(c.vocab_size) + ")");
    }
  }
  if (static_cast<int64_t>(prompt.size()) >= c.max_position_embeddings) {
    throw Error("generate: " + which + " has " + std::to_string(prompt.size()) + " tokens; the model's maximum is " +
                std::to_string(c.max_position_embeddings) + " positions (max_position_embeddings)");
  }
}

// One row's decoding state.
struct RowState {
  Completion completion;
  CompletionText text;
  bool done = false;
};
}  // namespace

GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer,
                        const std::vector<std::vector<uint32_t>>& prompts, const GenerateOptions& o,
                        const std::function<void(size_t, const std::string&)>& on_text) {
  const ModelConfig& c = model.config();
  o.validate();
  if (prompts.empty()) throw Error("generate: no prompt");
  const size_t B = prompts.size();
  int64_t longest = 0;
  for (size_t b = 0; b < B; ++b) {
    check_prompt(prompts[b], c, B == 1 ? "the prompt" : "prompt " + std::to_string(b + 1));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[b].size()));
  }
  c10::InferenceMode inference;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.sampling.seed);
  // Left-pad to the longest prompt; the padding id is masked out, any valid id will do.
  const int64_t pad_id = c.pad_token_id && *c.pad_token_id < c.vocab_size ? *c.pad_token_id : 0;
  std::vector<int64_t> padding(B), flat;
  for (size_t b = 0; b < B; ++b) {
    padding[b] = longest - static_cast<int64_t>(prompts[b].size());
    flat.insert(flat.end(), padding[b], pad_id);
    flat.insert(flat.end(), prompts[b].begin(), prompts[b].end());
  }
  KVCache cache(c, B > 1 ? padding : std::vector<int64_t>{});
  GenerateResult r;
  const DecodeOptions fwd{&cache, AttentionImpl::kSdpa, /*last_position_only=*/true};
  auto now = [] { return std::chrono::steady_clock::now(); };

  // Prefill in chunks: bounded activation memory for long prompts.
  auto t0 = now();
  at::Tensor ids = at::tensor(flat, at::kLong).view({static_cast<int64_t>(B), longest});
  at::Tensor last;  // [B, V] fp32 on CPU: the logits the next tokens are sampled from
  for (int64_t s = 0; s < longest; s += o.prefill_chunk) {
    const int64_t n = std::min<int64_t>(o.prefill_chunk, longest - s);
    RECORD_USER_SCOPE("archspace::prefill");  // spans in a profile (util/profiler.h)
    last = logits_to_float(model.forward(ids.narrow(1, s, n), fwd).select(1, 0));
  }
  for (const auto& p : prompts) r.prefill_tokens += static_cast<int64_t>(p.size());
  r.prefill_seconds = std::chrono::duration<double>(now() - t0).count();

  // Decode.
  std::vector<RowState> rows;
  for (size_t b = 0; b < B; ++b) rows.push_back({{}, CompletionText(o.stop_strings), false});
  auto stream = [&](size_t b, const std::string& piece) {
    if (!piece.empty()) on_text(b, piece);
  };
  t0 = now();
  const int64_t budget = std::min<int64_t>(o.max_new_tokens, c.max_position_embeddings - longest);
  // Sample only ids the tokenizer has: a vocabulary padded beyond it (100278 -> 100352) holds no tokens.
  const int64_t sampled_ids = std::min<int64_t>(c.vocab_size, tokenizer.vocab_size());
  // The forwards fill slots longest .. longest + budget - 2 (the last sampled token is never fed back).
  DecodeSteps decode(model, cache, o.decode_steps, longest + std::max<int64_t>(budget - 1, 1));
  for (int64_t step = 0; step < budget; ++step) {
    std::vector<int64_t> next(B, pad_id);
    for (size_t b = 0; b < B; ++b) {
      RowState& row = rows[b];
      if (row.done) continue;
      const int64_t id = sample_token(last[b].narrow(-1, 0, sampled_ids), o.sampling, gen);
      if (std::find(o.stop_ids.begin(), o.stop_ids.end(), static_cast<uint32_t>(id)) != o.stop_ids.end()) {
        row.done = true;
        continue;
      }
      next[b] = id;
      row.completion.ids.push_back(static_cast<uint32_t>(id));
      stream(b, row.text.add(tokenizer.id_to_token(static_cast<uint32_t>(id))));
      if (row.text.stopped()) row.done = true;
    }
    if (std::all_of(rows.begin(), rows.end(), [](const RowState& row) { return row.done; })) break;
    if (step + 1 == budget) break;  // no forward needed for tokens that will not be sampled from
    // Rows that are done feed the padding id; their logits are ignored from here on.
    last = logits_to_float(decode.step(next));
  }
  r.decode_seconds = std::chrono::duration<double>(now() - t0).count();
  for (size_t b = 0; b < B; ++b) {
    stream(b, rows[b].text.flush());
    rows[b].completion.text = rows[b].text.text();
    r.decode_tokens += static_cast<int64_t>(rows[b].completion.ids.size());
    r.completions.push_back(std::move(rows[b].completion));
  }
  r.cache_bytes = cache.bytes();
  r.cache_sliding_bytes = cache.bytes(LayerType::kSliding);
  r.cache_full_bytes = cache.bytes(LayerType::kFull);
  return r;
}

GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_text) {
  return generate(model, tokenizer, std::vector<std::vector<uint32_t>>{prompt}, options,
                  [&](size_t, const std::string& text) { on_text(text); });
}

}  // namespace archspace
