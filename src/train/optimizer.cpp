#include "archspace/train/optimizer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>

#include "archspace/kernels/adamw.h"
#include "archspace/kernels/gradient_norm.h"
#include "archspace/util/error.h"

namespace archspace {

AdamW::AdamW(std::vector<Group> params, AdamWOptions options) : params_(std::move(params)), o_(options) {
  for (const auto& g : params_) {
    exp_avg_.push_back(at::zeros_like(g.param, at::MemoryFormat::Contiguous));
    exp_avg_sq_.push_back(at::zeros_like(g.param, at::MemoryFormat::Contiguous));
  }
}

bool fused_adamw_available(const at::Device& device) {
  if (!device.is_cpu() && !device.is_cuda()) return false;
  const auto op = c10::Dispatcher::singleton().findSchema({"aten::_fused_adamw_", ""});
  return op.has_value() &&
         op->hasKernelForDispatchKey(device.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
}

void AdamW::fused_step(double lr, double weight_decay) {
  // torch.optim.AdamW(fused=True): the kernel reads the step count (already incremented) from an fp32
  // tensor per parameter on its device; it applies decay as p *= 1 - lr * weight_decay, as below.
  std::map<std::string, at::Tensor> step_tensors;  // by device
  for (bool decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, steps;
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& param = params_[i].param;
      if (params_[i].decay != decay || !param.grad().defined() || !owns(i)) continue;
      auto [it, fresh] = step_tensors.try_emplace(param.device().str());
      if (fresh)
        it->second = at::full({}, static_cast<double>(step_), at::TensorOptions(at::kFloat).device(param.device()));
      p.push_back(param);
      g.push_back(param.grad());
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
      steps.push_back(it->second);
    }
    if (p.empty()) continue;
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, o_.beta1, o_.beta2, decay ? weight_decay : 0.0,
                      o_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::kernel_step(double lr, double weight_decay, float grad_scale,
                        const std::vector<at::Tensor>& low_precision) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& param = params_[i].param;
    if (!param.grad().defined() || !owns(i)) continue;
    const AdamWScalars s =
        adamw_scalars(lr, params_[i].decay ? weight_decay : 0.0, o_.beta1, o_.beta2, o_.eps, step_, grad_scale);
    adamw_update(param, param.grad(), exp_avg_[i], exp_avg_sq_[i],
                 low_precision.empty() ? at::Tensor() : low_precision[i], s);
    param.unsafeGetTensorImpl()->bump_version();  // written through its data pointer: changed as an in-place op
  }
}

void AdamW::step(double lr, double weight_decay, float grad_scale, const std::vector<at::Tensor>& low_precision) {
  c10::NoGradGuard no_grad;
  if (!low_precision.empty() && low_precision.size() != params_.size())
    throw Error("AdamW::step: " + std::to_string(low_precision.size()) + " low-precision copies for " +
                std::to_string(params_.size()) + " parameters");
  ++step_;
  bool kernel = o_.fused;
  for (size_t i = 0; i < params_.size() && kernel; ++i)
    if (params_[i].param.grad().defined() && owns(i))
      kernel = adamw_kernel_applies(params_[i].param, params_[i].param.grad(),
                                    low_precision.empty() ? at::Tensor() : low_precision[i]);
  if (kernel) return kernel_step(lr, weight_decay, grad_scale, low_precision);
  // ATen's ops: the gradients scaled before, the copies written after.
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].param.grad().defined() && owns(i)) scale_gradient(params_[i].param.mutable_grad(), grad_scale);
  if (o_.fused)
    fused_step(lr, weight_decay);
  else
    loop_step(lr, weight_decay);
  for (size_t i = 0; i < low_precision.size(); ++i)
    if (low_precision[i].defined() && params_[i].param.grad().defined() && owns(i))
      low_precision[i].copy_(params_[i].param);
}

void AdamW::loop_step(double lr, double weight_decay) {
  const double bias_correction1 = 1 - std::pow(o_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(o_.beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].param;
    const at::Tensor& grad = p.grad();
    if (!grad.defined() || !owns(i)) continue;
    if (params_[i].decay && weight_decay != 0) p.mul_(1 - lr * weight_decay);
    exp_avg_[i].lerp_(grad, 1 - o_.beta1);
    exp_avg_sq_[i].mul_(o_.beta2).addcmul_(grad, grad, 1 - o_.beta2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(o_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owns(i)) continue;
    out.emplace_back("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const NamedTensors& state, int64_t steps_taken, const std::string& source) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [prefix, dst] : {std::pair{"exp_avg.", &exp_avg_[i]}, std::pair{"exp_avg_sq.", &exp_avg_sq_[i]}}) {
      auto it = by_name.find(prefix + params_[i].name);
      if (it == by_name.end()) throw Error(source + ": optimizer state lacks '" + prefix + params_[i].name + "'");
      if (!owns(i)) continue;
      if (it->second.sizes() != dst->sizes())
        throw Error(source + ": optimizer state '" + prefix + params_[i].name + "' has the wrong shape");
      dst->copy_(it->second);
    }
  }
  if (by_name.size() != 2 * params_.size())
    throw Error(source + ": optimizer state has tensors for parameters the model lacks");
  step_ = steps_taken;
}

void AdamW::shard(const std::vector<bool>& owned) {
  owned_ = owned;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owns(i)) exp_avg_[i] = exp_avg_sq_[i] = at::Tensor();
  }
}

GradientClip clip_gradient_norm(const std::vector<at::Tensor>& params, double max_norm,
                                const std::vector<at::Tensor>& nonzero_rows) {
  c10::NoGradGuard no_grad;
  if (!nonzero_rows.empty() && nonzero_rows.size() != params.size())
    throw Error("clip_grad_norm: nonzero_rows must have one entry per parameter");
  at::Tensor squares;  // fp64, in parameter order
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    const at::Tensor s = sum_of_squares(params[i].grad(), nonzero_rows.empty() ? at::Tensor() : nonzero_rows[i]);
    squares = squares.defined() ? squares + s : s;
  }
  GradientClip clip;
  if (!squares.defined()) return clip;
  const float total = squares.sqrt().item<float>();  // rounded once to the fp32 value clip_grad_norm_ reports
  clip.norm = total;
  if (max_norm > 0) clip.coefficient = clip_coefficient(total, max_norm);
  return clip;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const std::vector<at::Tensor>& nonzero_rows) {
  const GradientClip clip = clip_gradient_norm(params, max_norm, nonzero_rows);
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size() && clip.coefficient != 1; ++i)
    if (params[i].grad().defined())
      scale_gradient(params[i].mutable_grad(), clip.coefficient, nonzero_rows.empty() ? at::Tensor() : nonzero_rows[i]);
  return clip.norm;
}

}  // namespace archspace
