// Instances: what training reads, instance k of a run as a pure function of k. One shard set
// (InstanceLoader) and a weighted mixture of sources (SourceMixture) both implement it, so the Trainer's
// batches do not know which one they read.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace archspace {

class Instances {
 public:
  virtual ~Instances() = default;

  virtual uint64_t instances_per_epoch() const = 0;
  virtual int64_t sequence_length() const = 0;
  virtual std::vector<uint32_t> instance(uint64_t index) const = 0;  // sequence_length + label_tokens() ids
  // Ids past the sequence that serve only as labels: Megatron's samples carry one (the next sample's first id), so
  // that all sequence_length positions are trained; windows carry none (the last position has no label).
  virtual int64_t label_tokens() const { return 0; }

  // The named sources instances [first, first + count) came from, with how many instances each (in the
  // sources' own order); empty for a single unnamed source.
  virtual std::vector<std::pair<std::string, int64_t>> source_counts(uint64_t first, int64_t count) const {
    (void)first;
    (void)count;
    return {};
  }

  // Instances [first, first + count) as an int64 tensor [count, sequence_length + label_tokens()].
  at::Tensor batch(uint64_t first, int64_t count) const;

  // The slice of global step `step` that data-parallel `rank` of `world` reads: instances
  // step * global_batch + rank * (global_batch / world) ... (global_batch must divide by world).
  at::Tensor rank_batch(uint64_t step, int64_t global_batch, int rank, int world) const;
};

}  // namespace archspace
