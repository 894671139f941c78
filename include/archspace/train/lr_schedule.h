// The learning rate of each update, as the trainer a run's recipe names computes it (config/recipe.h):
//   olmo-core  OLMo-core 3.0's schedulers (olmo_core/optim/scheduler.py): CosWithWarmup, LinearWithWarmup, WSD and
//              ConstantWithWarmup, called with the trainer's global_step, which counts the step being taken from 1;
//              eta_min = lr x final_lr_factor (alpha_f; WSD's decay_min_lr), warmup_min_lr = 0.
//   megatron   Megatron-Core's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py), whose
//              num_steps counts the updates already taken (from 0: with a warm-up the first update has init_lr = 0),
//              lr_decay_steps = train.max_steps, min_lr = lr x final_lr_factor; WSD's decay in four shapes.
//   archspace  the engine's rule before recipes: warm-up (step + 1) / warmup x lr, then a cosine that reaches
//              final_lr_factor x lr on the last step (cosine only).
// Each formula keeps its trainer's order of operations, so the values agree to the last bit where the libm does.
#pragma once

#include <cstdint>

#include "archspace/config/recipe.h"

namespace archspace {

struct TrainConfig;

struct LrSchedule {
  ScheduleShape shape = ScheduleShape::kCosine;
  ScheduleConvention convention = ScheduleConvention::kOlmoCore;
  double lr = 1e-3;
  double final_factor = 0.1;
  int64_t warmup = 0;
  int64_t max_steps = 1;
  int64_t decay_steps = 0;  // WSD: the steps of the decay phase
  WsdDecayShape wsd_decay_shape = WsdDecayShape::kLinear;

  // The run's schedule ([optim] and train.max_steps; WSD's decay_steps resolved).
  static LrSchedule of(const TrainConfig& config);
  // The learning rate of update `step` (0-based: the run's first update is step 0).
  double at(int64_t step) const;
};

// The archspace convention's cosine (kept for the runs that follow it).
double scheduled_lr(int64_t step, int64_t max_steps, int64_t warmup, double lr, double final_factor);

}  // namespace archspace
