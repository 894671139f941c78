#include "archspace/data/source_mixture.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "archspace/util/error.h"

namespace archspace {

namespace {

// FNV-1a over a string, then mixed with the other parts of a permutation key.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string label(const MixtureSourceSpec& s) { return s.label.empty() ? "source \"" + s.name + "\"" : s.label; }

uint64_t combine(uint64_t h, uint64_t v) { return (h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2))); }

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

SourceMixture::SourceMixture(MixtureSpec spec, const TokenSourceOptions& options) : spec_(std::move(spec)) {
  const uint64_t L = static_cast<uint64_t>(spec_.sequence_length), G = spec_.global_batch;
  if (spec_.sources.empty()) throw Error("a mixture needs at least one source");
  if (L == 0 || G == 0 || spec_.requested_tokens == 0)
    throw Error("a mixture's sequence length, global batch and token budget must be positive");
  std::vector<double> ratios;
  for (size_t s = 0; s < spec_.sources.size(); ++s) {
    const MixtureSourceSpec& src = spec_.sources[s];
    Source out;
    out.key = fnv1a(src.name);
    const std::string which = label(src);
    for (const std::string& path : src.paths) {
      std::shared_ptr<TokenShards> part;
      try {
        part = open_token_source(path, options);
        out.window_starts.push_back(out.total_windows);
        out.windows.emplace_back(part, spec_.sequence_length, 0, /*shuffle=*/false);
      } catch (const Error& e) {
        throw Error(which + ": " + e.what());
      }
      out.total_windows += out.windows.back().instances_per_epoch();
      out.total_tokens += part->manifest().total_tokens();
      out.parts.push_back(std::move(part));
    }
    sources_.push_back(std::move(out));
    ratios.push_back(src.ratio);
  }
  // One epoch: the budget in whole global batches (OLMo-core rounds the same way: whole training steps).
  const uint64_t per_step = G * L;
  const uint64_t epoch = (spec_.requested_tokens + per_step - 1) / per_step * G;
  const std::vector<uint64_t> counts = apportion(epoch, ratios);
  for (size_t s = 0; s < sources_.size(); ++s) {
    const MixtureSourceSpec& src = spec_.sources[s];
    const uint64_t have = sources_[s].total_windows, need = counts[s];
    const double allowed = std::floor(src.max_repetition * static_cast<double>(have));
    if (static_cast<double>(need) > allowed) {
      const double times = static_cast<double>(need) / static_cast<double>(have);
      throw Error(label(src) + ": its ratio " + number(src.ratio) + " of the token budget " +
                  std::to_string(spec_.requested_tokens) + " needs " + std::to_string(need * L) + " tokens (" +
                  std::to_string(need) + " instances of " + std::to_string(L) + "), but its " +
                  std::to_string(src.paths.size()) + " path(s) hold " + std::to_string(sources_[s].total_tokens) +
                  " tokens (" + std::to_string(have) + " instances): read " + number(times) +
                  " times over, more than its max_repetition " + number(src.max_repetition) + " allows (" +
                  std::to_string(static_cast<uint64_t>(allowed)) +
                  " instances); raise max_repetition, add data to the source, or lower its ratio or data.mix_tokens");
    }
  }
  schedule_ = std::make_unique<MixtureSchedule>(counts, G);
}

std::vector<uint32_t> SourceMixture::instance(uint64_t index) const {
  const uint64_t n = instances_per_epoch(), epoch = index / n;
  const MixtureSchedule::Slot slot = schedule_->at(index % n);
  const Source& src = sources_[slot.source];
  // Pass r over the source's windows within this epoch: a fresh permutation each pass, so a source read
  // 2.5 times over gives every window twice and a keyed half of them a third time.
  const uint64_t pass = slot.occurrence / src.total_windows, within = slot.occurrence % src.total_windows;
  uint64_t window = within;
  if (spec_.shuffle) {
    const uint64_t key = combine(combine(combine(spec_.seed, epoch), src.key), pass);
    window = IndexPermutation(src.total_windows, key)(within);
  }
  const size_t part =
      std::upper_bound(src.window_starts.begin(), src.window_starts.end(), window) - src.window_starts.begin() - 1;
  return src.windows[part].instance(window - src.window_starts[part]);
}

std::vector<std::pair<std::string, int64_t>> SourceMixture::source_counts(uint64_t first, int64_t count) const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& s : spec_.sources) out.emplace_back(s.name, 0);
  for (int64_t i = 0; i < count; ++i) ++out[source_of(first + i)].second;
  return out;
}

nlohmann::json SourceMixture::describe() const {
  const uint64_t L = static_cast<uint64_t>(spec_.sequence_length), N = instances_per_epoch();
  nlohmann::json sources = nlohmann::json::array();
  for (size_t s = 0; s < sources_.size(); ++s) {
    const MixtureSourceSpec& spec = spec_.sources[s];
    const Source& src = sources_[s];
    const uint64_t n = schedule_->counts()[s];
    nlohmann::json files = nlohmann::json::array();
    for (const auto& part : src.parts)
      for (size_t i = 0; i < part->num_shards(); ++i) files.push_back(part->shard_path(i));
    const double per_batch = static_cast<double>(n) * static_cast<double>(spec_.global_batch) / static_cast<double>(N);
    sources.push_back(
        {{"name", spec.name},
         {"paths", spec.paths},
         {"files", files},
         {"ratio", spec.ratio},
         {"max_repetition", spec.max_repetition},
         {"available_tokens", src.total_tokens},
         {"available_instances", src.total_windows},
         {"requested_tokens", static_cast<uint64_t>(spec.ratio * static_cast<double>(spec_.requested_tokens))},
         {"instances", n},
         {"tokens", n * L},
         {"repetition", static_cast<double>(n) / static_cast<double>(src.total_windows)},
         {"share", static_cast<double>(n) / static_cast<double>(N)},
         {"instances_per_batch",
          {static_cast<uint64_t>(std::floor(per_batch)), static_cast<uint64_t>(std::ceil(per_batch))}}});
  }
  return {{"requested_tokens", spec_.requested_tokens},
          {"sequence_length", spec_.sequence_length},
          {"global_batch", spec_.global_batch},
          {"instances_per_epoch", N},
          {"tokens_per_epoch", N * L},
          {"seed", spec_.seed},
          {"shuffle", spec_.shuffle},
          {"sources", sources}};
}

}  // namespace archspace
