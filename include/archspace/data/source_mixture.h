// A weighted mixture of token sources (`[[data.sources]]`, docs/data.md "Mixtures"), as OLMo-core's
// SourceMixtureDatasetConfig: each source is one or more token sources (any path open_token_source takes),
// a target ratio and a maximum repetition; a token budget (data.mix_tokens) fixes one epoch of
// N = ceil(budget / (G x L)) x G instances (G the global batch, L the sequence length), of which source s
// gets n_s, the apportionment of N by the ratios. A source whose windows cannot supply n_s instances
// without being read more than max_repetition times over is an error.
//
// Instance k of the run: epoch k / N, position k mod N; the position's source and which of that source's
// instances it is come from MixtureSchedule (every global batch holds each source's ratio within one
// instance); the instance is that source's window under a keyed permutation of its windows per
// (seed, epoch, source, repetition pass), so, as for one shard set, instance k is a pure function of
// (seed, k): a resumed run or any number of data-parallel ranks read exactly the same instances.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/data/instance_loader.h"
#include "archspace/data/instances.h"
#include "archspace/data/mixture_schedule.h"
#include "archspace/data/token_source.h"

namespace archspace {

struct MixtureSourceSpec {
  std::string name;
  std::vector<std::string> paths;  // token sources, read one after the other
  double ratio = 0;                // of the mixture's instances (the ratios sum to 1)
  double max_repetition = 1;       // times over its windows a source may be read within one epoch
  std::string label;               // how errors name it (e.g. the config key); "" : source "NAME"
};

struct MixtureSpec {
  std::vector<MixtureSourceSpec> sources;
  uint64_t requested_tokens = 0;  // the token budget: one epoch holds at least this many tokens
  int64_t sequence_length = 0;
  uint64_t global_batch = 0;  // instances per optimizer step, every rank together
  uint64_t seed = 0;
  bool shuffle = true;
};

class SourceMixture : public Instances {
 public:
  SourceMixture(MixtureSpec spec, const TokenSourceOptions& options);

  uint64_t instances_per_epoch() const override { return schedule_->epoch_instances(); }
  int64_t sequence_length() const override { return spec_.sequence_length; }
  std::vector<uint32_t> instance(uint64_t index) const override;
  std::vector<std::pair<std::string, int64_t>> source_counts(uint64_t first, int64_t count) const override;

  // Which source instance `index` of the run comes from.
  size_t source_of(uint64_t index) const { return schedule_->at(index % instances_per_epoch()).source; }
  const MixtureSpec& spec() const { return spec_; }
  const MixtureSchedule& schedule() const { return *schedule_; }
  // The token sources of source s, one per path.
  const std::vector<std::shared_ptr<const TokenShards>>& parts(size_t s) const { return sources_[s].parts; }

  // What the mixture realised, for RUN/data_mixture.json: per source its files, available tokens and
  // instances, requested tokens, instances and tokens per epoch, repetition and realised share.
  nlohmann::json describe() const;

 private:
  struct Source {
    std::vector<std::shared_ptr<const TokenShards>> parts;
    std::vector<InstanceLoader> windows;  // each part's windows in storage order
    std::vector<uint64_t> window_starts;  // windows before each part
    uint64_t total_windows = 0, total_tokens = 0;
    uint64_t key = 0;  // from the source's name: its order does not change when other sources do
  };
  MixtureSpec spec_;
  std::vector<Source> sources_;
  std::unique_ptr<MixtureSchedule> schedule_;
};

}  // namespace archspace
