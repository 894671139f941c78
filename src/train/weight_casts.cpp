#include "archspace/train/weight_casts.h"

#include <ATen/core/grad_mode.h>

namespace archspace {

StepWeightCasts::StepWeightCasts(const CausalLM& model, at::ScalarType dtype) : model_(model), dtype_(dtype) {}

at::Tensor StepWeightCasts::cast(const at::Tensor& weight) {
  // Without grad (a forward that is not trained through) the copy would carry no autograd node: not cached.
  if (!at::GradMode::is_enabled()) return weight.to(dtype_);
  at::Tensor& slot = cache_[weight.unsafeGetTensorImpl()];
  if (!slot.defined()) {
    slot = weight.to(dtype_);  // differentiable: its backward adds the gradient, cast to fp32, to the leaf's
    ++casts_made_;
  }
  return slot;
}

at::Tensor StepWeightCasts::embedding() { return model_.parameter(param_tables::kEmbeddingRows[0].name); }

BlockWeights StepWeightCasts::block(int64_t l) {
  BlockWeights w = model_.layers().at(static_cast<size_t>(l));
  for (const auto& row : param_tables::kAttentionMlpRows)
    if (row.kind == ParamKind::kLinear) w.*row.member = cast(w.*row.member);
  return w;
}

std::vector<at::Tensor> StepWeightCasts::block_leaves(int64_t l) { return model_.block_parameters(l); }

HeadWeights StepWeightCasts::head() {
  HeadWeights h;
  h.final_norms = model_.final_norms();
  h.norm = model_.parameter(param_tables::kHeadRows[0].name);
  h.lm_head = model_.head_weight();
  return h;
}

at::Tensor StepWeightCasts::head_weight_cast() {
  if (!head_cast_.defined()) {
    head_cast_ = model_.head_weight().detach().to(dtype_);
    ++casts_made_;
  }
  return head_cast_;
}

void StepWeightCasts::end_step() {
  cache_.clear();
  head_cast_.reset();
}

}  // namespace archspace
