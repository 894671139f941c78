// bf16 copies of the weights made once per optimizer step (train.dtype = "bf16", unsharded runs): the model's
// weights handed to CausalLM::forward as a ParameterSource (model/parameter_source.h) whose blocks' matmul
// weights are cast to autocast's dtype at their first use in a step and reused by every later micro-batch
// and by activation checkpointing's recomputation, until end_step() drops them before the optimizer runs.
//
// Autocast alone casts an fp32 weight once per autocast scope: once per micro-batch, and once more per block
// when checkpointing recomputes it in backward. A cast here is the same at::_to_copy with the same autograd
// node (its backward casts the gradient back to fp32 and adds it to the fp32 leaf's gradient, per backward as
// autocast's does), so the values and gradients are autocast's bit for bit; only the number of casts
// changes. Autocast leaves the already-bf16 weights alone. The price: the copies (2 bytes per matmul
// parameter, what `archspace plan` counts as autocast_weights) live for the whole step, where with
// checkpointing autocast held them during the forward only.
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
  StepWeightCasts(const CausalLM& model, at::ScalarType dtype);

  at::Tensor embedding() override;  // fp32: autocast does not cast the lookup's table
  void embedding_done() override {}
  BlockWeights block(int64_t l) override;  // the matmul weights cast (cached for the step), the norms as they are
  void block_done(int64_t, std::vector<at::Tensor>&, bool) override {}
  std::vector<at::Tensor> block_leaves(int64_t l) override;  // the model's own parameters of block l
  HeadWeights head() override;                               // fp32: the loss casts the head itself...

  // ...from this copy of the LM head in `dtype`, detached (the loss forms the head's gradient in fp32 itself).
  at::Tensor head_weight_cast();

  // Drops the step's copies: call after the step's last backward, before the optimizer changes the weights.
  void end_step();
  // How many casts were made since construction (tests: once per weight and step).
  int64_t casts_made() const { return casts_made_; }

 private:
  at::Tensor cast(const at::Tensor& weight);

  const CausalLM& model_;
  const at::ScalarType dtype_;
  std::map<const c10::TensorImpl*, at::Tensor> cache_;  // fp32 leaf -> its cast this step
  at::Tensor head_cast_;
  int64_t casts_made_ = 0;
};

}  // namespace archspace
