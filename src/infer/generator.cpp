#include "archspace/infer/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "archspace/infer/kv_cache.h"
#include "archspace/util/error.h"

namespace archspace {

int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature <= 0) return logits.argmax().item<int64_t>();
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
    sorted.masked_fill_(before >= o.top_p, 0.0);
    probs = at::zeros_like(probs).scatter(0, order, sorted);
  }
  return at::multinomial(probs, 1, false, gen).item<int64_t>();
}

namespace {
// Bytes at the end that may be the start of a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const unsigned char c = s[s.size() - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}
}  // namespace

GenerateResult generate(const CausalLM& model, const Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const GenerateOptions& o, const std::function<void(const std::string&)>& on_text) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  for (uint32_t id : prompt) {
    if (id >= static_cast<uint64_t>(c.vocab_size)) {
      throw Error("generate: prompt token id " + std::to_string(id) + " is out of range [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  if (static_cast<int64_t>(prompt.size()) >= c.max_position_embeddings) {
    throw Error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens; the model's maximum is " +
                std::to_string(c.max_position_embeddings) + " positions (max_position_embeddings)");
  }
  c10::InferenceMode inference;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.sampling.seed);
  KVCache cache(c);
  GenerateResult r;
  const ForwardOptions fwd{AttentionImpl::kSdpa, &cache, /*last_position_only=*/true};
  auto now = [] { return std::chrono::steady_clock::now(); };

  // Prefill in chunks: bounded activation memory for long prompts.
  auto t0 = now();
  at::Tensor ids = at::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), at::kLong).unsqueeze(0);
  at::Tensor last;
  for (int64_t s = 0; s < ids.size(1); s += o.prefill_chunk) {
    const int64_t n = std::min<int64_t>(o.prefill_chunk, ids.size(1) - s);
    last = model.forward(ids.narrow(1, s, n), fwd)[0][0].to(at::kCPU, at::kFloat);
  }
  r.prefill_tokens = ids.size(1);
  r.prefill_seconds = std::chrono::duration<double>(now() - t0).count();

  // Decode.
  std::string bytes;  // raw bytes of the generated tokens so far
  size_t emitted = 0;
  t0 = now();
  const int64_t budget = std::min<int64_t>(o.max_new_tokens, c.max_position_embeddings - r.prefill_tokens);
  for (int64_t step = 0; step < budget; ++step) {
    const int64_t next = sample_token(last, o.sampling, gen);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), static_cast<uint32_t>(next)) != o.stop_ids.end()) break;
    r.ids.push_back(static_cast<uint32_t>(next));
    bytes += tokenizer.id_to_token(static_cast<uint32_t>(next));
    bool stop = false;
    size_t printable = bytes.size() - incomplete_utf8_tail(bytes);
    for (const auto& s : o.stop_strings) {
      const size_t at = bytes.find(s);
      if (at != std::string::npos) {
        printable = std::min(printable, at);
        bytes.resize(at);
        stop = true;
      }
    }
    if (printable > emitted) {
      on_text(utf8_lossy(std::string_view(bytes).substr(emitted, printable - emitted)));
      emitted = printable;
    }
    if (stop) break;
    if (step + 1 == budget) break;  // no forward needed for a token that will not be sampled from
    last = model.forward(at::full({1, 1}, next, at::kLong), fwd)[0][0].to(at::kCPU, at::kFloat);
  }
  if (bytes.size() > emitted) on_text(utf8_lossy(std::string_view(bytes).substr(emitted)));
  r.decode_tokens = static_cast<int64_t>(r.ids.size());
  r.decode_seconds = std::chrono::duration<double>(now() - t0).count();
  r.text = utf8_lossy(bytes);
  r.cache_bytes = cache.bytes();
  r.cache_sliding_bytes = cache.bytes(LayerType::kSliding);
  r.cache_full_bytes = cache.bytes(LayerType::kFull);
  return r;
}

}  // namespace archspace
