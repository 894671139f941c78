#include "archspace/infer/sampler.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include "archspace/kernels/argmax.h"

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

RowSampler::RowSampler(const SamplingOptions& options, const std::vector<uint32_t>& prompt, int64_t vocab)
    : options_(options),
      penalties_(options, prompt, vocab),
      gen_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {}

int64_t RowSampler::next(const at::Tensor& logits, int64_t sampled_ids) {
  const int64_t id = sample_token(penalties_.apply(logits.narrow(0, 0, sampled_ids)), options_, gen_);
  penalties_.add(id);
  return id;
}

}  // namespace archspace
