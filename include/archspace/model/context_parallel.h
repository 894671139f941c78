// Context parallelism as the model sees it: the forward's input is one contiguous slice of each sequence
// (positions [slice_start, slice_start + T)), and attention reads the keys and values of other slices
// through this hook. Everything else of a block (norms, MLP, Depth-Attention, both SiameseNorm streams)
// mixes only within one position, so it runs on the slice as on a whole sequence. The strategy that
// exchanges the keys and values lives above the model (train/context_parallelism.h), as torchtitan applies
// parallelism around a model written for one device.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace archspace {

class ContextParallel {
 public:
  virtual ~ContextParallel() = default;

  // The global position of the slice's first token: RoPE turns slice position t into slice_start() + t.
  virtual int64_t slice_start() const = 0;

  // The keys and values the slice's queries attend to, for a layer with `window` (0: full attention).
  struct Keys {
    at::Tensor k, v;   // [B, G, Tk, h]: keys at global positions [slice_start() - q_offset, slice end)
    int64_t q_offset;  // where the slice's first query sits among those keys (causal_attention's q_offset)
  };
  // k, v: this slice's keys and (mixed) values [B, G, T, h]. Every rank of the group calls it for every
  // layer in the same order (it may communicate), in forward and again in a checkpointed block's backward.
  virtual Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t window) = 0;
};

}  // namespace archspace
