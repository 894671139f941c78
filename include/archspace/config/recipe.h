// Training recipes (optim.recipe): the conventions a field trainer defines, named after that trainer, so that a run
// can say "this is OLMo-core's recipe" and be right to the last bit. A recipe sets, in one place, the learning-rate
// schedule's step counting (train/lr_schedule.h), the weight-decay groups and step skipping (train/skip_step.h);
// explicit keys (optim.schedule_convention, optim.decay_norms, optim.decay_embeddings, optim.skip_steps) override it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace archspace {

// olmo-core: OLMo-core 3.0's (allenai/OLMo-core, the OLMo 3 training scripts): CosWithWarmup & co. counting steps
//   from 1, weight decay on every parameter but the embeddings, SkipStepAdamW's rule.
// megatron: Megatron-Core's (OptimizerParamScheduler counting updates from 0; no decay on 1-D parameters, i.e. the
//   norms and SiameseNorm scale vectors; no step skipping).
// archspace: the engine's rule before recipes existed (its own cosine, Megatron's decay groups, no skipping): runs
//   begun before it resume under it unchanged.
enum class Recipe { kOlmoCore, kMegatron, kArchspace };
// The schedule's shape (optim.schedule); each convention computes it as its trainer's class does.
enum class ScheduleShape { kCosine, kLinear, kWsd, kConstant };
// Whose step counting and formulas (optim.schedule_convention; by default the recipe's).
enum class ScheduleConvention { kOlmoCore, kMegatron, kArchspace };
// The shape of WSD's decay phase (optim.wsd_decay_shape): OLMo-core's WSD decays linearly; Megatron offers four.
enum class WsdDecayShape { kLinear, kCosine, kExponential, kMinusSqrt };

// The order instances are read in (train.data_order): the engine's keyed permutation of each epoch, OLMo-core's
// NumpyFSLDataLoader order (numpy's default_rng(seed + epoch) shuffle of the instance indices; data/instance_loader.h),
// or Megatron-Core's GPTDataset order (samples of S + 1 tokens across documents; data/megatron_order.h).
enum class DataOrder { kArchspace, kOlmoCore, kMegatron };
// How a model trained from scratch is initialised (model.init; model/init.h): OLMo-core's OLMo 3 init (InitMethod
// "normal": every linear layer and the embedding truncated normal, std 0.02 cut at +-3 std; norms 1), which is
// SPEC.md's; or Megatron-Core's default (normal std 0.02, the attention output and MLP down projections at
// 0.02 / sqrt(2 x layers)).
enum class InitScheme { kOlmoCore, kMegatron };

struct RecipeDefaults {
  ScheduleConvention convention;
  bool decay_norms;       // norms and SiameseNorm scale vectors (the 1-D parameters)
  bool decay_embeddings;  // the input embedding (the LM head is a linear layer: always decayed)
  bool skip_steps;        // OLMo-core's SkipStepAdamW rule
};
RecipeDefaults recipe_defaults(Recipe recipe);

// OLMo-core's default WSD decay (decay_fraction 0.1): round(max_steps x 0.1) as Python rounds (half to even).
int64_t default_wsd_decay_steps(int64_t max_steps);

// `where` names the key in errors, which list the valid spellings.
Recipe parse_recipe(const std::string& text, const std::string& where);
ScheduleShape parse_schedule_shape(const std::string& text, const std::string& where);
ScheduleConvention parse_schedule_convention(const std::string& text, const std::string& where);
WsdDecayShape parse_wsd_decay_shape(const std::string& text, const std::string& where);
DataOrder parse_data_order(const std::string& text, const std::string& where);
InitScheme parse_init_scheme(const std::string& text, const std::string& where);
const std::vector<std::string>& init_scheme_choices();  // olmo-core, megatron

const char* recipe_name(Recipe r);                  // "olmo-core", "megatron", "archspace"
const char* schedule_shape_name(ScheduleShape s);   // "cosine", "linear", "wsd", "constant"
const char* convention_name(ScheduleConvention c);  // as recipe_name
const char* wsd_decay_shape_name(WsdDecayShape s);  // "linear", "cosine", "exponential", "minus_sqrt"
const char* data_order_name(DataOrder o);           // "archspace", "olmo-core", "megatron"
const char* init_scheme_name(InitScheme s);         // "olmo-core", "megatron"

}  // namespace archspace
