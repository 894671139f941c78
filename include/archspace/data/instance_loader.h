// Training instances: fixed-length windows cut from each shard in turn (OLMo-core's "fixed sequence
// length" layout, NumpyFSLDataset's: a window never crosses a shard boundary). The order within an epoch is a pure
// function of (seed, epoch, position), so instance k of a run is the same whatever happened before: a resumed run,
// or one with another number of data-parallel ranks, reads exactly the instances an uninterrupted run would.
// Two orders (train.data_order):
//   archspace  a keyed pseudo-random permutation of all the windows per epoch (IndexPermutation, no state);
//   olmo-core  OLMo-core's NumpyFSLDataLoader (olmo_core/data/data_loader.py, _build_global_indices): epoch e
//              (1-based) reads the windows in the order np.random.Generator(PCG64(seed + e)).shuffle(arange(n))
//              gives them, cut to a whole number of global batches (its total_size); data/numpy_random.h
//              reproduces numpy's draws. The epoch's permutation is kept in memory (4 bytes a window, as
//              OLMo-core's global-indices file).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "archspace/config/recipe.h"
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
  // shuffle=false: windows in storage order (validation). `global_batch`: instances per step, for the olmo-core
  // order's epochs of whole batches.
  InstanceLoader(std::shared_ptr<const TokenShards> shards, int64_t sequence_length, uint64_t seed, bool shuffle = true,
                 DataOrder order = DataOrder::kArchspace, int64_t global_batch = 1);

  uint64_t instances_per_epoch() const override { return epoch_instances_; }
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
  DataOrder order_;
  std::vector<uint64_t> window_starts_;  // cumulative windows before each shard
  uint64_t total_windows_ = 0;
  uint64_t epoch_instances_ = 0;  // the windows an epoch reads

  // The olmo-core order's permutation of the epoch last asked for (shared by copies, behind its own lock).
  struct PermutationCache;
  uint64_t olmo_core_window(uint64_t epoch, uint64_t position) const;
  std::shared_ptr<PermutationCache> permutation_;
};

}  // namespace archspace
