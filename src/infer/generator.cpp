#include "archspace/infer/generator.h"

#include <algorithm>
#include <cmath>

#include "archspace/infer/scheduler.h"
#include "archspace/util/error.h"

namespace archspace {

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
  // The batch is one request of B sequences, all decoding together: the engine's queue and batch hold them all.
  SchedulerOptions engine_options;
  engine_options.max_batch = engine_options.max_queue = static_cast<int64_t>(B);
  engine_options.prefill_chunk = o.prefill_chunk;
  engine_options.decode_steps = o.decode_steps;
  engine_options.caller_drives = true;  // the steps run on this thread (infer/scheduler.h)
  const auto stops = std::make_shared<const StopStrings>(o.stop_strings);
  const int64_t budget = std::min<int64_t>(o.max_new_tokens, c.max_position_embeddings - longest);
  std::vector<SequenceRequest> sequences(B);
  for (size_t b = 0; b < B; ++b) {
    SequenceRequest& s = sequences[b];
    s.prompt = prompts[b];
    s.max_tokens = budget;
    s.sampling = o.sampling;
    s.sampling.seed = o.sampling.seed + b;  // as serve seeds a request's n choices: rows draw apart
    s.stop_ids = o.stop_ids;
    s.stop_strings = stops;
  }
  // The engine shares the caller's tokenizer for the call (it outlives the engine, stopped below).
  const std::shared_ptr<const Tokenizer> borrowed(std::shared_ptr<const Tokenizer>(), &tokenizer);
  Scheduler engine(model, borrowed, engine_options);
  const std::shared_ptr<Ticket> ticket = engine.submit(std::move(sequences));
  if (!ticket) throw Error("generate: the decoding engine refused the prompts");
  const std::string error = engine.drive(*ticket, [&](const Ticket::Event& event) {
    if (!event.text.empty()) on_text(event.index, event.text);
  });
  engine.stop();
  if (!error.empty()) throw Error("generate: " + error);

  GenerateResult r;
  for (size_t b = 0; b < B; ++b) {
    const SequenceResult& done = ticket->results()[b];
    Completion completion;
    for (const GeneratedToken& t : done.tokens) completion.ids.push_back(t.id);
    completion.text = done.text;
    r.prefill_tokens += static_cast<int64_t>(prompts[b].size());
    r.decode_tokens += static_cast<int64_t>(completion.ids.size());
    r.completions.push_back(std::move(completion));
  }
  const SchedulerStats stats = engine.stats();
  r.prefill_seconds = stats.prefill_seconds;
  r.decode_seconds = stats.decode_seconds;
  r.cache_bytes = stats.cache_bytes;
  r.cache_sliding_bytes = stats.cache_sliding_bytes;
  r.cache_full_bytes = stats.cache_full_bytes;
  return r;
}

GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_text) {
  return generate(model, tokenizer, std::vector<std::vector<uint32_t>>{prompt}, options,
                  [&](size_t, const std::string& text) { on_text(text); });
}

}  // namespace archspace
