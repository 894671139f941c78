// Context parallelism (train.context_parallel = N; docs/distributed.md): the ranks form groups of N consecutive
// ranks (rank = data-parallel rank x N + c) that read the same instances, and rank c of a group computes the
// c-th of N contiguous slices of every sequence ("llama3" style, as OLMo-core and torchtitan run OLMo 3's
// long-context stage). Full-attention layers all-gather the group's keys and values; sliding layers receive
// only the window's halo, the sliding_window - 1 positions before the slice, from the ranks that own them. The
// exchanges' backward returns the keys' and values' gradients to their owners (dist/sequence_exchange.h).
// Everything else is per position and stays local. The gradient all-reduce over the whole world then sums
// the slices' parameter gradients as it sums the data-parallel ranks' (the loss of each slice is normalised by
// the global labelled-token count), so the optimizer sees the gradient of whole sequences.
#pragma once

#include <cstdint>
#include <memory>

#include "archspace/dist/process_group.h"
#include "archspace/model/context_parallel.h"
#include "archspace/train/batches.h"

namespace archspace {

class ContextParallelism final : public ContextParallel {
 public:
  // Joins this rank's group of `degree` consecutive ranks of `world` (every rank of the world calls it).
  // `degree` must divide the world size and `sequence_length`; the caller reports a bad config (named keys).
  ContextParallelism(DistGroup& world, int64_t degree, int64_t sequence_length);

  int64_t degree() const { return degree_; }
  int rank_in_group() const { return group_->rank(); }
  // Data parallelism across the groups: which group this rank belongs to, and how many there are.
  int64_t data_parallel_rank() const { return data_parallel_rank_; }
  int64_t data_parallel_size() const { return data_parallel_size_; }
  DistGroup& group() { return *group_; }

  // This rank's slice [B, T] -> [B, T / N] of a batch's inputs and labels. Labels are already the next
  // tokens, so the slice's last label is the first input of the next slice and needs no exchange.
  Batch slice(const Batch& batch) const;

  int64_t slice_start() const override { return slice_start_; }
  Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t window) override;

 private:
  int64_t degree_, slice_length_, slice_start_;
  int64_t data_parallel_rank_, data_parallel_size_;
  std::unique_ptr<DistGroup> group_;
};

}  // namespace archspace
