#include "archspace/config/recipe.h"

#include <cfenv>
#include <cmath>

#include "archspace/config/choices.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

// Spellings in enum order.
const std::vector<std::string> kRecipes = {"olmo-core", "megatron", "archspace"};
const std::vector<std::string> kShapes = {"cosine", "linear", "wsd", "constant"};
const std::vector<std::string> kWsdShapes = {"linear", "cosine", "exponential", "minus_sqrt"};
const std::vector<std::string> kDataOrders = {"archspace", "olmo-core", "megatron"};
const std::vector<std::string> kInitSchemes = {"olmo-core", "megatron"};

template <typename E>
E parse(const std::vector<std::string>& names, const std::string& text, const std::string& where, const char* what) {
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  throw Error((where.empty() ? "" : where + ": ") + "unknown " + what + " '" + text +
              "' (valid: " + listed_choices(names) + ")");
}

}  // namespace

RecipeDefaults recipe_defaults(Recipe recipe) {
  switch (recipe) {
    case Recipe::kOlmoCore:
      // OLMo 3's scripts: SkipStepAdamW with a group override setting weight_decay 0 on "embeddings.weight".
      return {ScheduleConvention::kOlmoCore, /*decay_norms=*/true, /*decay_embeddings=*/false, /*skip_steps=*/true};
    case Recipe::kMegatron:
      // Megatron's default param groups: no decay for biases and 1-D parameters (the norms), decay for the rest.
      return {ScheduleConvention::kMegatron, false, true, false};
    case Recipe::kArchspace:
      return {ScheduleConvention::kArchspace, false, true, false};
  }
  throw Error("recipe_defaults: unknown recipe");
}

int64_t default_wsd_decay_steps(int64_t max_steps) {
  // Python's round() of a float: to the nearest integer, ties to even (the default rounding mode's nearbyint).
  const int mode = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double decay = std::nearbyint(static_cast<double>(max_steps) * 0.1);
  std::fesetround(mode);
  return static_cast<int64_t>(decay);
}

Recipe parse_recipe(const std::string& text, const std::string& where) {
  return parse<Recipe>(kRecipes, text, where, "recipe");
}
ScheduleShape parse_schedule_shape(const std::string& text, const std::string& where) {
  return parse<ScheduleShape>(kShapes, text, where, "schedule");
}
ScheduleConvention parse_schedule_convention(const std::string& text, const std::string& where) {
  return parse<ScheduleConvention>(kRecipes, text, where, "schedule convention");
}
WsdDecayShape parse_wsd_decay_shape(const std::string& text, const std::string& where) {
  return parse<WsdDecayShape>(kWsdShapes, text, where, "WSD decay shape");
}

DataOrder parse_data_order(const std::string& text, const std::string& where) {
  return parse<DataOrder>(kDataOrders, text, where, "data order");
}

InitScheme parse_init_scheme(const std::string& text, const std::string& where) {
  return parse<InitScheme>(kInitSchemes, text, where, "init");
}
const std::vector<std::string>& init_scheme_choices() { return kInitSchemes; }

const char* recipe_name(Recipe r) { return kRecipes[static_cast<size_t>(r)].c_str(); }
const char* schedule_shape_name(ScheduleShape s) { return kShapes[static_cast<size_t>(s)].c_str(); }
const char* convention_name(ScheduleConvention c) { return kRecipes[static_cast<size_t>(c)].c_str(); }
const char* wsd_decay_shape_name(WsdDecayShape s) { return kWsdShapes[static_cast<size_t>(s)].c_str(); }
const char* data_order_name(DataOrder o) { return kDataOrders[static_cast<size_t>(o)].c_str(); }
const char* init_scheme_name(InitScheme s) { return kInitSchemes[static_cast<size_t>(s)].c_str(); }

}  // namespace archspace
