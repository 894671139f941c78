// Training instances: fixed-length windows cut from each shard in turn (OLMo-core's "fixed sequence
// length" layout; a window never crosses a shard boundary). The order within an epoch is a keyed
// pseudo-random permutation of the windows, a pure function of (seed, epoch, position), so instance k
// of a run is the same whatever happened before: a resumed run, or one with another number of
// data-parallel ranks, reads exactly the instances an uninterrupted run would.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "archspace/data/instances.h"
#include "archspace/data/token_shards.h"

namespace archspace {

// A bijection on [0, n) keyed by `key`: a Feistel network on the next power of four, cycle-walked.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t n_, key_;
  int half_bits_;
};

class InstanceLoader : public Instances {
 public:
  // shuffle=false: windows in storage order (validation).
  InstanceLoader(std::shared_ptr<const TokenShards> shards, int64_t sequence_length, uint64_t seed,
                 bool shuffle = true);

  uint64_t instances_per_epoch() const override { return total_windows_; }
  int64_t sequence_length() const override { return sequence_length_; }

  // Which stored window the run's global instance `index` is (epoch = index / instances_per_epoch).
  uint64_t window_of(uint64_t index) const;
  std::vector<uint32_t> instance(uint64_t index) const override;

  const TokenShards& shards() const { return *shards_; }

 private:
  std::shared_ptr<const TokenShards> shards_;
  int64_t sequence_length_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<uint64_t> window_starts_;  // cumulative windows before each shard
  uint64_t total_windows_ = 0;
};

}  // namespace archspace
