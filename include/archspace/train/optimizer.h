// AdamW with decoupled weight decay, computed exactly as torch.optim.AdamW (single-tensor path), and gradient
// clipping by global norm: what happens between backward() and the next step's forward (the learning rate of each
// step is train/lr_schedule.h's).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "archspace/io/safetensors.h"

namespace archspace {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  // One pass per parameter instead of five ops per tensor: on the CPU the engine's kernel
  // (kernels/adamw.h: the loop's arithmetic, with the clip and the bf16 copies in the same pass), on CUDA
  // at::_fused_adamw_ (torch.optim.AdamW(fused=True)); equal to the loop up to fp32 rounding (test_train.cpp).
  bool fused = false;
};

// Whether LibTorch has a fused AdamW kernel for `device` (CPU and CUDA in LibTorch 2.11).
bool fused_adamw_available(const at::Device& device);

class AdamW {
 public:
  struct Group {
    std::string name;
    at::Tensor param;
    bool decay;
  };
  AdamW(std::vector<Group> params, AdamWOptions options);

  // One update with learning rate `lr` and weight decay `weight_decay` (applied to decay params only).
  // `grad_scale` multiplies every gradient first (clip_grad_norm_'s coefficient: clip_gradient_norm below
  // computes it without scaling, and the update applies it); the gradients are left unscaled on the fused
  // CPU path and scaled in place on the others. `low_precision`: empty, or one entry per parameter, undefined
  // or a bf16 tensor of the parameter's shape that receives the updated weight (train/weight_casts.h).
  void step(double lr, double weight_decay, float grad_scale = 1.0f, const std::vector<at::Tensor>& low_precision = {});
  int64_t steps_taken() const { return step_; }
  // Whether step() runs the engine's one-pass kernel for parameters on `device` (fused, on the CPU), where a
  // grad_scale and low-precision copies cost no pass of their own.
  bool single_pass(const at::Device& device) const { return o_.fused && device.is_cpu(); }

  NamedTensors state() const;  // "exp_avg.NAME", "exp_avg_sq.NAME" (of the owned parameters)
  // Reads the moments of the owned parameters from a full state (every parameter's).
  void load_state(const NamedTensors& state, int64_t steps_taken, const std::string& source);

  // ZeRO-1: this rank keeps the moments of, and updates, only the parameters marked owned; their owners
  // update the others (the caller broadcasts them). Frees the moments of the others.
  void shard(const std::vector<bool>& owned);
  bool owns(size_t i) const { return owned_.empty() || owned_[i]; }
  const std::vector<Group>& groups() const { return params_; }
  // The moments of parameter i (exp_avg, exp_avg_sq); undefined tensors where not owned.
  std::pair<at::Tensor, at::Tensor> moments(size_t i) const { return {exp_avg_[i], exp_avg_sq_[i]}; }

 private:
  void fused_step(double lr, double weight_decay);
  void loop_step(double lr, double weight_decay);
  void kernel_step(double lr, double weight_decay, float grad_scale, const std::vector<at::Tensor>& low_precision);

  std::vector<Group> params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<bool> owned_;  // empty: all
  AdamWOptions o_;
  int64_t step_ = 0;
};

// The global L2 norm of the gradients of `params` and the coefficient clipping to max_norm multiplies them by,
// min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0), without scaling them: AdamW::step applies it.
struct GradientClip {
  double norm = 0;
  float coefficient = 1;
};
GradientClip clip_gradient_norm(const std::vector<at::Tensor>& params, double max_norm,
                                const std::vector<at::Tensor>& nonzero_rows = {});

// The global L2 norm of the gradients of `params` (before clipping), and, when max_norm > 0, the
// gradients scaled by min(1, max_norm / (norm + 1e-6)) in place: torch.nn.utils.clip_grad_norm_, with the
// norm from fp64 sums of squares rounded once to fp32 (kernels/gradient_norm.h; clip_grad_norm_ rounds an fp32
// norm per parameter, off by up to ~1e-5 relative for a 100k-row embedding). `nonzero_rows`: empty, or one
// entry per parameter, undefined or the sorted rows outside which its gradient is zero (not read or scaled).
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const std::vector<at::Tensor>& nonzero_rows = {});

}  // namespace archspace
