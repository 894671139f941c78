// Where CausalLM::forward takes its weights from, unit by unit. By default (SequenceOptions::parameters null)
// it reads its own tensors. A parallelism strategy may instead hand in each unit's weights just before the
// unit runs and release them after, as FSDP does (train/fully_sharded.h gathers them from the shards the
// ranks hold): the model stays written for one device, the strategy is applied around it.
//
// The units, in forward order: the embedding; each block; the head (the topology's final norms, the final
// norm and the LM head, which the loss reads after forward returns).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "archspace/model/parameters.h"

namespace archspace {

struct HeadWeights {
  FinalNorms final_norms;
  at::Tensor norm, lm_head;
};

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;

  // The embedding table, and the end of its use (the lookup's backward does not read the table).
  virtual at::Tensor embedding() = 0;
  virtual void embedding_done() = 0;

  // Block l's weights, for its forward or, under activation checkpointing, its recomputation in backward.
  virtual BlockWeights block(int64_t l) = 0;
  // After block l's forward. `outputs` are the tensors through which backward reaches the block (its
  // streams); the source may replace them with tensors whose backward first brings the weights back for
  // the block's backward. `recomputed`: activation checkpointing runs the block again in backward (through
  // block() again), so nothing of this forward's weights is read after it.
  virtual void block_done(int64_t l, std::vector<at::Tensor>& outputs, bool recomputed) = 0;
  // The tensors that a recomputed block's weights are differentiated through (what activation checkpointing's
  // backward asks gradients for); the model's own parameters of block l when it reads them itself.
  virtual std::vector<at::Tensor> block_leaves(int64_t l) = 0;

  // The head's weights; the same tensors until the strategy releases them (the loss reads lm_head after
  // forward returns).
  virtual HeadWeights head() = 0;
};

}  // namespace archspace
