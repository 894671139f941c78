// Which source each position of a mixture's epoch takes: integers only, a pure function of the per-epoch
// instance counts and the global batch, so every rank and every resumed run computes the same schedule.
//
// An epoch of N = B x G positions (B global batches of G instances) holds n_s instances of source s
// (sum n_s = N). Two levels:
//   1. Batches: global batch b holds g_bs = floor(n_s / B) + x_bs instances of s, x_bs in {0, 1}. Which
//      batches take the extra ones is a Pfair schedule of the remainders (n_s mod B) / B on
//      m = sum_s (n_s mod B) / B "processors" by PD^2 (Srinivasan and Anderson's optimal Pfair
//      algorithm), so after any b whole batches source s has had b G n_s / N instances within one
//      (strictly): the share of every run prefix of whole steps stays within one instance of n_s / N.
//   2. Positions within a batch: earliest deadline first over each source's ideal times, the j-th
//      instance of s (counted from the epoch start) due by position ceil(j N / n_s) and not released before
//      floor((j - 1) N / n_s) where the batch's counts allow it, so sources interleave evenly inside each
//      batch and across its boundaries.
// With n_s the apportionment of N by the mixture's ratios (largest remainders), every global batch holds
// floor(G r_s) or ceil(G r_s) instances of s: its ratio within one instance.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace archspace {

// Hamilton's apportionment (largest remainders, ties to the lower index): integers summing to `total`,
// each floor or ceil of total x weight / sum(weights).
std::vector<uint64_t> apportion(uint64_t total, const std::vector<double>& weights);

class MixtureSchedule {
 public:
  // counts[s] >= 0 instances of source s per epoch; their sum must be a positive multiple of global_batch.
  MixtureSchedule(std::vector<uint64_t> counts, uint64_t global_batch);

  uint64_t epoch_instances() const { return total_; }
  uint64_t global_batch() const { return batch_; }
  size_t num_sources() const { return counts_.size(); }
  const std::vector<uint64_t>& counts() const { return counts_; }

  struct Slot {
    uint32_t source;      // which source position p takes
    uint64_t occurrence;  // which of that source's instances of the epoch (0-based, in order of position)
  };
  Slot at(uint64_t position) const;  // 0 <= position < epoch_instances()

  // Instances of each source before global batch `b` (0 <= b <= batches).
  std::vector<uint64_t> before_batch(uint64_t b) const;
  // Instances of each source in global batch `b`.
  std::vector<uint64_t> in_batch(uint64_t b) const;

 private:
  // The batches that take source s's extra instance: bit s of extras(b).
  uint64_t extras(uint64_t b, const std::vector<uint64_t>& done_before) const;
  std::vector<uint64_t> extras_before(uint64_t b) const;
  std::vector<Slot> batch_slots(uint64_t b) const;

  std::vector<uint64_t> counts_;
  uint64_t total_ = 0, batch_ = 0, batches_ = 0;
  std::vector<uint64_t> base_, remainder_;  // floor(n_s / B), n_s mod B
  uint64_t processors_ = 0;                 // sum of the remainders / B
  static constexpr uint64_t kSnapshotEvery = 64;
  std::vector<std::vector<uint64_t>> snapshots_;  // extras of each source before batch i * kSnapshotEvery

  mutable std::mutex cache_mutex_;
  mutable uint64_t cached_batch_ = UINT64_MAX;
  mutable std::vector<Slot> cached_slots_;  // the positions of cached_batch_
};

}  // namespace archspace
