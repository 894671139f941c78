// Differentiable exchanges of sequence slices between the ranks of a context-parallel group: rank r of n
// holds positions [r x S, (r + 1) x S) of every sequence. Each exchange's backward sends the gradients
// back to the ranks that own the positions, so autograd sees one sequence split over the ranks.
// Collectives run on every rank of the group in the same order, in forward and in backward (activation
// checkpointing's recomputation included): callers must call them on every rank, even where their own
// share is empty (rank 0 receives no halo but owns positions others read).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "archspace/dist/process_group.h"

namespace archspace {

// All ranks' slices along `dim`, concatenated in rank order: [..., n x S, ...]. Backward: reduce-scatter
// (the gradient of this rank's positions summed over every rank that read them).
at::Tensor gather_sequence(DistGroup& group, const at::Tensor& slice, int64_t dim);

// The `count` positions before this rank's slice (fewer at the start of the sequence: positions below 0
// do not exist), then the slice itself, along `dim`: [..., min(count, r x S) + S, ...]. Only the ranks
// that own those positions send them (point-to-point); backward sends their gradients back and adds them
// to the owner's.
at::Tensor gather_preceding(DistGroup& group, const at::Tensor& slice, int64_t dim, int64_t count);

// Which positions gather_preceding moves: rank `peer` sends positions [start, start + length) of its own
// slice (0-based within the slice) to the receiver, where they land at `offset` in the receiver's halo.
struct HaloPiece {
  int peer;  // the other rank: the owner for a receive, the receiver for a send
  int64_t start, length, offset;
};
struct HaloPlan {
  int64_t halo = 0;  // positions received before this rank's slice
  std::vector<HaloPiece> receives, sends;
};
// For rank `rank` of `ranks`, slices of `slice_length` positions, `count` positions wanted before each.
// Pure arithmetic: every rank computes every rank's plan alike.
HaloPlan halo_plan(int rank, int ranks, int64_t slice_length, int64_t count);

}  // namespace archspace
