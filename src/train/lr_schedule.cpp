#include "archspace/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "archspace/config/train_config.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

constexpr double kPi = 3.14159265358979323846;  // math.pi

// olmo_core/optim/scheduler.py, _linear_warmup and _linear_decay (warmup_min_lr and decay_min_lr as given).
double olmo_core_linear_warmup(double initial_lr, int64_t current, int64_t warmup, double warmup_min_lr) {
  return warmup_min_lr +
         (initial_lr - warmup_min_lr) * static_cast<double>(std::min(current, warmup)) / static_cast<double>(warmup);
}
double olmo_core_linear_decay(double initial_lr, int64_t step_from_end, int64_t decay, double decay_min_lr) {
  return decay_min_lr +
         (initial_lr - decay_min_lr) * static_cast<double>(std::min(step_from_end, decay)) / static_cast<double>(decay);
}

// OLMo-core's get_lr(initial_lr, current, t_max) with current = the trainer's global_step (1 for the first update).
double olmo_core_lr(const LrSchedule& s, int64_t current) {
  const double initial_lr = s.lr, eta_min = s.lr * s.final_factor;
  const int64_t t_max = s.max_steps, warmup = s.warmup;
  switch (s.shape) {
    case ScheduleShape::kCosine:  // CosWithWarmup
      if (current < warmup) return olmo_core_linear_warmup(initial_lr, current, warmup, 0.0);
      if (current >= t_max) return eta_min;
      return eta_min +
             (initial_lr - eta_min) *
                 (1 + std::cos(kPi * static_cast<double>(current - warmup) / static_cast<double>(t_max - warmup))) / 2;
    case ScheduleShape::kLinear:  // LinearWithWarmup
      if (current < warmup) return olmo_core_linear_warmup(initial_lr, current, warmup, 0.0);
      if (current >= t_max) return eta_min;
      return initial_lr -
             (initial_lr - eta_min) * (static_cast<double>(current - warmup) / static_cast<double>(t_max - warmup));
    case ScheduleShape::kWsd:  // WSD(decay=decay_steps, decay_min_lr=eta_min)
      if (current <= warmup) return olmo_core_linear_warmup(initial_lr, current, warmup, 0.0);
      if (current >= t_max - s.decay_steps)
        return olmo_core_linear_decay(initial_lr, t_max - current, s.decay_steps, eta_min);
      return initial_lr;
    case ScheduleShape::kConstant:  // ConstantWithWarmup
      if (current <= warmup) return olmo_core_linear_warmup(initial_lr, current, warmup, 0.0);
      return initial_lr;
  }
  throw Error("LrSchedule: unknown shape");
}

// Megatron's OptimizerParamScheduler.get_lr with num_steps = the updates taken before this one, init_lr = 0.
double megatron_lr(const LrSchedule& s, int64_t num_steps) {
  const double init_lr = 0.0, max_lr = s.lr, min_lr = s.lr * s.final_factor;
  const int64_t warmup = s.warmup, decay_steps = s.max_steps;
  if (warmup > 0 && num_steps <= warmup)
    return init_lr + ((max_lr - init_lr) * static_cast<double>(num_steps) / static_cast<double>(warmup));
  if (s.shape == ScheduleShape::kConstant) return max_lr;
  if (num_steps > decay_steps) return min_lr;
  const double decay_ratio = static_cast<double>(num_steps - warmup) / static_cast<double>(decay_steps - warmup);
  const double delta_lr = max_lr - min_lr;
  double coeff = 1.0;
  switch (s.shape) {
    case ScheduleShape::kLinear:
      coeff = 1.0 - decay_ratio;
      break;
    case ScheduleShape::kCosine:
      coeff = 0.5 * (std::cos(kPi * decay_ratio) + 1.0);
      break;
    case ScheduleShape::kWsd: {
      const int64_t anneal_start = decay_steps - s.decay_steps;
      if (num_steps <= anneal_start) break;
      const double r = static_cast<double>(num_steps - anneal_start) / static_cast<double>(s.decay_steps);
      switch (s.wsd_decay_shape) {
        case WsdDecayShape::kLinear:
          coeff = 1.0 - r;
          break;
        case WsdDecayShape::kCosine:
          coeff = 0.5 * (std::cos(kPi * r) + 1.0);
          break;
        case WsdDecayShape::kExponential:
          coeff = (2.0 * std::pow(0.5, r)) - 1.0;
          break;
        case WsdDecayShape::kMinusSqrt:
          coeff = 1.0 - std::sqrt(r);
          break;
      }
      break;
    }
    case ScheduleShape::kConstant:
      break;
  }
  return min_lr + coeff * delta_lr;
}

}  // namespace

LrSchedule LrSchedule::of(const TrainConfig& c) {
  LrSchedule s;
  s.shape = c.schedule;
  s.convention = c.schedule_convention;
  s.lr = c.lr;
  s.final_factor = c.final_lr_factor;
  s.warmup = c.warmup_steps;
  s.max_steps = c.max_steps;
  s.decay_steps = c.decay_steps.value_or(default_wsd_decay_steps(c.max_steps));
  s.wsd_decay_shape = c.wsd_decay_shape;
  return s;
}

double LrSchedule::at(int64_t step) const {
  switch (convention) {
    case ScheduleConvention::kOlmoCore:
      return olmo_core_lr(*this, step + 1);
    case ScheduleConvention::kMegatron:
      return megatron_lr(*this, step);
    case ScheduleConvention::kArchspace:
      return scheduled_lr(step, max_steps, warmup, lr, final_factor);
  }
  throw Error("LrSchedule: unknown convention");
}

double scheduled_lr(int64_t step, int64_t max_steps, int64_t warmup, double lr, double final_factor) {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = max_steps - warmup;
  if (decay_steps <= 1) return lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(decay_steps - 1);
  return lr * (final_factor + (1 - final_factor) * 0.5 * (1 + std::cos(kPi * progress)));
}

}  // namespace archspace
