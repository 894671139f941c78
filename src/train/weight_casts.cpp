#include "archspace/train/weight_casts.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace archspace {

namespace {

// The fp32 weight seen through its bf16 copy: forward hands out the copy (no cast), backward casts the
// gradient to the weight's dtype, as at::_to_copy's backward (ToCopyBackward0) does.
struct CopyOfWeight : public torch::autograd::Function<CopyOfWeight> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& copy) {
    ctx->saved_data["dtype"] = weight.scalar_type();
    // A tensor of its own on the copy's storage: autograd records this step's history on it, not on the copy.
    return copy.alias();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].to(ctx->saved_data["dtype"].toScalarType()), at::Tensor()};
  }
};

}  // namespace

StepWeightCasts::StepWeightCasts(const CausalLM& model, at::ScalarType dtype, bool kept_across_steps)
    : model_(model), dtype_(dtype), kept_across_steps_(kept_across_steps) {}

StepWeightCasts::Copy& StepWeightCasts::current_copy(const at::Tensor& weight) {
  Copy& copy = copies_[weight.unsafeGetTensorImpl()];
  if (!copy.values.defined() || copy.version != weight._version()) {
    c10::NoGradGuard no_grad;
    if (copy.values.defined())
      copy.values.copy_(weight);
    else
      copy.values = weight.detach().to(dtype_);
    copy.version = weight._version();
    ++casts_made_;
  }
  return copy;
}

at::Tensor StepWeightCasts::cast(const at::Tensor& weight) {
  // Without grad (a forward that is not trained through) the copy would carry no autograd node: not kept.
  if (!at::GradMode::is_enabled()) return weight.to(dtype_);
  Copy& copy = current_copy(weight);
  if (!copy.handle.defined()) copy.handle = CopyOfWeight::apply(weight, copy.values);
  return copy.handle;
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

at::Tensor StepWeightCasts::head_weight_cast() { return current_copy(model_.head_weight()).values; }

void StepWeightCasts::end_step() {
  if (!kept_across_steps_) {
    copies_.clear();
    return;
  }
  for (auto& [weight, copy] : copies_) copy.handle.reset();
}

std::vector<at::Tensor> StepWeightCasts::copies_for(const std::vector<at::Tensor>& params) const {
  if (!kept_across_steps_) return {};
  std::vector<at::Tensor> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = copies_.find(params[i].unsafeGetTensorImpl());
    if (it != copies_.end()) out[i] = it->second.values;
  }
  return out;
}

void StepWeightCasts::copies_written(const std::vector<at::Tensor>& params) {
  if (!kept_across_steps_) return;
  for (const at::Tensor& p : params) {
    const auto it = copies_.find(p.unsafeGetTensorImpl());
    if (it != copies_.end()) it->second.version = p._version();
  }
}

}  // namespace archspace
