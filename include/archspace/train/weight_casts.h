// bf16 copies of the weights made once per optimizer step (train.dtype = "bf16", unsharded runs): the model's
// weights handed to CausalLM::forward as a ParameterSource (model/parameter_source.h) whose blocks' matmul
// weights come in autocast's dtype, the same tensor for every micro-batch of a step and for activation
// checkpointing's recomputation.
//
// Autocast alone casts an fp32 weight once per autocast scope: once per micro-batch, and once more per block
// when checkpointing recomputes it in backward. Here each weight has one bf16 copy: made by a cast at its first
// use, then, with `kept_across_steps`, rewritten by the optimizer in the pass that updates the fp32 weight
// (AdamW::step's low_precision copies: copies_for() before it, copies_written() after), so no step casts again.
// A copy is used only while its weight's version counter is the one it was made at: a weight changed any other
// way (loading a checkpoint, an in-place op) is cast again. What a step's forward gets is a differentiable
// handle on the copy whose backward casts the gradient to fp32 and adds it to the fp32 leaf's gradient, as
// autocast's at::_to_copy does, so the values and gradients are autocast's bit for bit; only the number of
// casts changes. Autocast leaves the already-bf16 weights alone. The price: the copies (2 bytes per matmul
// parameter, what `archspace plan` counts as autocast_weights) live for the whole run, where with checkpointing
// autocast held them during the forward only.
//
// FSDP (train/fully_sharded.h) is a source of its own: it gathers each unit's weights in autocast's dtype.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <vector>

#include "archspace/model/causal_lm.h"
#include "archspace/model/parameter_source.h"

namespace archspace {

class StepWeightCasts : public ParameterSource {
 public:
  // `model` must outlive this object; its tensors are read, never replaced (the optimizer updates them in place).
  StepWeightCasts(const CausalLM& model, at::ScalarType dtype, bool kept_across_steps = false);

  at::Tensor embedding() override;  // fp32: autocast does not cast the lookup's table
  void embedding_done() override {}
  BlockWeights block(int64_t l) override;  // the matmul weights cast (cached for the step), the norms as they are
  void block_done(int64_t, std::vector<at::Tensor>&, bool) override {}
  std::vector<at::Tensor> block_leaves(int64_t l) override;  // the model's own parameters of block l
  HeadWeights head() override;                               // fp32: the loss casts the head itself...

  // ...from this copy of the LM head in `dtype`, detached (the loss forms the head's gradient in fp32 itself).
  at::Tensor head_weight_cast();

  // Ends the step: call after its last backward, before the optimizer changes the weights. Drops the step's
  // handles, and the copies too unless they are kept across steps.
  void end_step();

  // With kept_across_steps: for each of `params`, its copy (for AdamW::step to overwrite with the updated
  // weight), or an undefined tensor where it has none; empty otherwise.
  std::vector<at::Tensor> copies_for(const std::vector<at::Tensor>& params) const;
  // After that step: the copies hold the weights as they now are.
  void copies_written(const std::vector<at::Tensor>& params);

  // How many casts were made since construction (tests: once per weight, again only when a weight changed
  // other than through copies_written).
  int64_t casts_made() const { return casts_made_; }

 private:
  struct Copy {
    at::Tensor values;    // the weight in dtype_, detached
    int64_t version = 0;  // the weight's version counter when `values` was made from it
    at::Tensor handle;    // this step's differentiable handle on `values` (undefined between steps)
  };
  at::Tensor cast(const at::Tensor& weight);
  Copy& current_copy(const at::Tensor& weight);  // made or refreshed when missing or stale

  const CausalLM& model_;
  const at::ScalarType dtype_;
  const bool kept_across_steps_;
  std::map<const c10::TensorImpl*, Copy> copies_;  // by fp32 leaf
  int64_t casts_made_ = 0;
};

}  // namespace archspace
